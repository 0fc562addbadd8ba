"""SPO++: SPO's tracker baseline, A = r - p, standardized under the action-token measure: each
episode weighs its count of policy tokens n_i in the mean and the variance, so the token-mean loss
sees sum n_i A_i = 0 and sum n_i A_i^2 / sum n_i = 1. Evidence is folded in per (task, policy
version) in version order, whatever order it arrived in (one decay per policy step; evidence from
a policy older than the tracker's is down-weighted by the same decay). Departs from the seed in:
the baseline of a stale episode is the tracker's current p (no per-version history is kept)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rollwise.credit.tracker import walk
from rollwise.credit.turns import advantage_rows, episode_tokens, per_episode, turn_table


def token_standardize(a: np.ndarray, n: np.ndarray, eps: float) -> np.ndarray:
    """(a - mu_n) / (sigma_n + eps) with token-weighted mean and population std."""
    total = n.sum()
    if total == 0:
        return np.zeros_like(a)
    mu = (n * a).sum() / total  # []
    sigma = np.sqrt((n * (a - mu) ** 2).sum() / total)  # []
    return (a - mu) / (sigma + eps)


def spo_pp(episodes: pd.DataFrame, steps: pd.DataFrame, cfg) -> pd.DataFrame:
    turns = turn_table(episodes, steps)
    baseline, _ = walk(episodes, cfg.spo, by_version=True)  # [E]
    a = episodes["reward"].to_numpy(float) - baseline  # [E]
    a = token_standardize(a, episode_tokens(episodes), cfg.eps)  # [E]
    return advantage_rows(turns, per_episode(turns, episodes, a))
