"""Credit assignment: one outcome reward split across the turns that earned it.

Every estimator has one signature, `(episodes, steps, cfg) -> advantages` (one row per episode
turn: episode_id, step, advantage, span_start, span_end; cfg is params' `credit` section), and is
dispatched only from here. spo and spo_pp read their task's tracker state from prior_* columns
(credit/tracker.py attach); without them every task is new."""

from rollwise.credit.concal import concal
from rollwise.credit.gigpo import gigpo
from rollwise.credit.grpo import grpo
from rollwise.credit.iapo import iapo
from rollwise.credit.rloo import rloo
from rollwise.credit.spo import spo
from rollwise.credit.spo_pp import spo_pp

ESTIMATORS = {
    "grpo": grpo,
    "rloo": rloo,
    "gigpo": gigpo,
    "concal": concal,
    "iapo": iapo,
    "spo": spo,
    "spo_pp": spo_pp,
}
