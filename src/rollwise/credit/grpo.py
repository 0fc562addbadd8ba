"""GRPO: A_i = (R_i - mean_group R) / (std_group R + eps), copied to every policy turn.
With `std_norm: false` it is Dr.GRPO's unscaled A_i = R_i - mean_group R (Dr.GRPO's constant
token-sum divisor is a loss aggregation: train.loss). Departs from the paper only in using the
population std (ddof 0), so a two-sample group gives +-1, and in giving a singleton group 0."""

from __future__ import annotations

import pandas as pd

from rollwise.credit.turns import advantage_rows, per_episode, turn_table


def group_advantages(episodes: pd.DataFrame, std_norm: bool, eps: float) -> pd.Series:
    """Per-episode advantage relative to its task group; an all-equal group gives zeros."""
    by_group = episodes.groupby("group")["reward"]
    centred = episodes["reward"] - by_group.transform("mean")
    if not std_norm:
        return centred
    return centred / (by_group.transform(lambda r: r.std(ddof=0)) + eps)


def grpo(episodes: pd.DataFrame, steps: pd.DataFrame, cfg) -> pd.DataFrame:
    turns = turn_table(episodes, steps)
    advantage = group_advantages(episodes, cfg.std_norm, cfg.eps)
    return advantage_rows(turns, per_episode(turns, episodes, advantage))
