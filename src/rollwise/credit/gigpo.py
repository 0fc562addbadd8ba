"""GiGPO (Feng et al. 2025, verl-agent): A = A^E + omega A^S. A^E is GRPO over the task group;
A^S normalizes each turn's discounted return R_k = gamma^(T-1-k) R within its anchor cluster (same
task group, same environment state when the turn began). Departs from verl-agent in: anchors are
the environment's fingerprint (turns/state keys), not the observation text; singleton clusters
give 0 (verl-agent passes the raw return through); std is the population std (ddof 0)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rollwise.credit.grpo import group_advantages, group_moments
from rollwise.credit.turns import advantage_rows, cluster_normalize, per_episode, turn_table


def step_returns(turns: pd.DataFrame, gamma: float) -> np.ndarray:
    """R_k = r_k + gamma R_{k+1}; with the outcome on the last turn, gamma^(T-1-k) R."""
    n_turns = turns.groupby("episode_id")["step"].transform("size").to_numpy()  # [N]
    outcome = turns.groupby("episode_id")["reward"].transform("sum").to_numpy(float)  # [N]
    return outcome * gamma ** (n_turns - 1 - turns["step"].to_numpy())  # [N]


def anchor_keys(turns: pd.DataFrame) -> pd.Series:
    """The anchor cluster of each turn: (task group, state when the turn began)."""
    return turns["group"].astype(str) + "|" + turns["state"].astype(str)


def combine(
    episodes: pd.DataFrame,
    turns: pd.DataFrame,
    returns: np.ndarray,
    cfg,
    outcomes: np.ndarray | None = None,
) -> np.ndarray:
    """A^E + omega A^S for per-turn returns (GiGPO's raw ones, or ConCal's calibrated ones).
    `outcomes` (per turn) replaces each turn's episode reward in A^E; the group's mean and std
    stay those of its rewards."""
    g = cfg.gigpo
    std_norm = g.norm == "mean_std_norm"
    if outcomes is None:
        episode = per_episode(turns, episodes, group_advantages(episodes, std_norm, cfg.eps))
    else:
        mean, std = (per_episode(turns, episodes, m) for m in group_moments(episodes))  # [N] each
        episode = (outcomes - mean) / (std + cfg.eps) if std_norm else outcomes - mean  # [N]
    step = cluster_normalize(returns, anchor_keys(turns), std_norm, cfg.eps)
    return episode + g.omega * step


def gigpo(episodes: pd.DataFrame, steps: pd.DataFrame, cfg) -> pd.DataFrame:
    turns = turn_table(episodes, steps)
    returns = step_returns(turns, cfg.gigpo.gamma)  # [N]
    return advantage_rows(turns, combine(episodes, turns, returns, cfg))
