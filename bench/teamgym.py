"""TeamGym, scripted part: do the communication and retrieval gaps measure anything?

Team decision tasks (envs/team.py) over several generated worlds, each played under the three
conditions (one participant holding every pivotal fact; the facts dealt across k; raw rows with
distractors to read them from) by scripted self-play policies (envs/teamplay.py): share
everything, share nothing, share at random, and a diagnostic that shares everything but whose
decider ignores the channel (the failure-to-use rate is 0 by construction for the others: their
decider takes the exact posterior's best candidate). Per policy: success per condition, the
communication gap (single minus split, points), the retrieval gap (split minus retrieval),
disclosure, use and failure-to-use rates, and CoSIR's per-message surprisal drops.

`--model FOLDER`: a chat model (a local policy folder) as every participant, through
rollout/team.py's ChatPolicy, on the first `--model-tasks` tasks, beside share_all on the same
tasks: the same figures for a real policy, untrained for teams.

`--train` (with `--model`): the trained comparison. The model is SFT'd on share_all's episodes of
train tasks (`--warm-steps`: a partial team policy, rollout/team.py demo_sequences), then two arms
from that same warm start run `--rounds` RL rounds of loop.team_round on the same fresh train
tasks at equal rollouts: credit on the team outcome alone (credit.method grpo) and outcome plus
CoSIR's surprisal reward (credit.method cosir). Greedy success per condition on held-out worlds'
tasks before and after; `cosir_minus_outcome_pts` is the arms' difference over split and
retrieval (the conditions where telling matters), with its paired standard error.

    python bench/teamgym.py [--worlds 4] [--tasks 50] [--out bench/results/teamgym.json]
    python bench/teamgym.py --model FOLDER [--model-tasks 16] [--temperature 0.7] [--threads 1]
    python bench/teamgym.py --model FOLDER --train [--warm-steps 20] [--rounds 4] \
        [--train-tasks 8] [--eval-tasks 12] [--demo-tasks 40] [--cosir-weight 1.0] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from bench.provenance import STARTED_AT  # noqa: E402
from rollwise.credit.cosir import surprisal_drops  # noqa: E402
from rollwise.envs.team import CONDITIONS, make_tasks, setup  # noqa: E402
from rollwise.envs.teamplay import Scripted, gap, play, round_metrics  # noqa: E402

DOMAINS = ("shop", "clinic", "library", "travel", "garage", "school")
POLICIES = {
    "share_all": Scripted("all"),
    "share_nothing": Scripted("none"),
    "share_random": Scripted("random", p=0.5),
    "share_all_ignore_channel": Scripted("all", ignore_channel=True),  # diagnostic
}


def paired_se(a: list[bool], b: list[bool]) -> float | None:
    """Standard error (points) of the mean of per-task differences a - b (None under two)."""
    d = [float(x) - float(y) for x, y in zip(a, b, strict=True)]
    if len(d) < 2:
        return None
    mean = sum(d) / len(d)
    return 100 * math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))


def play_all(tasks, policy, args) -> dict[str, list]:
    """Each condition's episode of every task. A chat policy plays them all at once, a batch of
    generations a turn (play_chats: the episodes `play` would give one at a time)."""
    from rollwise.rollout.team import ChatPolicy, play_chats

    dealt = [(t, setup(t, c, args.k, seed=0, distractors=args.distractors), 0)
             for c in CONDITIONS for t in tasks]  # fmt: skip
    if isinstance(policy, ChatPolicy):
        eps = [p.episode for p in play_chats(dealt, policy, args.budget)]
    else:
        eps = [play(t, d, policy, args.budget, seed=seed) for t, d, seed in dealt]
    return {c: eps[i * len(tasks) : (i + 1) * len(tasks)] for i, c in enumerate(CONDITIONS)}


def run_policy(tasks, policy, args) -> dict:
    eps = play_all(tasks, policy, args)
    out = round_metrics([e for c in CONDITIONS for e in eps[c]])
    ok = {c: [e.success for e in eps[c]] for c in CONDITIONS}
    out["communication_gap_se_pts"] = paired_se(ok["single"], ok["split"])
    out["retrieval_gap_se_pts"] = paired_se(ok["split"], ok["retrieval"])
    drops = [d for c in ("split", "retrieval") for e in eps[c]
             for d in surprisal_drops(e.task, [m.disclosed for m in e.messages])]  # fmt: skip
    out["messages_per_episode"] = {c: sum(len(e.messages) for e in eps[c]) / len(tasks)
                                   for c in CONDITIONS}  # fmt: skip
    out["cosir_bits_per_message"] = sum(drops) / len(drops) if drops else None
    out["cosir_zero_credit_message_share"] = (
        sum(d == 0 for d in drops) / len(drops) if drops else None
    )
    return out


def model_arm(tasks: list, args) -> dict:
    """The chat model in `args.model` as every participant, and share_all on the same tasks."""
    import torch

    from rollwise.policy.build import load_policy
    from rollwise.policy.hf import HFBackend
    from rollwise.rollout.team import ChatPolicy

    torch.set_num_threads(args.threads)
    model, tok = load_policy(args.model)
    chat = ChatPolicy(HFBackend(model, tok), tok, args.max_new_tokens, args.temperature)
    t0 = time.perf_counter()
    out = run_policy(tasks, chat, args)
    turns = chat.turns
    return {"folder": str(args.model), "tasks": len(tasks), **out,
            "generations": len(turns), "passes": sum(t.text.upper().startswith("PASS")
                                                      for t in turns if t.act == "speak"),
            "undecided": sum(t.act == "decide" and not any(ch.isdigit() for ch in t.text)
                             for t in turns),
            "examples": [{"participant": t.participant, "act": t.act, "text": t.text}
                         for t in turns[:6]],
            "share_all_same_tasks": run_policy(tasks, POLICIES["share_all"], args),
            "wall_s": round(time.perf_counter() - t0, 1)}  # fmt: skip


# The learning bench's SmolLM2 knobs (bench/learning.py RECIPES): a short SFT, then small
# on-policy rounds inside a trust region.
TEAM_RECIPE = {
    "warmstart.batch_size": 8, "warmstart.lr": 2e-4, "warmstart.optimizer": "adamw",
    "warmstart.weight_decay": 0.0, "warmstart.balance_kinds": False,
    "rollout.samples_per_task": 4, "rollout.temperature": 0.7,
    "train.lr": 1e-5, "train.max_kl": 8e-3, "train.epochs": 1, "train.minibatches": 2,
    "train.micro_batch": 8, "train.warmup_steps": 0,
}  # fmt: skip
TRAINED_CONDITIONS = ("split", "retrieval")


def greedy_success(model, tok, tasks: list, args) -> tuple[dict, dict]:
    """round_metrics of greedy play on `tasks` under every condition, and each
    (task, condition)'s success for paired differences."""
    from rollwise.policy.hf import HFBackend
    from rollwise.rollout.team import ChatPolicy

    chat = ChatPolicy(HFBackend(model, tok), tok, args.max_new_tokens, greedy=True)
    eps = [e for played in play_all(tasks, chat, args).values() for e in played]
    return round_metrics(eps), {f"{e.task.task_id}/{e.setup.condition}": e.success for e in eps}


def trained_arms(train_tasks: list, eval_tasks: list, args) -> dict:
    """The SFT warm start on share_all's episodes, then outcome-only vs CoSIR rounds from it."""
    import copy
    import random

    import torch

    from bench.common import arm_params, bench_params
    from rollwise import loop
    from rollwise.config import parse_overrides
    from rollwise.policy.build import load_policy
    from rollwise.rollout.team import TeamSettings, demo_sequences
    from rollwise.train.sft import sft

    torch.set_num_threads(args.threads)
    p = bench_params({**TEAM_RECIPE, "warmstart.steps": args.warm_steps, "train.seed": args.seed,
                      "warmstart.seed": args.seed, **parse_overrides(args.overrides)})  # fmt: skip
    model, tok = load_policy(args.model)
    teacher, t0 = POLICIES["share_all"], time.perf_counter()
    demo_tasks = random.Random(f"teamgym/demos/{args.seed}").sample(
        train_tasks, min(args.demo_tasks, len(train_tasks)))  # fmt: skip
    demos = [seq for t in demo_tasks for c in CONDITIONS
             for seq in demo_sequences(tok, t, setup(t, c, args.k, seed=0,
                                                     distractors=args.distractors),
                                       teacher, args.budget, seed=0)]  # fmt: skip
    losses = sft(model, demos, p.warmstart, tok.pad_token_id)
    warm = copy.deepcopy(model.state_dict())
    start, start_ok = greedy_success(model, tok, eval_tasks, args)
    out = {"warm_start": {"demos": len(demos), "steps": len(losses),
                          "loss_first_last": [losses[0], losses[-1]] if losses else None,
                          "wall_s": round(time.perf_counter() - t0, 1), **start}}  # fmt: skip
    print(json.dumps({"warm_start": out["warm_start"]}), flush=True)  # a killed run keeps it
    settings = TeamSettings(args.k, args.budget, args.distractors)
    rng = random.Random(f"teamgym/train/{args.seed}")
    plan = [rng.sample(train_tasks, args.train_tasks) for _ in range(args.rounds)]
    finals = {}
    for arm, method in (("outcome", "grpo"), ("cosir", "cosir")):
        pa = arm_params(p, {"credit.method": method, "credit.cosir.weight": args.cosir_weight,
                            **parse_overrides(args.overrides)})  # fmt: skip
        model.load_state_dict(warm)
        trainer, rounds, t1 = None, [], time.perf_counter()
        for r, tasks in enumerate(plan, start=1):
            done = loop.team_round(pa, model, tok, trainer, tasks, r, TRAINED_CONDITIONS,
                                   settings, args.max_new_tokens)  # fmt: skip
            trainer = done.trained.trainer
            rounds.append({"round": r, **done.metrics})
            print(arm, r, {k: done.metrics[k] for k in ("success_pct", "surprisal_bits")},
                  flush=True)  # fmt: skip
        after, finals[arm] = greedy_success(model, tok, eval_tasks, args)
        out[arm] = {"rounds": rounds, "after": after, "wall_s": round(time.perf_counter() - t1, 1),
                    "gain_pts": {c: gap(after["success_pct"][c], start["success_pct"][c])
                                 for c in CONDITIONS}}  # fmt: skip
        print(json.dumps({arm: {k: v for k, v in out[arm].items() if k != "rounds"}}), flush=True)
    keys = [k for k in start_ok if k.rsplit("/", 1)[1] in TRAINED_CONDITIONS]
    out["cosir_minus_outcome_pts"] = 100 * sum(finals["cosir"][k] - finals["outcome"][k]
                                               for k in keys) / len(keys)  # fmt: skip
    out["cosir_minus_outcome_se_pts"] = paired_se([finals["cosir"][k] for k in keys],
                                                  [finals["outcome"][k] for k in keys])  # fmt: skip
    out["episodes_per_arm"] = args.rounds * args.train_tasks * len(TRAINED_CONDITIONS) * (
        p.rollout.samples_per_task)  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, default=4, help="worlds (seeds) per domain")
    ap.add_argument("--tasks", type=int, default=50, help="tasks per world")
    ap.add_argument("--candidates", type=int, default=5)
    ap.add_argument("--conditions", type=int, default=2, help="conjuncts in the decision rule")
    ap.add_argument("--k", type=int, default=3, help="participants (split and retrieval)")
    ap.add_argument("--budget", type=int, default=8, help="messages per episode")
    ap.add_argument("--distractors", type=int, default=3, help="distractor entities per hand")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/teamgym.json")
    ap.add_argument("--model", type=Path, help="a policy folder to play as every participant")
    ap.add_argument("--model-tasks", type=int, default=16, help="tasks the model plays")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--train", action="store_true", help="the trained comparison (needs --model)")
    ap.add_argument("--warm-steps", type=int, default=20, help="SFT steps on share_all demos")
    ap.add_argument("--demo-tasks", type=int, default=40, help="train tasks share_all demos")
    ap.add_argument("--rounds", type=int, default=4, help="RL rounds per arm")
    ap.add_argument("--train-tasks", type=int, default=8, help="train tasks a round")
    ap.add_argument("--eval-tasks", type=int, default=12, help="held-out tasks (new worlds)")
    ap.add_argument("--cosir-weight", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("overrides", nargs="*", help="params overrides key=value for both arms")
    args = ap.parse_args()
    if args.train and not args.model:
        ap.error("--train needs --model FOLDER (the policy to train)")
    if not args.model:
        args.model_tasks = 0
    t0 = time.perf_counter()
    tasks = [t for d in DOMAINS for w in range(args.worlds)
             for t in make_tasks(d, w, args.tasks, args.candidates, args.conditions)]  # fmt: skip
    held_out = [make_tasks(DOMAINS[i % len(DOMAINS)], 1000 + i, 1, args.candidates,
                           args.conditions)[0] for i in range(args.eval_tasks)]  # fmt: skip
    pivotal = [len(t.pivotal) for t in tasks]
    result = {
        "command": "python bench/teamgym.py " + " ".join(sys.argv[1:]),
        "git_commit": STARTED_AT,
        "settings": {
            **{
                k: (str(v) if isinstance(v, Path) else v)
                for k, v in vars(args).items()
                if k != "out"
            },
            "domains": list(DOMAINS),
        },  # fmt: skip
        "tasks": len(tasks),
        "pivotal_facts_mean": sum(pivotal) / len(pivotal),
        "pivotal_verified_by_ablation": len(tasks),  # make_tasks raises on any failure
        "policies": {name: run_policy(tasks, p, args) for name, p in POLICIES.items()},
        "model": model_arm(tasks[: args.model_tasks], args) if args.model_tasks else None,
        "trained": trained_arms(tasks, held_out, args) if args.train else None,
        "cosir_minus_outcome_pts": None,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    if result["trained"]:
        result["cosir_minus_outcome_pts"] = result["trained"]["cosir_minus_outcome_pts"]
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, m in result["policies"].items():
        print(name, {k: m[k] for k in ("success_pct", "communication_gap_pts", "retrieval_gap_pts",
                                       "disclosure_rate", "failure_to_use_rate")})  # fmt: skip


if __name__ == "__main__":
    main()
