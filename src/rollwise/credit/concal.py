"""ConCal: GiGPO with calibrated step values. Each turn visit is keyed by its incoming transition
(task group, depth, previous state, previous action, current state); walking backward, a visit's
value Q_k = r_k + gamma C_{k+1} pools with the other visits of its key: C_k = (1 - w) Q_k +
w mean_others(Q), w = min(cap, 1 - 1/n_key) (uncapped: the plain key mean); the calibrated Q
replace GiGPO's raw returns in the anchor clusters, and (episode_term: calibrated) the episode's
reward in A^E: each turn's outcome is its calibrated Q at gamma 1, so a later turn's luck no
longer splits earlier turns that took one action from one state. Departs from the seed in: the
key includes the depth (finite horizon), the pooled share is the capped empirical one, and A^E."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rollwise.credit.gigpo import combine
from rollwise.credit.turns import advantage_rows, turn_table


def transition_keys(turns: pd.DataFrame) -> pd.Series:
    """(group, depth, previous state, previous action, state); turn 0: (group, 0, start)."""
    prev_action = turns.groupby("episode_id")["action"].shift(1).fillna("")
    prev_state = turns.groupby("episode_id")["state"].shift(1).fillna("")
    parts = [turns["group"], turns["depth"], prev_state, prev_action, turns["state"]]
    return pd.Series(["\x1f".join(map(str, p)) for p in zip(*parts, strict=True)], turns.index)


def pool(own: pd.Series, cap: float) -> np.ndarray:
    """(1 - w) own + w mean of the key's other visits, w = min(cap, 1 - 1/n); a lone visit keeps
    its own value. The others' mean excludes the visit, so the cap bounds their real share."""
    by = own.groupby(level=0)
    n = by.transform("size").to_numpy(float)  # [n_d]
    total = by.transform("sum").to_numpy(float)  # [n_d]
    others = (total - own.to_numpy()) / np.maximum(n - 1.0, 1.0)  # [n_d]
    w = np.minimum(cap, 1.0 - 1.0 / n)  # [n_d] 0 when n == 1
    return (1.0 - w) * own.to_numpy() + w * others  # [n_d]


def calibrated_returns(turns: pd.DataFrame, gamma: float, cap: float) -> np.ndarray:
    """Q_k per turn from the calibrated continuation values, deepest turns first."""
    keys = transition_keys(turns)
    q = np.zeros(len(turns))  # [N] action values Q_k
    calibrated = np.zeros(len(turns))  # [N] C_k
    step = turns["step"].to_numpy()  # [N]
    row_of = {(ep, k): i for i, (ep, k) in enumerate(zip(turns["episode_id"], step, strict=True))}
    for depth in sorted(turns["depth"].unique(), reverse=True):
        at = np.flatnonzero(turns["depth"].to_numpy() == depth)  # [n_d] rows at this depth
        for i in at:
            j = row_of.get((turns["episode_id"].iat[i], step[i] + 1))
            q[i] = turns["reward"].iat[i] + (gamma * calibrated[j] if j is not None else 0.0)
        calibrated[at] = pool(pd.Series(q[at], index=keys.iloc[at].to_numpy()), cap)  # [n_d]
    return q


def concal(episodes: pd.DataFrame, steps: pd.DataFrame, cfg) -> pd.DataFrame:
    turns = turn_table(episodes, steps)
    q = calibrated_returns(turns, cfg.gigpo.gamma, cfg.concal.pool_cap)
    outcomes = None
    if cfg.concal.episode_term == "calibrated":  # each turn's outcome: its undiscounted Q
        outcomes = calibrated_returns(turns, 1.0, cfg.concal.pool_cap)
    return advantage_rows(turns, combine(episodes, turns, q, cfg, outcomes))
