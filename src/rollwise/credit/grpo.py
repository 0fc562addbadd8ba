"""GRPO: A_i = (R_i - mean_group R) / (std_group R + eps), copied to every policy turn.
With `std_norm: false` it is Dr.GRPO's unscaled A_i = R_i - mean_group R (Dr.GRPO's constant
token-sum divisor is a loss aggregation: train.loss). Departs from the paper only in using the
population std (ddof 0), so a two-sample group gives +-1, and in giving a singleton group 0."""

from __future__ import annotations

import pandas as pd

from rollwise.credit.turns import advantage_rows, per_episode, turn_table


def group_moments(episodes: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Each episode's task-group reward mean and population std (ddof 0)."""
    by_group = episodes.groupby("group")["reward"]
    return by_group.transform("mean"), by_group.transform(lambda r: r.std(ddof=0))


def group_advantages(episodes: pd.DataFrame, std_norm: bool, eps: float) -> pd.Series:
    """Per-episode advantage relative to its task group; an all-equal group gives zeros."""
    mean, std = group_moments(episodes)
    centred = episodes["reward"] - mean
    return centred / (std + eps) if std_norm else centred


def grpo(episodes: pd.DataFrame, steps: pd.DataFrame, cfg) -> pd.DataFrame:
    turns = turn_table(episodes, steps)
    advantage = group_advantages(episodes, cfg.std_norm, cfg.eps)
    return advantage_rows(turns, per_episode(turns, episodes, advantage))
