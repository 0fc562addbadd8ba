"""EnvSched against its baselines (random, pass-rate band, DAPO dynamic sampling, SPO sampling).

Same suite, same warm-start policy (bench/rl_probe.py's cached SFT), same groups per round,
>= 3 seeds per arm. Three measurements, one process, one torch thread:

1. scheduler-only: the warm-start policy frozen, `--fixed-rounds` rounds per arm and seed with the
   history flowing from round to round. Per round: share of groups run whose rewards were all
   equal (they teach GRPO nothing), rollouts spent per informative group in the training batch,
   correlation of predicted and observed variance. Needs no learning.
2. learning: `--rounds` RL rounds per arm and seed (the pipeline's own: loop.run_rounds);
   held-out success (greedy, `evaluate.max_tasks` tasks) against rollouts spent; rollouts
   needed to reach random's best held-out success after training, random / arm
   (`rollouts_ratio_vs_random`).
3. planning time for a synthetic catalog of `--plan-tasks` rows (and a history of 3 rounds).

    .venv/bin/python bench/envsched.py [--seeds 0 1 2] [--rounds 4] [--fixed-rounds 4] \
        [--out bench/results/envsched.json] [key=value overrides]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from rl_probe import heldout, warm_start  # noqa: E402

from bench.common import arm_params, seeded  # noqa: E402
from bench.provenance import STARTED_AT  # noqa: E402
from rollwise import loop, track  # noqa: E402
from rollwise.config import apply_overrides, read_raw, validate  # noqa: E402
from rollwise.rollout.executors import EXECUTORS  # noqa: E402
from rollwise.schedule import SCHEDULERS  # noqa: E402
from rollwise.schedule.plan import EQUAL_EPS, Budget, plan_metrics, timed  # noqa: E402

ARMS = ["random", "envsched", "band", "dapo", "spo"]
# The cached SFT warm start of rl_probe.py; the 16 groups x 8; one epoch and 80 held-out
# tasks so that 5 arms x 3 seeds fit in about 15 minutes on one thread.
DEFAULTS = {
    "warmstart.steps": 800,
    "schedule.tasks_per_round": 16,
    "train.epochs": 1,
    "evaluate.max_tasks": 80,
}


def arm_overrides(arm: str, seed: int, rounds: int) -> dict:
    """The arm in the pipeline's syntax: its scheduler and seed."""
    return {**seeded(seed), "schedule.method": arm, "rounds": rounds}


def round_record(r: int, ro: loop.Rollout, train_s: float = 0.0) -> dict:
    """A round's scheduling figures from its rollout: groups whose rewards (successes) were all
    equal teach GRPO nothing; rollouts spent per informative group kept."""
    ran = ro.plan[ro.plan["ran"]]
    h = ro.history[ro.history["round"] == r]
    informative = ro.plan["kept"] & (ro.plan["obs_var"] > EQUAL_EPS**2)
    return {
        "round": r,
        "rollouts": int(ro.metrics["episodes"]),
        "schedule_s": float(ro.metrics["schedule_s"]),
        "train_s": train_s,
        "zero_var_reward": float((ran["obs_var"] <= EQUAL_EPS**2).mean()),
        "zero_var_success": float(
            ((h["successes"] == 0) | (h["successes"] == h["samples"])).mean()
        ),
        "informative_groups": int(informative.sum()),
        "mean_group_var": float(ran["obs_var"].mean()),
        "rollouts_per_informative": ro.metrics["episodes"] / max(int(informative.sum()), 1),
        "sample_success": float(ro.metrics["success_rate"]),
        **plan_metrics(ro.plan),
    }


def frozen_rounds(arm: str, seed: int, p, suite, warm, n: int) -> list[dict]:
    """`n` rounds of the pipeline's rollout step with the warm-start policy frozen, the
    scheduler's history flowing from round to round: scheduling alone, no learning."""
    model, tok = warm
    cfg, state, out = arm_params(p, arm_overrides(arm, seed, n)), loop.RoundState(), []
    for r in range(1, n + 1):

        def run(specs, r=r):
            limits = loop.limits_of(cfg, r)
            return EXECUTORS["local"](specs, Path("."), Path("."), limits, cfg.rollout,
                                      load=lambda: (model, tok))  # fmt: skip

        ro = loop.rollout(cfg, suite, r, state, run, tok)
        state.history = ro.history
        out.append(round_record(r, ro))
    return out


def run_arm(arm: str, seed: int, p, suite, warm, args, base: dict) -> tuple:
    """One arm and seed from the warm start: the frozen-policy run (`--fixed-rounds`) and the
    RL run (`--rounds` of loop.run_rounds), held-out success after each round."""
    fixed = frozen_rounds(arm, seed, p, suite, warm, args.fixed_rounds)
    cfg = arm_params(p, arm_overrides(arm, seed, args.rounds))
    learn, curve = [], [{"round": 0, "rollouts": 0, "success": base["success"]}]

    def on_round(r: int, done: loop.Round) -> None:
        learn.append(round_record(r, done.rollout))
        spent = curve[-1]["rollouts"] + learn[-1]["rollouts"]
        success = heldout(done.trained.model, warm[1], suite, p)["success"]
        curve.append({"round": r, "rollouts": spent, "success": success})

    model = copy.deepcopy(warm[0])  # trained; the warm start never is
    loop.run_rounds(cfg, suite, model, warm[1], args.rounds, on_round=on_round)
    line = {
        "arm": arm,
        "seed": seed,
        "curve": curve,
        "zero_var_fixed": [round(x["zero_var_reward"], 3) for x in fixed],
    }
    print(json.dumps(line), flush=True)
    return [{"seed": seed, **x} for x in fixed], {"seed": seed, "curve": curve, "rounds": learn}


def mean_curve(runs: list[dict]) -> pd.DataFrame:
    """Held-out success and rollouts spent averaged over seeds, per evaluated round."""
    rows = pd.DataFrame([c for run in runs for c in run["curve"]])
    return rows.groupby("round")[["rollouts", "success"]].mean().reset_index()


def rollouts_to_reach(curve: pd.DataFrame, target: float) -> float | None:
    """Rollouts at the first evaluated round after training that reaches `target`."""
    hit = curve[(curve["round"] > 0) & (curve["success"] >= target - 1e-12)]
    return float(hit["rollouts"].iloc[0]) if len(hit) else None


def summarize(fixed: dict, learn: dict) -> dict:
    curves = {arm: mean_curve(runs) for arm, runs in learn.items()}
    target = float(curves["random"].loc[curves["random"]["round"] > 0, "success"].max())
    need = {arm: rollouts_to_reach(c, target) for arm, c in curves.items()}
    ratio = {arm: (need["random"] / n if n else None) for arm, n in need.items()}
    fixed_df = {arm: pd.DataFrame(rows) for arm, rows in fixed.items()}
    per_round = {
        arm: df.groupby("round")[
            ["zero_var_reward", "zero_var_success", "mean_group_var", "rollouts_per_informative"]
        ]
        .mean()
        .round(4)
        .to_dict("list")
        for arm, df in fixed_df.items()
    }
    learn_zero = {
        arm: float(np.mean([x["zero_var_reward"] for run in runs for x in run["rounds"]]))
        for arm, runs in learn.items()
    }
    return {
        "rollouts_ratio_vs_random": ratio["envsched"],
        "rollouts_to_reach_random_best": need,
        "random_best_heldout_after_training": target,
        "ratios_vs_baselines": {
            arm: (need[arm] / need["envsched"] if need[arm] and need["envsched"] else None)
            for arm in ARMS
            if arm != "envsched"
        },
        "heldout_curves": {arm: c.round(4).to_dict("list") for arm, c in curves.items()},
        "zero_variance_fraction_fixed_policy": {
            arm: float(df["zero_var_reward"].mean()) for arm, df in fixed_df.items()
        },
        "zero_variance_success_fixed_policy": {
            arm: float(df["zero_var_success"].mean()) for arm, df in fixed_df.items()
        },
        "rollouts_per_informative_group_fixed_policy": {
            arm: float(df["rollouts"].sum() / max(df["informative_groups"].sum(), 1))
            for arm, df in fixed_df.items()
        },
        "mean_group_reward_var_fixed_policy": {
            arm: float(df["mean_group_var"].mean()) for arm, df in fixed_df.items()
        },
        "pred_var_corr_fixed_policy": float(
            fixed_df["envsched"].get("pred_var_corr", pd.Series([np.nan])).mean()
        ),
        "fixed_policy_per_round": per_round,
        "zero_variance_fraction_learning": learn_zero,
    }


def planning_time(n_tasks: int, cfg, seed: int = 0) -> dict:
    """EnvSched's plan for a synthetic catalog of n_tasks rows (50-task environments, random
    tool/table subsets) after 3 observed rounds of 512 groups: seconds, best of 3."""
    rng = np.random.default_rng(seed)
    n_env = max(n_tasks // 50, 1)
    env = rng.integers(0, n_env, n_tasks)
    tools = [
        [f"tool{t}" for t in sorted(rng.choice(8, rng.integers(1, 5), replace=False))]
        for _ in range(n_tasks)
    ]
    cat = pd.DataFrame(
        {
            "env_id": [f"env{e:05d}" for e in env],
            "task_id": [f"t{i:06d}" for i in range(n_tasks)],
            "split": "train",
            "tools": tools,
            "tables": [
                [f"table{t}" for t in rng.choice(4, 2, replace=False)] for _ in range(n_tasks)
            ],
            "verifier": rng.choice(["answer", "state", "rubric"], n_tasks),
            "n_calls": [len(t) for t in tools],
            "writes": rng.random(n_tasks) < 0.3,
        }
    )
    seen = rng.choice(n_tasks, 3 * 512, replace=False)
    succ = rng.integers(0, 9, len(seen))
    hist = pd.DataFrame(
        {
            "round": np.repeat([1, 2, 3], 512),
            "env_id": cat["env_id"].to_numpy()[seen],
            "task_id": cat["task_id"].to_numpy()[seen],
            "samples": 8,
            "successes": succ,
            "reward_sum": succ.astype(float),
            "reward_var": succ / 8 * (1 - succ / 8),
            "turns": rng.uniform(1, 6, len(seen)),
            "tool_calls": rng.uniform(0, 5, len(seen)),
            "partial": 0,
            "timeouts": rng.integers(0, 3, len(seen)),
        }
    )
    times = []
    for _ in range(3):
        plan, s = timed(SCHEDULERS["envsched"], cat, hist, Budget(512, 8, 4, seed), cfg)
        times.append(s)
    return {
        "tasks": n_tasks,
        "envs": n_env,
        "groups_planned": len(plan),
        "history_rows": len(hist),
        "seconds_best_of_3": min(times),
    }


def plot(summary: dict, fixed: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for arm, c in summary["heldout_curves"].items():
        a.plot(c["rollouts"], c["success"], marker="o", label=arm)
    a.set(
        xlabel="rollouts spent",
        ylabel="held-out success (greedy)",
        title="learning: held-out success vs rollouts",
    )
    for arm, rows in fixed.items():
        z = pd.DataFrame(rows).groupby("round")["zero_var_reward"].mean()
        b.plot(z.index, z.to_numpy(), marker="o", label=arm)
    b.set(
        xlabel="round (policy frozen)",
        ylabel="groups with all-equal rewards",
        title="scheduler only: zero-variance groups",
    )
    a.legend()
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def clean(obj):
    """NaN (e.g. no correlation in a round where every prediction was equal) as JSON null."""
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean(v) for v in obj]
    return None if isinstance(obj, float) and np.isnan(obj) else obj


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*", help="dotted params overrides key=value")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fixed-rounds", type=int, default=3)
    parser.add_argument("--plan-tasks", type=int, default=50_000)
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise" / "probe")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "envsched.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    given = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in args.overrides)}
    p = validate(apply_overrides(read_raw(ROOT / "params.yaml"), {**DEFAULTS, **given}))
    args.cache.mkdir(parents=True, exist_ok=True)
    suite, model, tok = warm_start(p, args.cache)
    base = heldout(model, tok, suite, p)
    plan_50k = planning_time(args.plan_tasks, p.schedule.envsched)
    print(json.dumps({"planning": plan_50k, "warm_start_heldout": base["success"]}), flush=True)
    fixed: dict[str, list] = {arm: [] for arm in ARMS}
    learn: dict[str, list] = {arm: [] for arm in ARMS}
    for arm in ARMS:
        for seed in args.seeds:
            rows, run = run_arm(arm, seed, p, suite, (model, tok), args, base)
            fixed[arm] += rows
            learn[arm].append(run)
    summary = summarize(fixed, learn)
    png = args.out.with_suffix(".png")
    plot(summary, fixed, png)
    result = {
        "command": "python bench/envsched.py " + " ".join(sys.argv[1:]),
        "git_commit": STARTED_AT,
        "seeds": args.seeds,
        "rounds": args.rounds,
        "groups_per_round": p.schedule.tasks_per_round,
        "samples_per_group": p.rollout.samples_per_task,
        "heldout_tasks": base["n"],
        "warm_start_heldout": base["success"],
        **summary,
        "planning_50k": plan_50k,
        "wall_s": time.perf_counter() - t_start,
        "fixed_policy_rounds": fixed,
        "learning_runs": learn,
    }
    args.out.write_text(json.dumps(clean(result), indent=1, default=float) + "\n")
    run_id = track.open_run(
        ROOT, {"bench": "envsched", **given}, run_name="bench-envsched", fresh=True
    )
    for arm, c in summary["heldout_curves"].items():
        for x, y in zip(c["rollouts"], c["success"], strict=True):
            track.log_metrics(run_id, {f"bench/heldout_success/{arm}": y}, step=int(x), root=ROOT)
    track.log_artifacts(run_id, [png, args.out], "bench", root=ROOT)
    track.finish_run(run_id, root=ROOT)
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "rollouts_ratio_vs_random",
                    "ratios_vs_baselines",
                    "zero_variance_fraction_fixed_policy",
                    "rollouts_per_informative_group_fixed_policy",
                    "planning_50k",
                    "wall_s",
                )
            },
            indent=1,
            default=float,
        )
    )


if __name__ == "__main__":
    main()
