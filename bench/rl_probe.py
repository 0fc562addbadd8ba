"""RL probe: one process, no orchestration: build the suite, SFT the warm start once (cached),
then run `rounds` RL rounds with the library's own scheduler, engine, GRPO and PPO trainer,
evaluating held-out success every `--eval-every` rounds. For tuning the RL loop quickly; the
pipeline (`make run`) is the reference.

    .venv/bin/python bench/rl_probe.py train.lr=0.0001 rollout.temperature=0.7 rounds=8 \
        [--reward rubric|success|progress] [--negative-scale 1.0] [--out FILE.json]

--reward progress: 0.5 x success + 0.5 x the share of the task's oracle calls the episode made
(same tool, same arguments): partial credit for each correct dependent call, to see whether a
denser reward gives RL a signal on the multi-call tasks it never solves.

--oracle N: the control arm. No rollout: N oracle trajectories of the round's train tasks go
through the same trainer with advantage +1, so held-out after R rounds is what the trainer's
lr and step budget can do with a perfect signal, an upper reference for any advantage.
"""

from __future__ import annotations

import argparse
import atexit
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import reference_policy, suite_at, warm_start_folder  # noqa: E402
from bench.provenance import STARTED_AT  # noqa: E402
from rollwise.config import apply_overrides, read_raw, validate  # noqa: E402
from rollwise.credit import ESTIMATORS  # noqa: E402
from rollwise.envs.generate import generate_suite  # noqa: E402
from rollwise.envs.runtime import load_suite  # noqa: E402
from rollwise.evaluate.full import evaluate_policy, evaluation_tasks, summarize  # noqa: E402
from rollwise.policy.build import load_policy, save_policy  # noqa: E402
from rollwise.policy.hf import HFBackend  # noqa: E402
from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes  # noqa: E402
from rollwise.schedule import SCHEDULERS  # noqa: E402
from rollwise.schedule.plan import Budget  # noqa: E402
from rollwise.train.sft import oracle_sequence  # noqa: E402
from rollwise.train.trainer import (  # noqa: E402
    make_optimizer,
    policy_logprobs,
    train_round,
    training_batch,
)


def warm_start(p, cache: Path, given: Path | None = None):
    """(suite, model, tokenizer): the pipeline's warm start of `p` (bench/common.py, cached), or
    the `given` model folder (--warm-start: another warm start of the same suite)."""
    suite, _ = suite_at(cache, p.envs)
    return suite, *load_policy(warm_start_folder(p, suite, cache, given))


def heldout(model, tok, suite, p, split: str = "heldout") -> dict:
    """Greedy success on the split, and per task kind: which skill a round moved."""
    tasks = evaluation_tasks(suite, split, p.evaluate.max_tasks)
    limits = Limits(max_context=p.policy.max_context, greedy=True)
    episodes = evaluate_policy(HFBackend(model, tok), tok, suite, tasks, limits)
    return {**summarize(episodes), "by_kind": by_kind(episodes, suite)}


def by_kind(episodes: pd.DataFrame, suite) -> dict[str, float]:
    """Success rate per task kind (the catalog's `kind` of each episode's task)."""
    kinds = episodes["task_id"].map(suite.catalog.set_index("task_id")["kind"])
    return episodes.groupby(kinds)["success"].mean().round(3).to_dict()


def oracle_progress(episodes: pd.DataFrame, steps: pd.DataFrame, suite) -> pd.Series:
    """Per episode: the share of its task's oracle calls it made (tool and arguments equal)."""

    def key(tool: str, arguments) -> tuple[str, str]:
        return tool, json.dumps(arguments, sort_keys=True)

    made: dict[str, set] = {}
    for row in steps.itertuples():
        try:
            made.setdefault(row.episode_id, set()).add(key(row.tool, json.loads(row.arguments)))
        except (TypeError, ValueError):  # a malformed call made no progress
            continue
    shares = []
    for ep in episodes.itertuples():
        want = {key(c.name, c.arguments) for c in suite.tasks[ep.task_id].oracle}
        shares.append(len(want & made.get(ep.episode_id, set())) / max(len(want), 1))
    return pd.Series(shares, index=episodes.index)


def fresh_suite(p, r: int, scratch: Path):
    """--fresh-suites: round r's tasks from a suite generated with another seed (new databases,
    names and ids; every task a train task), so no answer can be memorized across rounds."""
    cfg = p.envs.model_copy(
        update={"seed": p.envs.seed + 104729 * r, "heldout_envs": 0, "heldout_task_frac": 0.0}
    )
    generate_suite(cfg, scratch / f"round_{r}")
    return load_suite(scratch / f"round_{r}")


def oracle_items(suite, n: int, r: int, model, tok, p) -> list[dict]:
    """--oracle N: N of the suite's train tasks' oracle trajectories, advantage +1 on the policy
    tokens, the model's own log-probs as PPO's old policy: the trainer's update budget given a
    perfect signal, which bounds what any advantage could do with the same lr and steps."""
    train = suite.split("train")
    if n > len(train):
        raise SystemExit(f"--oracle {n}: the round's suite has only {len(train)} train tasks")
    items = []
    for t in random.Random(r).sample(train, n):
        ids, mask = oracle_sequence(t, suite.envs[t.env_id], tok)
        items.append({"ids": ids, "mask": mask, "adv": [float(m) for m in mask],
                      "logprobs": [0.0] * len(ids)})  # fmt: skip
    old = policy_logprobs(model, items, p.train, tok.pad_token_id, p.rollout.temperature)
    return [{**it, "logprobs": list(lp)} for it, lp in zip(items, old, strict=True)]


def rollout_items(r: int, model, tok, suite, p, args) -> tuple[list[dict], dict]:
    """One round's sampled episodes, scored and credited: (training items, round figures)."""
    cfg = p.rollout
    # No history and one batch: static schedulers only (bench/envsched.py runs them all properly).
    plan_seed = (0 if args.fixed_tasks else r) + 1000 * args.seed  # --fixed-tasks: same tasks
    budget = Budget(p.schedule.tasks_per_round, cfg.samples_per_task, r, plan_seed)
    plan = SCHEDULERS[p.schedule.method](
        suite.catalog, None, budget, getattr(p.schedule, p.schedule.method, None)
    )
    plan = plan[plan["batch"] == 0]
    specs = [
        EpisodeSpec(f"r{r}/{tid}/s{k}", suite.tasks[tid],
                    clone_env(suite.envs[suite.tasks[tid].env_id]), group=tid, sample=k,
                    seed=k + 1000 * args.seed)
        for tid in plan["task_id"] for k in range(cfg.samples_per_task)
    ]  # fmt: skip
    limits = Limits(max_context=p.policy.max_context, temperature=cfg.temperature,
                    seed=r + 1000 * args.seed)  # fmt: skip
    t0 = time.perf_counter()
    episodes, steps = run_episodes(specs, HFBackend(model, tok), tok, limits)
    episodes = pd.DataFrame(episodes)
    success = episodes["success"].astype(float)
    rewards = {
        "rubric": episodes["reward"],
        "success": success,
        "progress": 0.5 * success + 0.5 * oracle_progress(episodes, pd.DataFrame(steps), suite),
    }
    scored = episodes.assign(reward=rewards[args.reward or p.credit.reward])
    adv = ESTIMATORS[p.credit.method](scored, pd.DataFrame(steps), p.credit)
    negative = adv["advantage"] < 0
    adv.loc[negative, "advantage"] *= args.negative_scale
    zero_var = (episodes.groupby("group")["reward"].std(ddof=0) < 1e-9).mean()
    return training_batch(episodes, adv), {
        "rollout_s": time.perf_counter() - t0,
        "sample_success": float(episodes["success"].mean()),
        "sample_success_by_kind": by_kind(episodes, suite),
        "reward": float(episodes["reward"].mean()), "zero_variance_groups": float(zero_var),
        "trained_reward": float(scored["reward"].mean()),
    }  # fmt: skip


TRAIN_STATS = ("approx_kl", "kl_ref", "clip_frac", "entropy")  # per round, from train_round


def rl_round(r: int, model, tok, suite, p, opt, args) -> dict:
    if args.fresh_suites:
        suite = fresh_suite(p, r, args.scratch)
    if args.oracle:
        items, line = oracle_items(suite, args.oracle, r, model, tok, p), {"oracle": args.oracle}
    else:
        items, line = rollout_items(r, model, tok, suite, p, args)
    t0 = time.perf_counter()
    temperature, done = p.rollout.temperature, args.steps_done  # warmup_steps spans rounds
    stats = train_round(model, items, p.train, opt, tok.pad_token_id, args.ref,
                        temperature=temperature, steps_before=done)  # fmt: skip
    args.steps_done += int(stats.get("optimizer_steps", 0) + stats.get("nonfinite_steps", 0))
    return {"round": r, **line, "train_s": time.perf_counter() - t0,
            **{k: stats.get(k, 0.0) for k in TRAIN_STATS}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*", help="dotted params overrides key=value")
    parser.add_argument("--reward", choices=["rubric", "success", "progress"], default=None,
                        help="default: params' credit.reward")  # fmt: skip
    parser.add_argument("--negative-scale", type=float, default=1.0)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="offsets plan and sampling seeds")
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise" / "probe")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--train-eval", action="store_true", help="greedy success on train too")
    parser.add_argument("--fresh-suites", action="store_true", help="RL on a new suite per round")
    parser.add_argument("--fixed-tasks", action="store_true", help="same tasks every round")
    parser.add_argument("--oracle", type=int, default=0, help="N oracle demos a round, no rollout")
    parser.add_argument("--save", type=Path, default=None, help="save the final policy here")
    parser.add_argument("--warm-start", "--warm", dest="warm", type=Path, default=None,
                        help="start from this model folder")  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (1: two probes side by side)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    overrides = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in args.overrides)}
    p = validate(apply_overrides(read_raw(ROOT / "params.yaml"), overrides))
    args.cache.mkdir(parents=True, exist_ok=True)
    args.scratch = Path(tempfile.mkdtemp(prefix="rl-probe-"))
    args.steps_done = 0
    atexit.register(shutil.rmtree, args.scratch, ignore_errors=True)
    suite, model, tok = warm_start(p, args.cache, args.warm)
    args.ref = reference_policy(model, p.train)

    def evaluate(r: int) -> None:
        curve.append({"round": r, **heldout(model, tok, suite, p)})
        line = {
            "round": r,
            "heldout_success": curve[-1]["success"],
            "by_kind": curve[-1]["by_kind"],
        }
        if args.train_eval:
            curve[-1]["train_success"] = line["train_success"] = heldout(
                model, tok, suite, p, "train"
            )["success"]
        print(json.dumps(line), flush=True)

    curve: list[dict] = []
    evaluate(0)
    opt, rounds = make_optimizer(model, p.train), []
    for r in range(1, p.n_rounds + 1):
        rounds.append(rl_round(r, model, tok, suite, p, opt, args))
        print(json.dumps(rounds[-1]), flush=True)
        if r % args.eval_every == 0 or r == p.n_rounds:
            evaluate(r)
    if args.save:
        save_policy(model, tok, args.save)
    if args.out:
        args.out.write_text(json.dumps({
            "command": "python bench/rl_probe.py " + " ".join(sys.argv[1:]),
            "git_commit": STARTED_AT,
            "heldout_gain_pts": 100 * (curve[-1]["success"] - curve[0]["success"]),
            "heldout_curve": curve, "rounds": rounds,
        }, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
