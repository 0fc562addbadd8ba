"""Token-signal bench (issue 41): GRPO vs OPD vs OPDVR, and FARCA vs unweighted fact checks, at
an equal rollout budget. NOT RUN YET: it needs a learning substrate (a warm start that learns
from RL on this suite, and for OPD a stronger teacher checkpoint with the same tokenizer).

Every arm is a params override set and nothing else (bench/common.py): the same suite, warm
start, schedule and rollout budget, `--rounds` rounds of rollwise.loop.run_rounds, then greedy
held-out success on `--eval-tasks` tasks. The fact arms run the noisy checker at `--flip-rate`.

    .venv/bin/python bench/token_signals.py --teacher models/round_08 [--arms grpo opd opdvr \
        farca farca_unweighted] [--seeds 0 1 2] [--rounds 4] [--eval-tasks 64] \
        [--flip-rate 0.1] [key=value overrides]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    arm_params,
    bench_params,
    parse_overrides,
    round_figures,
    run_arm_rounds,
    seeded,
    suite_at,
    warm_start_folder,
)

# arm -> its overrides; the teacher and the checker's flip rate are filled in by arm_overrides
ARMS = {
    "grpo": {"credit.method": "grpo"},
    "opd": {"credit.method": "opd", "credit.opd.base": "grpo"},
    "opdvr": {"credit.method": "opdvr", "credit.opd.base": "grpo"},
    "farca": {
        "credit.method": "farca",
        "credit.facts.base": "grpo",
        "credit.facts.weighted": True,
    },  # fmt: skip
    "farca_unweighted": {
        "credit.method": "farca",
        "credit.facts.base": "grpo",
        "credit.facts.weighted": False,
    },  # fmt: skip
}
TEACHER_ARMS = {"opd", "opdvr"}
FACT_ARMS = {"farca", "farca_unweighted"}


def arm_overrides(arm: str, teacher: str | None, flip_rate: float, seed: int) -> dict:
    """The full override set of one arm and seed; a teacher arm without a teacher is refused."""
    out = {**ARMS[arm], **seeded(seed)}
    if arm in TEACHER_ARMS:
        if teacher is None:
            raise ValueError(f"arm {arm} needs --teacher (a stronger policy folder)")
        out["credit.opd.teacher"] = teacher
    if arm in FACT_ARMS:
        out["credit.facts.flip_rate"] = flip_rate
    return out


def summarize(runs: list[dict]) -> dict:
    """Per arm: median held-out success and rollouts spent over seeds, and each seed's gain over
    grpo on the same seed (paired), where grpo ran."""
    by_arm: dict[str, list[dict]] = {}
    for run in runs:
        by_arm.setdefault(run["arm"], []).append(run)
    grpo = {r["seed"]: r["heldout_success"] for r in by_arm.get("grpo", [])}
    out = {}
    for arm, rs in by_arm.items():
        gains = [r["heldout_success"] - grpo[r["seed"]] for r in rs if r["seed"] in grpo]
        out[arm] = {
            "seeds": len(rs),
            "heldout_success_median": float(np.median([r["heldout_success"] for r in rs])),
            "rollouts_median": float(np.median([r["rollouts"] for r in rs])),
            "gain_vs_grpo_median": float(np.median(gains)) if gains else None,
        }
    return out


def run_arm(arm: str, seed: int, base, suite, folder: Path, args) -> dict:
    from bench.learning import heldout

    p = arm_params(base, arm_overrides(arm, args.teacher, args.flip_rate, seed))
    rounds: list[dict] = []

    def on_round(r: int, done) -> None:
        keep = ("token_term_abs_mean", "facts", "fact_reliability_mean", "facts_supported")
        signal = {k: done.credited.metrics[k] for k in keep if k in done.credited.metrics}
        rounds.append({**round_figures(r, done), **signal})

    model, tok, _ = run_arm_rounds(p, suite, folder, on_round=on_round)
    success = float(heldout(model, tok, suite, p, args.eval_tasks)["success"].mean())
    return {"arm": arm, "seed": seed, "heldout_success": success,
            "rollouts": sum(r["episodes"] for r in rounds), "rounds": rounds}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*", help="dotted params overrides key=value")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--teacher", default=None)
    parser.add_argument("--flip-rate", type=float, default=0.1)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--eval-tasks", type=int, default=64)
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise" / "bench" / "tokensig")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "token_signals.json"
    )
    args = parser.parse_args()
    base = bench_params({**parse_overrides(args.overrides), "rounds": args.rounds})
    args.cache.mkdir(parents=True, exist_ok=True)
    suite, _ = suite_at(args.cache, base.envs)
    folder = warm_start_folder(base, suite, args.cache)
    runs = []
    for seed in args.seeds:
        for arm in args.arms:
            runs.append(run_arm(arm, seed, base, suite, folder, args))
            result = {"command": " ".join(["bench/token_signals.py", *sys.argv[1:]]),
                      "summary": summarize(runs), "runs": runs}  # fmt: skip
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(json.dumps(result["summary"], default=float))


if __name__ == "__main__":
    main()
