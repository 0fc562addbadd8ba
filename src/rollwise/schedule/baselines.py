"""Baseline schedulers: what EnvSched must beat. Each is pure given (catalog, history, budget,
cfg): the plan depends on nothing else, `budget.seed` drives any randomness.

- random: uniform over the train split, without replacement within a round.
- band: tasks whose recent pass rate lies in [lo, hi] (decayed success rate), then tasks never
  tried, then the nearest to the band.
- dapo: DAPO's dynamic sampling. Candidates in random order, cut into generation batches of
  `oversample` x tasks; execute_plan (plan.py) rolls batch after batch, drops groups whose
  rewards are all equal and stops once the batch is full or `max_batches` ran. Every rollout in
  a dropped group is spent and counted (`burned_rollouts`): it buys signal with compute.
- spo: SPO's prioritized sampling: a decayed Beta tracker per task, p = a / (a + b); tasks drawn
  without replacement with weight sqrt(p(1-p)) + floor. Departs from SPO: G samples per task
  (the pipeline's groups) instead of one, and a fixed decay rho (SPO adapts it to the policy's
  KL change, clipped to [0.875, 0.96]; no KL reaches the scheduler), with a Beta(1, 1) start
  instead of SPO's offline pilot estimate (no pilot rollouts here).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from rollwise.schedule.history import beta_mean, decayed
from rollwise.schedule.plan import Budget, make_plan, train_split


def plan_random(catalog: pd.DataFrame, history, budget: Budget, cfg=None) -> pd.DataFrame:
    """Uniform over the train split, without replacement within a round."""
    train = train_split(catalog)
    rng = np.random.default_rng(budget.seed)
    picked = rng.choice(len(train), size=min(budget.tasks, len(train)), replace=False)
    return make_plan(train.iloc[picked], budget, score=np.full(len(picked), 1.0 / len(train)),
                     reason="random")  # fmt: skip


def plan_band(catalog: pd.DataFrame, history, budget: Budget, cfg) -> pd.DataFrame:
    """In-band tasks first (random order), then untried ones, then the closest to the band."""
    train = train_split(catalog)
    stats = decayed(train["task_id"], history, budget.round, cfg.decay)
    n = stats["n"].to_numpy()
    rate = np.divide(stats["s"].to_numpy(), n, out=np.full(len(n), np.nan), where=n > 0)
    distance = np.clip(cfg.lo - rate, 0, None) + np.clip(rate - cfg.hi, 0, None)
    tier = np.where(n == 0, 1, np.where(distance == 0, 0, 2))
    order = np.lexsort((np.random.default_rng(budget.seed).random(len(n)),
                        np.nan_to_num(distance), tier))[: budget.tasks]  # fmt: skip
    names = np.array(["in band", "untried", "out of band"])
    reason = [f"{names[tier[i]]}: pass rate {rate[i]:.2f} over {n[i]:.1f} samples" for i in order]
    return make_plan(train.iloc[order], budget, score=-distance[order] - tier[order],
                     reason=reason, pass_rate=rate[order], tier=tier[order])  # fmt: skip


def plan_dapo(catalog: pd.DataFrame, history, budget: Budget, cfg) -> pd.DataFrame:
    """Candidate generation batches for dynamic sampling (history unused, as in DAPO)."""
    train = train_split(catalog)
    per_batch = max(math.ceil(cfg.oversample * budget.tasks), 1)
    size = min(per_batch * cfg.max_batches, len(train))
    order = np.random.default_rng(budget.seed).permutation(len(train))[:size]
    plan = make_plan(train.iloc[order], budget, score=np.zeros(size), reason="dynamic sampling")
    return plan.assign(batch=np.arange(size) // per_batch, drop_equal=True)


def plan_spo(catalog: pd.DataFrame, history, budget: Budget, cfg) -> pd.DataFrame:
    """Weighted draw without replacement, weight sqrt(p(1-p)) + floor."""
    train = train_split(catalog)
    stats = decayed(train["task_id"], history, budget.round, cfg.rho)
    p = beta_mean(stats["s"].to_numpy(), stats["n"].to_numpy())
    weight = np.sqrt(p * (1 - p)) + cfg.floor
    k = min(budget.tasks, len(train))
    picked = np.random.default_rng(budget.seed).choice(
        len(train), size=k, replace=False, p=weight / weight.sum()
    )
    reason = [f"weight sqrt(p(1-p)) + {cfg.floor}, p {p[i]:.2f}" for i in picked]
    return make_plan(train.iloc[picked], budget, score=weight[picked], reason=reason,
                     p=p[picked])  # fmt: skip
