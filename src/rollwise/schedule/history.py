"""What past rounds observed, per task group, and the decayed trackers read from it.

The history is the scheduler state: rollout@r reads round r-1's (scheduler_state.json), appends
one row per group it rolled out, and writes it for rollout@r+1. Rows are kept per round, not
pre-summed, so every tracker is a pure function of (history, round, decay): a row `a` rounds old
weighs decay**a, which is a Beta tracker updated with decay each round.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

HISTORY_COLUMNS = [
    "round",
    "env_id",
    "task_id",
    "samples",
    "successes",
    "reward_sum",
    "reward_var",  # within-group (population) variance of the rubric reward
    "turns",  # mean turns per episode
    "tool_calls",  # mean tool calls per episode
    "partial",  # episodes with partial credit (0 < reward < 1)
    "timeouts",  # episodes cut by max_turns, max_tokens or the context
]
TIMEOUTS = ("max_turns", "max_tokens", "context")
STATE_VERSION = 1


def observe(episodes: pd.DataFrame, round_: int) -> pd.DataFrame:
    """One history row per task group in `episodes` (every rollout run, kept or burned)."""
    e = episodes.assign(
        partial=(episodes["reward"] > 0) & (episodes["reward"] < 1),
        timeout=episodes["termination"].isin(TIMEOUTS),
    )
    g = e.groupby("task_id", sort=True)
    out = pd.DataFrame(
        {
            "env_id": g["env_id"].first(),
            "samples": g.size(),
            "successes": g["success"].sum().astype(np.int64),
            "reward_sum": g["reward"].sum(),
            "reward_var": g["reward"].var(ddof=0).fillna(0.0),
            "turns": g["turns"].mean(),
            "tool_calls": g["tool_calls"].mean(),
            "partial": g["partial"].sum().astype(np.int64),
            "timeouts": g["timeout"].sum().astype(np.int64),
        }
    ).reset_index()
    return out.assign(round=int(round_))[HISTORY_COLUMNS]


def extend(history: pd.DataFrame | None, rows: pd.DataFrame) -> pd.DataFrame:
    if history is None or history.empty:
        return rows[HISTORY_COLUMNS].reset_index(drop=True)
    return pd.concat([history[HISTORY_COLUMNS], rows[HISTORY_COLUMNS]], ignore_index=True)


def to_state(history: pd.DataFrame | None, **meta) -> dict:
    """JSON-ready scheduler state: columns as lists (compact, diff-able)."""
    h = history if history is not None else pd.DataFrame(columns=HISTORY_COLUMNS)
    return {"version": STATE_VERSION, **meta, "history": h[HISTORY_COLUMNS].to_dict("list")}


def from_state(state: dict) -> pd.DataFrame | None:
    """The history in a state; None when nothing was observed yet (round 00's empty state)."""
    columns = state.get("history") or {}
    if not columns or not columns.get("task_id"):
        return None
    return pd.DataFrame(columns)[HISTORY_COLUMNS]


def decayed(
    task_ids: pd.Series, history: pd.DataFrame | None, round_: int, decay: float
) -> pd.DataFrame:
    """Decayed sums per task, aligned to `task_ids`: n (samples), s (successes), r (reward sum),
    q (samples x within-group variance), g (groups), turns, calls (episode totals), partial,
    timeouts. Zero where never observed."""
    cols = ["n", "s", "r", "q", "g", "turns", "calls", "partial", "timeouts"]
    if history is None or history.empty:
        return pd.DataFrame(0.0, index=pd.Index(task_ids, name="task_id"), columns=cols)
    h = history
    w = decay ** np.maximum(round_ - 1 - h["round"].to_numpy(), 0)
    n = w * h["samples"].to_numpy()
    parts = pd.DataFrame(
        {
            "task_id": h["task_id"].to_numpy(),
            "n": n,
            "s": w * h["successes"].to_numpy(),
            "r": w * h["reward_sum"].to_numpy(),
            "q": n * h["reward_var"].to_numpy(),
            "g": w,
            "turns": n * h["turns"].to_numpy(),
            "calls": n * h["tool_calls"].to_numpy(),
            "partial": w * h["partial"].to_numpy(),
            "timeouts": w * h["timeouts"].to_numpy(),
        }
    )
    sums = parts.groupby("task_id", sort=False).sum()
    return sums.reindex(pd.Index(task_ids, name="task_id"), fill_value=0.0)[cols]


def beta_mean(successes: np.ndarray, n: np.ndarray, prior: float = 1.0) -> np.ndarray:
    """Posterior mean of a Beta(prior, prior) tracker: 0.5 for a task never observed."""
    return (prior + successes) / (2 * prior + n)
