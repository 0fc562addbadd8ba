"""GEPA-Curator bench: does attribution find the injected non-policy failures, what does it
spend, and does curating change held-out success at the same rollout budget?

One process, no orchestration: each arm is a params override set (arm_overrides) and runs the
pipeline's own rounds (rollwise.loop.run_rounds, through bench/common.py). A clean suite and,
per seed, the same suite with faults injected (`envs.faults` = FAULTS; 15-22% of failed
episodes hit by a failure-relevant fault, more as the policy gets better; the faults seed is the
bench seed). One warm start (the pipeline's round_00 for these params; cached) is shared by the
arms, each given the same scheduler seed, rounds and rollouts:
  clean      no faults, curated (its drops are false positives: the 0% suite)
  uncurated  faults, every episode trains (`curate.action: keep`: judged, nothing dropped)
  curated    faults, non-policy episodes dropped (params `curate`)
  weighted   faults, non-policy episodes kept, advantages scaled by 1 - confidence
  demos      curated, and a task banked in an earlier round opens with its best success
  positives  curated, and banked successes of the round's tasks join their GRPO group
after which held-out success is measured greedily on the clean suite's held-out tasks (with
--unseen-suite also on the ~900 tasks of the warm start's validation suite: bench/unseen.py). Each
round's tasks are the pipeline scheduler's (params `schedule`) over the whole train split.

Ground truth comes from each episode's audit rows (the environment's record of what it
injected), read here by the bench only. A failed episode is a non-policy failure when a
withheld tool, a verdict flip, or a flaky call (an environment error or a wrong value)
touched it; list reorders alone do not count (the items and the answer are the same).
Precision and recall are over failed episodes, pooled over seeds and rounds of the curated arm.

    .venv/bin/python bench/curator.py [--seeds 0 1 2] [--rounds 2] [--tasks 16] \
        [--arms clean uncurated curated ...] [--eval-tasks 96] [--sft-steps 400] [--workers 2] \
        [--unseen-suite] [--out bench/results/curator.json] [key=value ...]

`curated_minus_uncurated_pts` and `clean_minus_curated_pts` are those of the best curating arm
(`best_arm`, picked on these same seeds: an optimistic choice); `arm_minus_uncurated_pts` has
every arm's.

The warm start and the suites are cached under .rollwise/bench/curator/ (keyed by their
params): the first run spends most of its time on SFT (`setup_s` in the result).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    arm_params,
    round_figures,
    run_arm_rounds,
    seeded,
    suite_at,
    warm_start_folder,
)
from bench.parallel import run_jobs  # noqa: E402
from bench.provenance import STARTED_AT  # noqa: E402
from bench.unseen import guard_suite, unseen_suite, unseen_tasks  # noqa: E402
from rollwise.config import apply_overrides, read_raw, validate  # noqa: E402
from rollwise.envs.runtime import load_suite  # noqa: E402
from rollwise.evaluate.full import evaluate_policy, evaluation_tasks, summarize  # noqa: E402
from rollwise.policy.build import load_policy  # noqa: E402
from rollwise.policy.hf import HFBackend  # noqa: E402
from rollwise.rollout.engine import Limits  # noqa: E402

# Set for about 15% of failed episodes with a near-zero policy; the better the policy, the larger
# the share: 21.8% of failures (18.6% of episodes) from the 35% warm start of curator.json.
FAULTS = dict(
    flaky_p=0.06, flaky_wrong=0.5, verifier_flip_q=0.04, unsolvable_frac=0.05, stochastic_p=0.2
)
NON_POLICY = {"withheld_tool", "verdict_flip", "flaky_error", "flaky_wrong"}
# Each arm's `curate` overrides (None: no curator at all).
ARMS = {
    "clean": {},
    "uncurated": {"action": "keep"},
    "curated": {"action": "drop"},
    "weighted": {"action": "weight"},
    "demos": {"action": "drop", "demonstrations": True},
    "positives": {"action": "drop", "replay_positives": 2},
}
CURATING = ("curated", "weighted", "demos", "positives")


def arm_overrides(arm: str, seed: int, args) -> dict:
    """The arm in the pipeline's syntax: its seed, its `curate` knobs, and (all but clean) the
    faults of FAULTS injected with the bench seed."""
    out = {**seeded(seed), **{f"curate.{k}": v for k, v in ARMS[arm].items()},
           "schedule.tasks_per_round": args.tasks, "rounds": args.rounds}  # fmt: skip
    if arm != "clean":
        out |= {"envs.faults.seed": seed, **{f"envs.faults.{k}": v for k, v in FAULTS.items()}}
    return out


def labels(audit: pd.DataFrame, episodes: pd.DataFrame) -> list[bool]:
    """Ground truth from the rollout's audit table (what the environment injected): was each
    episode's outcome not the policy's? A success is false when its verdict was flipped."""
    faults = dict(zip(audit["episode_id"], audit["faults"], strict=True))
    return [
        "verdict_flip" in set(faults[e]) if ok else bool(set(faults[e]) & NON_POLICY)
        for e, ok in zip(episodes["episode_id"], episodes["success"], strict=True)
    ]


def run_arm(arm: str, seed: int, model_dir: Path, p, args) -> dict:
    """`--rounds` rounds of the pipeline (loop.run_rounds) from the warm start on the arm's
    suite; held-out success on the clean suite at the end."""
    cfg = arm_params(p, arm_overrides(arm, seed, args))
    suite, _ = suite_at(args.cache, cfg.envs)
    clean, _ = suite_at(args.cache, p.envs)
    rounds, judged, spent = [], [], {"rollout": 0, "curator": 0, "episodes": 0, "demos": 0,
                                     "too_long": 0, "replayed": 0}  # fmt: skip

    def on_round(r: int, done) -> None:
        ro, table = done.rollout, done.curated.tables["attributions"]
        truth = labels(ro.audit, ro.episodes)
        faults = dict(zip(ro.audit["episode_id"], ro.audit["faults"], strict=True))
        injected = [sorted(faults[e]) for e in table["episode_id"]]
        judged.append(table.assign(truth=truth, faults=injected, round=r))
        spent["rollout"] += int(ro.episodes["verifier_calls"].sum())
        spent["curator"] += int(table["verifier_calls"].sum())
        spent["episodes"] += int(ro.metrics["episodes"])
        spent["demos"] += int(ro.metrics["demonstrated_tasks"])
        spent["too_long"] += int(ro.metrics["demonstrations_skipped_context"])
        spent["replayed"] += int(done.credited.metrics["replayed_positives"])
        rounds.append(round_figures(r, done))

    checked = guard_suite(suite, p, args.unseen_dir)  # the arm's suite, or the validation one
    model, tok, _ = run_arm_rounds(cfg, suite, model_dir, checked, on_round)
    return {
        "guard_undone_rounds": sum(int(x.get("guard_reverted", 0)) for x in rounds),
        "rounds": rounds,
        "arm": arm,
        "seed": seed,
        "heldout_success": heldout(model, tok, clean, p, args),
        "unseen_success": unseen_success(model, tok, p, args),
        "episodes": spent["episodes"],
        "rollout_verifier_calls": spent["rollout"],
        "curator_verifier_calls": spent["curator"],
        "demonstrated_tasks": spent["demos"],
        "demonstrations_skipped_context": spent["too_long"],
        "replayed_positives": spent["replayed"],
        "judged": pd.concat(judged, ignore_index=True) if judged else None,
    }


def heldout(model, tok, clean, p, args) -> float:
    """Greedy success on the clean suite's held-out tasks (the same tasks for every arm)."""
    tasks = evaluation_tasks(clean, "heldout", args.eval_tasks)
    limits = Limits(max_context=p.policy.max_context, greedy=True)
    return summarize(evaluate_policy(HFBackend(model, tok), tok, clean, tasks, limits))["success"]


def unseen_success(model, tok, p, args) -> float | None:
    """Greedy success on the unseen suite's tasks (--unseen-suite; bench/unseen.py), else None."""
    if args.unseen_dir is None:
        return None
    suite = load_suite(args.unseen_dir)
    limits = Limits(max_context=p.policy.max_context, greedy=True)
    episodes = evaluate_policy(HFBackend(model, tok), tok, suite, unseen_tasks(suite, p), limits)
    return summarize(episodes)["success"]


def confusion(judged: pd.DataFrame) -> dict:
    pred, truth = judged["cause"] != "policy", judged["truth"]
    tp, fp, fn = int((pred & truth).sum()), int((pred & ~truth).sum()), int((~pred & truth).sum())
    return {
        "episodes": len(judged),
        "true_non_policy": int(truth.sum()),
        "flagged": int(pred.sum()),
        "precision": tp / (tp + fp) if tp + fp else 1.0,
        "recall": tp / (tp + fn) if tp + fn else 1.0,
    }


def mistakes(judged: pd.DataFrame, limit: int = 12) -> list[dict]:
    """False positives and negatives, with the curator's cause and the injected faults."""
    pred = judged["cause"] != "policy"
    wrong = judged[pred != judged["truth"]].head(limit)
    return [
        {"episode_id": e, "success": bool(ok), "cause": c, "confidence": float(conf),
         "faults": list(f), "scores": json.loads(sc)}
        for e, ok, c, conf, f, sc in wrong[
            ["episode_id", "success", "cause", "confidence", "faults", "scores"]
        ].itertuples(index=False)
    ]  # fmt: skip


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    held = result["heldout"]
    arms = [a for a in ARMS if a in held]
    for i, arm in enumerate(arms):
        vals = [100 * v for v in held[arm]]
        a.bar(i, sum(vals) / len(vals), color="lightgray", edgecolor="black")
        a.scatter([i] * len(vals), vals, color="black", zorder=3)
    a.axhline(100 * held["warmstart"], ls="--", color="gray", label="warm start")
    unseen = result.get("unseen", {})  # --unseen-suite: the same runs on the unseen suite
    for i, arm in enumerate(arms):
        if arm in unseen:
            vals = [100 * v for v in unseen[arm]]
            first = "unseen suite" if i == 0 else None
            a.scatter([i + 0.25] * len(vals), vals, facecolors="none", edgecolors="tab:red",
                      zorder=3, label=first)  # fmt: skip
    if unseen:
        a.axhline(100 * unseen["warmstart"], ls=":", color="tab:red", label="warm start, unseen")
    a.set_xticks(range(len(arms)), arms, rotation=20)
    a.set_ylabel("held-out success (%)")
    a.set_title(f"same rollout budget, {len(held['uncurated'])} seeds")
    a.legend()
    causes = result["per_fault_recall"]
    b.bar(range(len(causes)), [v or 0.0 for v in causes.values()], color="steelblue")
    b.set_xticks(range(len(causes)), list(causes), rotation=20)
    b.set_ylim(0, 1.05)
    b.set_title(
        f"recall by injected fault; precision {result['precision']:.2f}, "
        f"recall {result['recall']:.2f}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*", help="dotted params overrides key=value")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=16, help="tasks per round")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--eval-tasks", type=int, default=96)
    parser.add_argument("--sft-steps", type=int, default=400, help="warm start (cached)")
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise" / "bench" / "curator")
    parser.add_argument(
        "--warm-start",
        type=Path,
        help="a saved policy folder (e.g. models/round_00) instead of building the warm start",
    )
    parser.add_argument(  # 2 on 2 cores: the arms are independent, one torch thread each
        "--workers", type=int, default=1, help="arms run in this many processes"
    )
    parser.add_argument(  # needs warmstart.stop_at_success (its validation suite's words)
        "--unseen-suite", action="store_true",
        help="also evaluate on the warm start's validation suite (bench/unseen.py)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "curator.json")
    args = parser.parse_args()
    missing = [a for a in ("clean", "uncurated", "curated") if a not in args.arms]
    if missing:  # the summary compares against all three: fail before hours of rollouts
        parser.error(f"--arms must include clean, uncurated and curated; missing: {missing}")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    overrides = {"warmstart.steps": args.sft_steps}
    overrides |= {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in args.overrides)}
    p = validate(apply_overrides(read_raw(ROOT / "params.yaml"), overrides))
    args.cache.mkdir(parents=True, exist_ok=True)
    clean, _ = suite_at(args.cache, p.envs)
    model_dir = warm_start_folder(p, clean, args.cache, args.warm_start)
    sft_s = time.perf_counter() - t0
    model, tok = load_policy(model_dir)
    args.unseen_dir = unseen_suite(p, args.cache, tok) if args.unseen_suite else None
    base = heldout(model, tok, clean, p, args)
    base_unseen = unseen_success(model, tok, p, args)
    print(json.dumps({"warmstart_heldout": base, "warmstart_unseen": base_unseen,
                      "setup_s": round(sft_s)}), flush=True)  # fmt: skip
    for seed in args.seeds:  # built here once, before workers read them from the cache
        suite_at(args.cache, arm_params(p, arm_overrides("curated", seed, args)).envs)

    def announce(run: dict) -> dict:
        line = {k: v for k, v in run.items() if k not in ("judged", "rounds")}
        print(json.dumps({**line, "elapsed_s": round(time.perf_counter() - t0)}), flush=True)
        return run

    jobs = [(arm, seed, model_dir, p, args) for seed in args.seeds for arm in args.arms]
    runs = run_jobs(run_arm, jobs, args.workers, announce)
    result = summarize_runs(runs, base, args, time.perf_counter() - t0)
    if args.unseen_dir is not None:
        result.update(unseen_summary(runs, base_unseen, result["best_arm"], p, args))
    result["setup_s"] = sft_s
    result["warm_start"] = str(args.warm_start or "built")
    n_heldout = len(evaluation_tasks(clean, "heldout", args.eval_tasks))
    result["heldout_pts_per_task"] = 100 / n_heldout  # the resolution of one held-out task
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot_path = args.out.with_suffix(".png")
    plot(result, plot_path)
    result["plot"] = os.path.relpath(plot_path, ROOT)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "precision",
                    "recall",
                    "curated_minus_uncurated_pts",
                    "clean_minus_curated_pts",
                    "wall_s",
                )
            }
        )
    )


# what the result file keeps of each run (its judged episodes are summarized, not kept)
RUN_FIGURES = ("arm", "seed", "heldout_success", "unseen_success", "guard_undone_rounds", "rounds")


def summarize_runs(runs: list[dict], warm: float, args, wall_s: float) -> dict:
    by_arm = {arm: [r for r in runs if r["arm"] == arm] for arm in args.arms}
    curated = pd.concat([r["judged"] for r in by_arm["curated"]], ignore_index=True)
    clean = pd.concat([r["judged"] for r in by_arm["clean"]], ignore_index=True)
    failed = curated[~curated["success"]]
    held = {arm: [r["heldout_success"] for r in rs] for arm, rs in by_arm.items()}
    mean = {arm: sum(v) / len(v) for arm, v in held.items()}
    gains = {a: 100 * (mean[a] - mean["uncurated"]) for a in CURATING if a in mean}
    best = max(gains, key=gains.get)
    bank_use = {
        arm: {k: sum(r[k] for r in rs) for k in ("demonstrated_tasks",
              "demonstrations_skipped_context", "replayed_positives")}
        for arm, rs in by_arm.items()
    }  # fmt: skip
    spent = sum(r["curator_verifier_calls"] for r in by_arm["curated"])
    rollout_calls = sum(r["rollout_verifier_calls"] for r in by_arm["curated"])
    return {
        "command": "python bench/curator.py " + " ".join(sys.argv[1:]),
        "git_commit": STARTED_AT,
        "seeds": args.seeds,
        "rounds": args.rounds,
        "tasks_per_round": args.tasks,
        "eval_tasks": args.eval_tasks,
        "faults": FAULTS,
        **{k: v for k, v in confusion(failed).items() if k in ("precision", "recall")},
        "faulty_suite": {
            "failed": confusion(failed),
            "all_episodes": confusion(curated),
            "non_policy_share": float(curated["truth"].mean()),
            "non_policy_share_of_failures": float(failed["truth"].mean()),
            "causes": curated["cause"].value_counts().to_dict(),
        },
        "clean_suite": {
            "episodes": len(clean),
            "flagged": int((clean["cause"] != "policy").sum()),
            "false_positive_rate": float((clean["cause"] != "policy").mean()),
            "causes": clean["cause"].value_counts().to_dict(),
        },
        "per_fault_recall": per_fault_recall(by_arm["curated"]),
        "mistakes": mistakes(curated),
        "verifier_calls": {
            "curator": spent,
            "rollout": rollout_calls,
            "curator_per_episode": spent / max(len(curated), 1),
        },
        "heldout": {"warmstart": warm, **held},
        "heldout_mean": mean,
        "arm_minus_uncurated_pts": gains,
        "bank_use": bank_use,
        "best_arm": best,
        "curated_minus_uncurated_pts": gains[best],
        "clean_minus_curated_pts": 100 * (mean["clean"] - mean[best]),
        "targets": {
            "precision": ">= 0.9",
            "recall": ">= 0.8",
            "curated_minus_uncurated_pts": ">= 5",
            "clean_minus_curated_pts": "<= 2",
        },
        "runs": [{k: r[k] for k in RUN_FIGURES} for r in runs],
        "wall_s": wall_s,
    }


def unseen_summary(runs: list[dict], warm: float, best: str, p, args) -> dict:
    """The same runs on the unseen suite: its figures beside the held-out headline ones."""
    held = {arm: [r["unseen_success"] for r in runs if r["arm"] == arm] for arm in args.arms}
    mean = {arm: sum(v) / len(v) for arm, v in held.items()}
    return {
        "unseen": {"warmstart": warm, **held},
        "unseen_tasks": len(unseen_tasks(load_suite(args.unseen_dir), p)),
        "unseen_mean": mean,
        "curated_minus_uncurated_unseen_suite_pts": 100 * (mean[best] - mean["uncurated"]),
        "clean_minus_curated_unseen_suite_pts": 100 * (mean["clean"] - mean[best]),
    }


def per_fault_recall(runs: list[dict]) -> dict:
    judged = pd.concat([r["judged"] for r in runs], ignore_index=True)
    out = {}
    for fault in sorted(NON_POLICY):
        hit = judged[judged["faults"].map(lambda f, fault=fault: fault in f) & judged["truth"]]
        out[fault] = float((hit["cause"] != "policy").mean()) if len(hit) else None
    return out


if __name__ == "__main__":
    main()
