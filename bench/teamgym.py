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

`cosir_minus_outcome_pts` (CoSIR's credit against outcome-only credit, trained) needs team
episodes trained through the round; not built yet, so it is null.

    python bench/teamgym.py [--worlds 4] [--tasks 50] [--out bench/results/teamgym.json]
    python bench/teamgym.py --model FOLDER [--model-tasks 16] [--temperature 0.7] [--threads 1]
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
from rollwise.envs.teamplay import Scripted, play, round_metrics  # noqa: E402

DOMAINS = ("shop", "clinic", "library", "travel", "garage", "school")
POLICIES = {
    "share_all": Scripted("all"),
    "share_nothing": Scripted("none"),
    "share_random": Scripted("random", p=0.5),
    "share_all_ignore_channel": Scripted("all", ignore_channel=True),  # diagnostic
}


def paired_se(a: list[bool], b: list[bool]) -> float:
    """Standard error (points) of the mean of per-task differences a - b."""
    d = [float(x) - float(y) for x, y in zip(a, b, strict=True)]
    mean = sum(d) / len(d)
    return 100 * math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))


def run_policy(tasks, policy, args) -> dict:
    eps = {c: [play(t, setup(t, c, args.k, seed=0, distractors=args.distractors), policy,
                    args.budget, seed=0) for t in tasks] for c in CONDITIONS}  # fmt: skip
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
    args = ap.parse_args()
    t0 = time.perf_counter()
    tasks = [t for d in DOMAINS for w in range(args.worlds)
             for t in make_tasks(d, w, args.tasks, args.candidates, args.conditions)]  # fmt: skip
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
        "model": model_arm(tasks[: args.model_tasks], args) if args.model else None,
        "cosir_minus_outcome_pts": None,
        "cosir_minus_outcome_note": (
            "needs team episodes trained through the round (rollout/team.py plays a chat model "
            "but no round trains on its turns yet); not measured"
        ),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, m in result["policies"].items():
        print(name, {k: m[k] for k in ("success_pct", "communication_gap_pts", "retrieval_gap_pts",
                                       "disclosure_rate", "failure_to_use_rate")})  # fmt: skip


if __name__ == "__main__":
    main()
