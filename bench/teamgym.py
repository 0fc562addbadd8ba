"""TeamGym, scripted part: do the communication and retrieval gaps measure anything?

Team decision tasks (envs/team.py) over several generated worlds, each played under the three
conditions (one participant holding every pivotal fact; the facts dealt across k; raw rows with
distractors to read them from) by scripted self-play policies (envs/teamplay.py): share
everything, share nothing, share at random, and a diagnostic that shares everything but whose
decider ignores the channel (the failure-to-use rate is 0 by construction for the others: their
decider takes the exact posterior's best candidate). Per policy: success per condition, the
communication gap (single minus split, points), the retrieval gap (split minus retrieval),
disclosure, use and failure-to-use rates, and CoSIR's per-message surprisal drops.

`cosir_minus_outcome_pts` (CoSIR's credit against outcome-only credit, trained) needs trained
policies on a substrate that runs team episodes through the rollout engine; none exists yet, so
it is null.

    python bench/teamgym.py [--worlds 4] [--tasks 50] [--out bench/results/teamgym.json]
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
    args = ap.parse_args()
    t0 = time.perf_counter()
    tasks = [t for d in DOMAINS for w in range(args.worlds)
             for t in make_tasks(d, w, args.tasks, args.candidates, args.conditions)]  # fmt: skip
    pivotal = [len(t.pivotal) for t in tasks]
    result = {
        "command": "python bench/teamgym.py " + " ".join(sys.argv[1:]),
        "git_commit": STARTED_AT,
        "settings": {
            **{k: v for k, v in vars(args).items() if k != "out"},
            "domains": list(DOMAINS),
        },  # fmt: skip
        "tasks": len(tasks),
        "pivotal_facts_mean": sum(pivotal) / len(pivotal),
        "pivotal_verified_by_ablation": len(tasks),  # make_tasks raises on any failure
        "policies": {name: run_policy(tasks, p, args) for name, p in POLICIES.items()},
        "cosir_minus_outcome_pts": None,
        "cosir_minus_outcome_note": (
            "needs trained policies on a learning substrate that runs team episodes (the rollout "
            "engine does not yet play several contexts against one channel); not measured"
        ),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, m in result["policies"].items():
        print(name, {k: m[k] for k in ("success_pct", "communication_gap_pts", "retrieval_gap_pts",
                                       "disclosure_rate", "failure_to_use_rate")})  # fmt: skip


if __name__ == "__main__":
    main()
