"""Token-signal bench (issue 41): GRPO vs OPD vs OPDVR, and FARCA vs unweighted fact checks, at
an equal rollout budget.

Every arm is a params override set and nothing else (bench/common.py): the same suite, warm
start, schedule and rollout budget, `--rounds` rounds of rollwise.loop.run_rounds, then greedy
held-out success on `--eval-tasks` tasks and the factual error rate of those episodes (the share
of asserted values, call arguments and answer ids, that the evidence the policy had does not
support: credit/facts.py's clean checker). The fact arms train under the noisy checker at
`--flip-rate` (the issue's 20%). The teacher of opd and opdvr is `--teacher` (a policy folder
with the student's tokenizer) or, by default, a warm start of the same params run for
`--teacher-steps` SFT steps without the early stop (same suites, so the same tokenizer).

    .venv/bin/python bench/token_signals.py [key=value overrides] [--arms grpo opd opdvr \
        farca farca_unweighted] [--seeds 0 1 2] [--rounds 4] [--eval-tasks 64] \
        [--flip-rate 0.2] [--teacher DIR | --teacher-steps 800]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

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
from bench.provenance import STARTED_AT  # noqa: E402

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


def median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


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
            "factual_error_rate_median": median([r.get("factual_error_rate") for r in rs]),
        }
    return out


def pts(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(100 * (a - b), 2)


def headline(summary: dict) -> dict:
    """The issue's keys: arm differences in points (medians over seeds), factual error rates."""
    med = {arm: s["heldout_success_median"] for arm, s in summary.items()}
    return {
        "opdvr_minus_opd_pts": pts(med.get("opdvr"), med.get("opd")),
        "opdvr_minus_grpo_pts": pts(med.get("opdvr"), med.get("grpo")),
        "farca_minus_unweighted_pts": pts(med.get("farca"), med.get("farca_unweighted")),
        "factual_error_rate": {a: s["factual_error_rate_median"] for a, s in summary.items()},
        "targets": {"opdvr_minus_opd_pts": ">= 3", "farca_minus_unweighted_pts": ">= 3"},
    }


def heldout_with_facts(model, tok, suite, p, n: int) -> dict:
    """Greedy success on the first `n` held-out tasks and the factual error rate of those
    episodes (a clean checker: flip_rate 0, whatever the arm trained under)."""
    from rollwise.credit.facts import fact_checks
    from rollwise.evaluate.full import evaluation_tasks
    from rollwise.policy.hf import HFBackend
    from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes

    tasks = evaluation_tasks(suite, "heldout", n)
    specs = [EpisodeSpec(f"eval/{t.task_id}", t, clone_env(suite.envs[t.env_id]), group=t.task_id)
             for t in tasks]  # fmt: skip
    limits = Limits(max_context=p.policy.max_context, max_turns=p.evaluate.max_turns,
                    max_new_tokens=p.evaluate.max_new_tokens, greedy=True)  # fmt: skip
    rows, steps = run_episodes(specs, HFBackend(model, tok), tok, limits)
    episodes = pd.DataFrame(rows)
    clean = p.credit.facts.model_copy(update={"flip_rate": 0.0})
    facts = fact_checks(episodes, pd.DataFrame(steps), tok, clean)
    return {"heldout_success": float(episodes["success"].mean()),
            "factual_error_rate": float(1 - facts["supported"].mean()) if len(facts) else None,
            "facts_checked": len(facts)}  # fmt: skip


def teacher_folder(base, suite, args) -> Path:
    """--teacher, or the same params' warm start run longer without its early stop; refused
    unless its tokenizer is the student's (the token log-ratio needs the same vocabulary)."""
    from rollwise.evaluate.folders import check_hf_folder

    if args.teacher:
        check_hf_folder(Path(args.teacher))
        return Path(args.teacher)
    longer = {"warmstart.steps": args.teacher_steps}
    if base.warmstart.stop_at_success is not None:  # keeps its validation words: same tokenizer
        longer["warmstart.stop_at_success"] = 1.0
    return warm_start_folder(arm_params(base, longer), suite, args.cache)


def same_vocab(a: Path, b: Path) -> bool:
    from rollwise.policy.build import load_policy

    return load_policy(a)[1].get_vocab() == load_policy(b)[1].get_vocab()


def run_arm(arm: str, seed: int, base, suite, folder: Path, args) -> dict:
    p = arm_params(base, arm_overrides(arm, args.teacher, args.flip_rate, seed))
    rounds: list[dict] = []

    def on_round(r: int, done) -> None:
        keep = ("token_term_abs_mean", "facts", "fact_reliability_mean", "facts_supported")
        signal = {k: done.credited.metrics[k] for k in keep if k in done.credited.metrics}
        rounds.append({**round_figures(r, done), **signal})

    model, tok, _ = run_arm_rounds(p, suite, folder, on_round=on_round)
    return {"arm": arm, "seed": seed, **heldout_with_facts(model, tok, suite, p, args.eval_tasks),
            "rollouts": sum(r["episodes"] for r in rounds), "rounds": rounds}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*", help="dotted params overrides key=value")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--teacher", default=None, help="a policy folder; default: built")
    parser.add_argument("--teacher-steps", type=int, default=800)
    parser.add_argument("--flip-rate", type=float, default=0.2)
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
    from rollwise.policy.build import load_policy

    model, tok = load_policy(folder)
    student = heldout_with_facts(model, tok, suite, base, args.eval_tasks)
    teacher = None
    if TEACHER_ARMS & set(args.arms):
        tfolder = teacher_folder(base, suite, args)
        if not same_vocab(folder, tfolder):
            raise SystemExit(f"teacher {tfolder}: its tokenizer is not the student's ({folder})")
        args.teacher = str(tfolder)
        t_model, t_tok = load_policy(tfolder)
        teacher = {"folder": os.path.relpath(tfolder, ROOT),
                   **heldout_with_facts(t_model, t_tok, suite, base, args.eval_tasks)}  # fmt: skip
    print(json.dumps({"warm_start": student, "teacher": teacher}), flush=True)
    runs: list[dict] = []
    for seed in args.seeds:
        for arm in args.arms:
            runs.append(run_arm(arm, seed, base, suite, folder, args))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "rounds"}), flush=True)
            summary = summarize(runs)
            result = {"command": " ".join(["python bench/token_signals.py", *sys.argv[1:]]),
                      "git_commit": STARTED_AT, **headline(summary),
                      "warm_start": {"folder": os.path.relpath(folder, ROOT), **student},
                      "teacher": teacher, "flip_rate": args.flip_rate, "rounds": args.rounds,
                      "eval_tasks": args.eval_tasks, "summary": summary,
                      "runs": runs}  # fmt: skip
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(json.dumps(headline(summarize(runs)), default=float))


if __name__ == "__main__":
    main()
