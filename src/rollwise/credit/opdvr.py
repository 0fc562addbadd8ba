"""OPDVR: sampled-token OPD's teacher log-ratio gated by the episode's verified success (ReLU:
>= 0 on a success, <= 0 on a failure) and added to credit.opd.base's advantages with no mixing
weight. The reward, the gate and their departures from the paper: credit/opd.py."""

from __future__ import annotations

import pandas as pd

from rollwise.credit.opd import base_advantages, token_rewards
from rollwise.credit.tokens import add_token_terms


def opdvr(episodes: pd.DataFrame, steps: pd.DataFrame, cfg) -> pd.DataFrame:
    base = base_advantages(episodes, steps, cfg, cfg.opd.base)
    return add_token_terms(base, token_rewards(episodes, gated=True))
