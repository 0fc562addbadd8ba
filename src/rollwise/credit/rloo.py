"""RLOO: A_i = R_i - mean of the other G-1 rewards of its task group = G/(G-1) (R_i - mean_g R),
copied to every policy turn. Departs from the paper only where G = 1: no leave-one-out baseline
exists, so the advantage is 0 (the paper assumes G >= 2)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rollwise.credit.turns import advantage_rows, per_episode, turn_table


def leave_one_out(episodes: pd.DataFrame) -> np.ndarray:
    """R_i minus the mean of its group mates' rewards; 0 for a singleton group."""
    by_group = episodes.groupby("group")["reward"]
    n = by_group.transform("size").to_numpy(float)  # [E]
    total = by_group.transform("sum").to_numpy(float)  # [E]
    r = episodes["reward"].to_numpy(float)  # [E]
    others = np.divide(total - r, n - 1, out=r.copy(), where=n > 1)  # [E]; singleton: itself
    return r - others


def rloo(episodes: pd.DataFrame, steps: pd.DataFrame, cfg) -> pd.DataFrame:
    turns = turn_table(episodes, steps)
    return advantage_rows(turns, per_episode(turns, episodes, leave_one_out(episodes)))
