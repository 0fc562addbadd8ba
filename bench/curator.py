"""GEPA-Curator bench: does attribution find the injected non-policy failures, what does it
spend, and does curating change held-out success at the same rollout budget?

One process, no orchestration. A clean suite and, per seed, the same suite with faults injected
(15-22% of failed episodes hit by a failure-relevant fault, more as the policy gets better:
FAULTS; the faults seed is the bench seed). One warm start (the pipeline's,
rollwise.train.warmstart.sft_warm_start; cached) is shared by the arms of a seed, each given
the same plan, rounds and rollouts:
  clean      no faults, curated (its drops are false positives: the 0% suite)
  uncurated  faults, every episode trains
  curated    faults, non-policy episodes dropped (params `curate`)
  weighted   faults, non-policy episodes kept, advantages scaled by 1 - confidence
  demos      curated, and a task banked in an earlier round opens with its best success
  positives  curated, and banked successes of the round's tasks join their GRPO group
after which held-out success is measured greedily on the clean suite's held-out tasks (with
--unseen-suite also on the ~900 tasks of the warm start's validation suite: bench/unseen.py). Each
round's tasks are drawn from a fixed pool per seed (`--pool`) so that tasks come back and the
success bank has something to give (with the whole train split, rounds barely overlap).

Ground truth comes from each episode's audit rows (the environment's record of what it
injected), read here by the bench only. A failed episode is a non-policy failure when a
withheld tool, a verdict flip, or a flaky call (an environment error or a wrong value)
touched it; list reorders alone do not count (the items and the answer are the same).
Precision and recall are over failed episodes, pooled over seeds and rounds of the curated arm.

    .venv/bin/python bench/curator.py [--seeds 0 1 2] [--rounds 2] [--tasks 16] [--pool 32] \
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
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.parallel import run_jobs  # noqa: E402
from bench.provenance import STARTED_AT  # noqa: E402
from bench.unseen import guard_suite, unseen_suite, unseen_tasks  # noqa: E402
from rollwise.config import FaultsConfig, apply_overrides, read_raw, validate  # noqa: E402
from rollwise.credit import ESTIMATORS, trained_reward  # noqa: E402
from rollwise.curate import success_bank  # noqa: E402
from rollwise.curate.attribution import attribute  # noqa: E402
from rollwise.curate.filters import decide, weighted_advantages  # noqa: E402
from rollwise.envs.generate import generate_suite  # noqa: E402
from rollwise.envs.runtime import load_suite  # noqa: E402
from rollwise.evaluate.folders import check_hf_folder  # noqa: E402
from rollwise.evaluate.full import evaluate_policy, evaluation_tasks, summarize  # noqa: E402
from rollwise.policy.build import load_policy, save_policy  # noqa: E402
from rollwise.policy.hf import HFBackend  # noqa: E402
from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes  # noqa: E402
from rollwise.train.guard import InProcessGuard  # noqa: E402
from rollwise.train.optim import make_optimizer  # noqa: E402
from rollwise.train.trainer import kl_anchor, train_round, training_batch  # noqa: E402
from rollwise.train.warmstart import sft_warm_start  # noqa: E402
from rollwise.types import STEP_COLUMNS  # noqa: E402

# Set for about 15% of failed episodes with a near-zero policy; the better the policy, the larger
# the share: 21.8% of failures (18.6% of episodes) from the 35% warm start of curator.json.
FAULTS = dict(
    flaky_p=0.06, flaky_wrong=0.5, verifier_flip_q=0.04, unsolvable_frac=0.05, stochastic_p=0.2
)
NON_POLICY = {"withheld_tool", "verdict_flip", "flaky_error", "flaky_wrong"}
# Each arm's `curate` overrides (None: no curator at all).
ARMS = {
    "clean": {},
    "uncurated": None,
    "curated": {"action": "drop"},
    "weighted": {"action": "weight"},
    "demos": {"action": "drop", "demonstrations": True},
    "positives": {"action": "drop", "replay_positives": 2},
}
CURATING = ("curated", "weighted", "demos", "positives")


def key_of(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:10]


def suite_at(cache: Path, envs, faults: FaultsConfig | None):
    cfg = envs if faults is None else envs.model_copy(update={"faults": faults})
    folder = cache / f"suite_{key_of(cfg.model_dump())}"
    if not folder.exists():
        generate_suite(cfg, folder)
    return load_suite(folder)


def warm_start(p, cache: Path, clean, given: Path | None = None) -> Path:
    """The warm-start folder of `p`, built once and cached; `given` (a saved policy folder)
    replaces it: a partial warm start differs by machine, so comparisons share one."""
    if given is not None:
        check_hf_folder(given)
        return given
    folder = (
        cache
        / f"sft_{key_of(p.envs.model_dump(), p.policy.model_dump(), p.warmstart.model_dump())}"
    )
    if not folder.exists():
        model, tok, _, _ = sft_warm_start(p, clean)
        save_policy(model, tok, folder)
    return folder


def plan(suite, args, seed: int, r: int) -> list[str]:
    """Uniform over a fixed pool of train tasks per seed (the whole split with --pool 0), as the
    `random` scheduler picks: the same tasks for every arm."""
    train = sorted(t.task_id for t in suite.split("train"))
    pool = random.Random(seed).sample(train, args.pool) if args.pool else train
    return random.Random(seed * 1000 + r).sample(sorted(pool), args.tasks)


def labels(spec: EpisodeSpec, success: bool) -> bool:
    """Ground truth from the episode's own audit rows: was its outcome not the policy's?"""
    faults = {a["fault"] for a in spec.env.audit}
    if success:
        return "verdict_flip" in faults  # a false success
    return bool(faults & NON_POLICY)


def run_arm(arm: str, seed: int, suite, clean, model_dir: Path, p, args) -> dict:
    """Rounds of rollout -> (curate) -> GRPO -> PPO from the warm start; held-out at the end."""
    model, tok = load_policy(model_dir)
    torch.manual_seed(seed)
    opt, ref = make_optimizer(model, p.train), kl_anchor(model, p.train)
    cur = None if ARMS[arm] is None else p.curate.model_copy(update=ARMS[arm])
    judged, spent, rollout_verifier, episodes_spent = [], 0, 0, 0
    bank, demonstrated, too_long, replayed = None, 0, 0, 0
    checked = guard_suite(suite, p, args.unseen_dir)  # the arm's suite, or the validation one
    guard = InProcessGuard(model, tok, checked, p.train.guard, p.policy.max_context)
    rounds = []
    for r in range(1, args.rounds + 1):
        picked = plan(suite, args, seed, r)
        demos = {}
        if cur is not None and cur.demonstrations and bank is not None:
            tasks = [suite.tasks[t] for t in picked]
            demos, skipped = success_bank.demonstrations(
                bank, tasks, suite.envs, tok, p.policy.max_context, p.rollout.max_new_tokens
            )
            demonstrated, too_long = demonstrated + len(demos), too_long + len(skipped)
        specs = [
            EpisodeSpec(
                f"s{seed}/r{r}/{tid}/{k}",
                suite.tasks[tid],
                opening(clone_env(suite.envs[suite.tasks[tid].env_id]), demos, tid),
                group=tid,
                sample=k,
                seed=seed * 100000 + r * 1000 + k,
            )
            for tid in picked
            for k in range(p.rollout.samples_per_task)
        ]
        limits = Limits(
            max_context=p.policy.max_context,
            temperature=p.rollout.temperature,
            max_turns=p.rollout.max_turns,
            max_new_tokens=p.rollout.max_new_tokens,
            seed=seed * 1000 + r,
        )
        rows, steps = run_episodes(specs, HFBackend(model, tok), tok, limits)
        episodes = pd.DataFrame(rows).assign(round=r, policy_version=r - 1)  # as tasks/rollout.py
        steps = pd.DataFrame(steps, columns=STEP_COLUMNS)
        episodes_spent += len(episodes)
        rollout_verifier += int(episodes["verifier_calls"].sum())
        kept, decisions = episodes, None
        if cur is not None:
            table, _ = attribute(episodes, steps, suite, cur)
            decisions = decide(table, cur)
            kept = episodes[decisions["kept"].to_numpy()].reset_index(drop=True)
            spent += int(table["verifier_calls"].sum())
            truth = [labels(s, bool(ok)) for s, ok in zip(specs, episodes["success"], strict=True)]
            faults = [sorted({a["fault"] for a in s.env.audit}) for s in specs]
            judged.append(table.assign(truth=truth, faults=faults, round=r))
            prior = bank
            new = success_bank.verified_successes(episodes, steps, table)
            bank = success_bank.update(bank, new, cur.bank_per_task)
            if cur.replay_positives and prior is not None:  # as tasks/credit.py replays them
                pos = success_bank.positives(prior, picked, cur.replay_positives, r)
                kept = pd.concat([kept, pos], ignore_index=True)
                steps = pd.concat([steps, success_bank.positive_steps(pos)], ignore_index=True)
                replayed += len(pos)
        adv = ESTIMATORS["grpo"](trained_reward(kept, p.credit.reward), steps, p.credit)
        if decisions is not None:
            adv = weighted_advantages(adv, decisions)
        items = training_batch(kept, adv)
        stats = guard.update(opt, lambda items=items: train_round(
            model, items, p.train, opt, tok.pad_token_id, ref, temperature=p.rollout.temperature
        ))  # fmt: skip
        rounds.append({"round": r, "sample_success": float(episodes["success"].mean()),
                       "approx_kl": float(stats.get("approx_kl", 0.0)),
                       **{k: v for k, v in stats.items() if k.startswith("guard_")}})  # fmt: skip
    return {
        "guard_undone_rounds": sum(int(x.get("guard_reverted", 0)) for x in rounds),
        "rounds": rounds,
        "arm": arm,
        "seed": seed,
        "heldout_success": heldout(model, tok, clean, p, args),
        "unseen_success": unseen_success(model, tok, p, args),
        "episodes": episodes_spent,
        "rollout_verifier_calls": rollout_verifier,
        "curator_verifier_calls": spent,
        "demonstrated_tasks": demonstrated,
        "demonstrations_skipped_context": too_long,
        "replayed_positives": replayed,
        "judged": pd.concat(judged, ignore_index=True) if judged else None,
    }


def arm_in_worker(arm: str, seed: int, model_dir: Path, p, args) -> dict:
    """run_arm with the suites read from the cache, as a worker process (--workers) needs: an
    arm is seeded by (arm, seed) alone, so its figures do not depend on the process."""
    clean = suite_at(args.cache, p.envs, None)
    faults = None if arm == "clean" else FaultsConfig(seed=seed, **FAULTS)
    return run_arm(arm, seed, suite_at(args.cache, p.envs, faults), clean, model_dir, p, args)


def opening(env, demos: dict, task_id: str):
    return success_bank.Demonstrated(env, demos[task_id]) if task_id in demos else env


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
    parser.add_argument("--pool", type=int, default=32, help="train tasks per seed; 0: all")
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
    clean = suite_at(args.cache, p.envs, None)
    model_dir = warm_start(p, args.cache, clean, args.warm_start)
    sft_s = time.perf_counter() - t0
    model, tok = load_policy(model_dir)
    args.unseen_dir = unseen_suite(p, args.cache, tok) if args.unseen_suite else None
    base = heldout(model, tok, clean, p, args)
    base_unseen = unseen_success(model, tok, p, args)
    print(json.dumps({"warmstart_heldout": base, "warmstart_unseen": base_unseen,
                      "setup_s": round(sft_s)}), flush=True)  # fmt: skip
    for seed in args.seeds:  # built here once, before workers read them from the cache
        suite_at(args.cache, p.envs, FaultsConfig(seed=seed, **FAULTS))

    def announce(run: dict) -> dict:
        line = {k: v for k, v in run.items() if k not in ("judged", "rounds")}
        print(json.dumps({**line, "elapsed_s": round(time.perf_counter() - t0)}), flush=True)
        return run

    jobs = [(arm, seed, model_dir, p, args) for seed in args.seeds for arm in args.arms]
    runs = run_jobs(arm_in_worker, jobs, args.workers, announce)
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
        "task_pool": args.pool,
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
