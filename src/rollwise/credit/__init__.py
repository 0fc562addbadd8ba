"""Credit assignment: one outcome reward split across the turns that earned it.

Every estimator has one signature, `(episodes, steps, cfg) -> advantages` (one row per episode
turn: episode_id, step, advantage, span_start, span_end; cfg is params' `credit` section), and is
dispatched only from here. spo and spo_pp read their task's tracker state from prior_* columns
(credit/tracker.py attach); without them every task is new. opd, opdvr and farca read the
columns credit/signals.py attaches and add a per-token term (`token_advantage`: credit/tokens.py)
to a base estimator's advantages.

`credit.reward` picks what the estimators see as an episode's reward (TRAINED_REWARDS): the
rubric's weighted partial credit, or task success alone (the RL probe learned more from success
at the same budget: README "Where it stands")."""

import pandas as pd

from rollwise.credit.concal import concal
from rollwise.credit.cosir import cosir
from rollwise.credit.farca import farca
from rollwise.credit.gigpo import gigpo
from rollwise.credit.grpo import grpo
from rollwise.credit.iapo import iapo
from rollwise.credit.opd import opd
from rollwise.credit.opdvr import opdvr
from rollwise.credit.raft import raft
from rollwise.credit.rloo import rloo
from rollwise.credit.spo import spo
from rollwise.credit.spo_pp import spo_pp

TRAINED_REWARDS = {
    "rubric": lambda episodes: episodes["reward"].astype(float),
    "success": lambda episodes: episodes["success"].astype(float),
}


def trained_reward(episodes: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The episodes with `reward` replaced by the reward credit assignment trains on."""
    return episodes.assign(reward=TRAINED_REWARDS[kind](episodes))


ESTIMATORS = {
    "grpo": grpo,
    "rloo": rloo,
    "gigpo": gigpo,
    "concal": concal,
    "iapo": iapo,
    "spo": spo,
    "spo_pp": spo_pp,
    "raft": raft,  # SFT on the round's own verified successes (credit/raft.py)
    "cosir": cosir,  # team episodes only (credit/cosir.py)
    "opd": opd,  # token terms on a base estimator (opd.py, opdvr.py, farca.py; inputs: signals.py)
    "opdvr": opdvr,
    "farca": farca,
}
