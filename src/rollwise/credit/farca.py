"""FARCA: per-value fact checks (credit/facts.py: what is checked, how it is localized, how its
reliability is estimated) as token terms on credit.facts.base's advantages: coef * (+1 supported,
-1 not) * reliability on each asserted value's tokens (reliability 1 with `weighted: false`, the
unweighted baseline). The checks arrive as episodes.facts (credit/signals.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rollwise.credit.opd import base_advantages
from rollwise.credit.tokens import add_token_terms


def fact_terms(episodes: pd.DataFrame, cfg) -> dict[str, np.ndarray]:
    """Per-token terms: coef * (+1 supported, -1 not) * reliability (1 when not weighted) on
    each value's tokens, 0 elsewhere."""
    out = {}
    for ep in episodes.itertuples(index=False):
        term = np.zeros(len(ep.token_ids))
        for f in ep.facts:
            weight = f["reliability"] if cfg.weighted else 1.0
            sign = 1.0 if f["supported"] else -1.0
            term[f["span_start"] : f["span_end"]] += cfg.coef * weight * sign
        out[ep.episode_id] = term
    return out


def farca(episodes: pd.DataFrame, steps: pd.DataFrame, cfg) -> pd.DataFrame:
    if "facts" not in episodes:
        raise ValueError("farca needs episodes.facts: loop.credit checks them with the tokenizer")
    base = base_advantages(episodes, steps, cfg, cfg.facts.base)
    return add_token_terms(base, fact_terms(episodes, cfg.facts))
