"""The per-token advantage path: an optional `token_advantage` column on the advantage table.

Estimators give one advantage per turn, which the trainer copies to every token of the turn's
span. A token-level signal (OPD's teacher log-ratio, a fact check on one value's tokens) rides
alongside as one list per turn row, a value per token of the span, which the trainer adds to the
turn's advantage (train/trainer.py token_advantages); rows without one hold None."""

from __future__ import annotations

import numpy as np
import pandas as pd


def add_token_terms(advantages: pd.DataFrame, terms: dict[str, np.ndarray]) -> pd.DataFrame:
    """`advantages` with each episode's per-token term (an array aligned with its token_ids)
    sliced onto its turn rows and added to any token term they already carry."""
    old = advantages["token_advantage"] if "token_advantage" in advantages else None
    column = []
    for i, row in enumerate(advantages.itertuples(index=False)):
        prior = None if old is None else old.iloc[i]
        term = terms.get(row.episode_id)
        if term is None:
            column.append(prior)
            continue
        piece = np.asarray(term, float)[int(row.span_start) : int(row.span_end)]
        if prior is not None:
            piece = piece + np.asarray(prior, float)
        column.append(piece.tolist())
    return advantages.assign(token_advantage=column)


def token_term_metrics(advantages: pd.DataFrame) -> dict:
    """Mean |token term| over the tokens that carry one, and the share of turns that do."""
    if "token_advantage" not in advantages or advantages.empty:
        return {}
    carried = [np.asarray(t, float) for t in advantages["token_advantage"] if t is not None]
    values = np.concatenate(carried) if carried else np.zeros(0)
    return {
        "token_term_abs_mean": float(np.abs(values).mean()) if len(values) else 0.0,
        "turns_with_token_term": len(carried) / len(advantages),
    }
