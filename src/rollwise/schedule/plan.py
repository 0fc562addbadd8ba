"""What every scheduler returns, and the one loop that rolls a plan out.

A plan is a table, one row per scheduled (environment, task) group, in pick order. Static
schedulers fill one `batch` (0); DAPO's dynamic sampling lists candidate batches 0, 1, ... and
marks them `drop_equal`: `execute_plan` rolls batch after batch until enough groups with unequal
rewards are kept, and every rollout it spends on the way is counted, kept or not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

# The columns every plan has; schedulers add their own score parts after these.
PLAN_COLUMNS = ["env_id", "task_id", "n_samples", "batch", "drop_equal", "score", "reason"]
EQUAL_EPS = 1e-9  # reward std below this: the group's advantages are all zero


@dataclass(frozen=True)
class Budget:
    """What one round may spend: `tasks` groups of `samples` rollouts each. `round` is the round
    being planned (history rows of earlier rounds age against it); `seed` breaks ties."""

    tasks: int
    samples: int
    round: int = 1
    seed: int = 0


def train_split(catalog: pd.DataFrame) -> pd.DataFrame:
    """Schedulers only ever pick training tasks; a stable order makes plans reproducible."""
    train = catalog[catalog["split"] == "train"]
    return train.sort_values("task_id", kind="stable").reset_index(drop=True)


def make_plan(picked: pd.DataFrame, budget: Budget, **columns) -> pd.DataFrame:
    """The plan table from picked catalog rows, base columns first, then score parts."""
    n = len(picked)
    base = {
        "env_id": picked["env_id"].to_numpy(),
        "task_id": picked["task_id"].to_numpy(),
        "n_samples": np.full(n, budget.samples, dtype=np.int64),
        "batch": np.zeros(n, dtype=np.int64),
        "drop_equal": np.zeros(n, dtype=bool),
    }
    return pd.DataFrame({**base, **columns})[
        PLAN_COLUMNS + [c for c in columns if c not in PLAN_COLUMNS]
    ]


def execute_plan(
    plan: pd.DataFrame, run: Callable[[pd.DataFrame], pd.DataFrame], target: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Roll the plan out batch by batch: `run(rows) -> episodes` (columns task_id, reward).
    Stops once `target` groups are kept; a `drop_equal` group is kept only if its rewards differ,
    and only up to `target` (DAPO fills the batch, then discards the excess). Returns (plan with
    ran/kept/obs_mean/obs_var columns, every episode run)."""
    out = plan.assign(ran=False, kept=False, obs_mean=np.nan, obs_var=np.nan)
    runs: list[pd.DataFrame] = []
    for b in sorted(out["batch"].unique()):
        rows = out.index[out["batch"] == b]
        episodes = run(out.loc[rows])
        runs.append(episodes)
        stats = episodes.groupby("task_id")["reward"].agg(["mean", lambda r: r.var(ddof=0)])
        stats.columns = ["mean", "var"]
        at = out.loc[rows, "task_id"]
        out.loc[rows, "ran"] = True
        out.loc[rows, "obs_mean"] = at.map(stats["mean"]).to_numpy()
        out.loc[rows, "obs_var"] = at.map(stats["var"]).to_numpy()
        informative = ~out.loc[rows, "drop_equal"] | (out.loc[rows, "obs_var"] > EQUAL_EPS**2)
        room = target - int(out["kept"].sum())
        keep = rows[informative.to_numpy()][: max(room, 0)]
        out.loc[keep, "kept"] = True
        if out["kept"].sum() >= target:
            break
    return out, pd.concat(runs, ignore_index=True) if runs else pd.DataFrame()


def timed(fn: Callable[..., pd.DataFrame], *args) -> tuple[pd.DataFrame, float]:
    """A plan and the seconds it took (reported per round as the scheduling time)."""
    t0 = time.perf_counter()
    plan = fn(*args)
    return plan, time.perf_counter() - t0


def plan_metrics(executed: pd.DataFrame) -> dict[str, float]:
    """Per-round scheduling figures: entropy of the kept batch over environments (nats), groups
    run whose rewards were all equal, rollouts burned (run but not kept), and, where the plan
    predicted variance, its Pearson correlation with the variance observed."""
    ran, kept = executed[executed["ran"]], executed[executed["kept"]]
    share = kept["env_id"].value_counts(normalize=True).to_numpy()
    out = {
        "env_entropy": float(-(share * np.log(share)).sum()) if len(share) else 0.0,
        "envs_in_batch": int(kept["env_id"].nunique()),
        "groups_run": len(ran),
        "groups_kept": len(kept),
        "burned_rollouts": int(ran.loc[~ran["kept"], "n_samples"].sum()),
    }
    if "pred_var" in ran and len(ran) > 2:
        pred, obs = ran["pred_var"].to_numpy(float), ran["obs_var"].to_numpy(float)
        if np.std(pred) > 0 and np.std(obs) > 0:
            out["pred_var_corr"] = float(np.corrcoef(pred, obs)[0, 1])
    return out
