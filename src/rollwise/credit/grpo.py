"""GRPO: A_i = (R_i - mean_group R) / (std_group R + eps), copied to every policy turn.
With `std_norm: false` it is Dr.GRPO's unscaled A_i = R_i - mean_group R."""

from __future__ import annotations

import pandas as pd


def group_advantages(episodes: pd.DataFrame, std_norm: bool, eps: float) -> pd.Series:
    """Per-episode advantage relative to its task group; an all-equal group gives zeros."""
    by_group = episodes.groupby("group")["reward"]
    centred = episodes["reward"] - by_group.transform("mean")
    if not std_norm:
        return centred
    return centred / (by_group.transform(lambda r: r.std(ddof=0)) + eps)


def grpo(episodes: pd.DataFrame, steps: pd.DataFrame, cfg) -> pd.DataFrame:
    advantage = group_advantages(episodes, cfg.std_norm, cfg.eps)
    rows = [
        {"episode_id": ep, "step": k, "advantage": float(a), "span_start": s, "span_end": e}
        for ep, a, spans in zip(
            episodes["episode_id"], advantage, episodes["turn_spans"], strict=True
        )
        for k, (s, e) in enumerate(spans)
    ]
    return pd.DataFrame(rows, columns=["episode_id", "step", "advantage", "span_start", "span_end"])
