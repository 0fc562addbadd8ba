"""Sampled-token on-policy distillation (OPD) and OPDVR, as token terms on any estimator.

OPD's implicit reward of a sampled token y_t is r_t = log pi_teacher(y_t | y_<t) - log
pi_student(y_t | y_<t): the student's log-prob is the rollout's own (episodes.logprobs), the
teacher's is scored on the same tokens through the policy backend (HFBackend.score; attached as
episodes.teacher_logprobs by credit/signals.py). OPDVR gates it by the episode's verified
success with a ReLU: max(r_t, 0) on a success, min(r_t, 0) on a failure, so distillation only
ever pushes the way the outcome does. Either term is added to the base estimator's
(credit.opd.base) turn advantage, token by token, with no mixing weight: no new knob. (opdvr's
estimator is credit/opdvr.py: one file per method.)

Departs from the paper in: the teacher is scored at the rollout's temperature without top-p (a
sampled token outside the teacher's nucleus would score -inf); tokens outside the policy's loss
mask get no term."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rollwise.credit.tokens import add_token_terms


def log_ratio(teacher, student, mask) -> np.ndarray:
    """Per token: log pi_teacher - log pi_student on the policy's tokens, 0 elsewhere."""
    mask = np.asarray(mask, bool)
    return np.where(mask, np.asarray(teacher, float) - np.asarray(student, float), 0.0)


def gate(reward: np.ndarray, success: bool) -> np.ndarray:
    """OPDVR's ReLU gate: only the non-negative part on a success, the non-positive on a
    failure."""
    return np.maximum(reward, 0.0) if success else np.minimum(reward, 0.0)


def token_rewards(episodes: pd.DataFrame, gated: bool) -> dict[str, np.ndarray]:
    """Each episode's per-token OPD (or, gated, OPDVR) reward, aligned with its token_ids."""
    if "teacher_logprobs" not in episodes:
        raise ValueError(
            "opd/opdvr need episodes.teacher_logprobs: set credit.opd.teacher to a policy folder "
            "(loop.credit scores it)"
        )
    out = {}
    for ep in episodes.itertuples(index=False):
        r = log_ratio(ep.teacher_logprobs, ep.logprobs, ep.loss_mask)
        out[ep.episode_id] = gate(r, bool(ep.success)) if gated else r
    return out


def base_advantages(episodes: pd.DataFrame, steps: pd.DataFrame, cfg, base: str) -> pd.DataFrame:
    from rollwise.credit import ESTIMATORS  # the one dispatch (it imports this module)

    return ESTIMATORS[base](episodes, steps, cfg)


def opd(episodes: pd.DataFrame, steps: pd.DataFrame, cfg) -> pd.DataFrame:
    base = base_advantages(episodes, steps, cfg, cfg.opd.base)
    return add_token_terms(base, token_rewards(episodes, gated=False))
