"""Credit assignment: one outcome reward split across the turns that earned it.

Every estimator has one signature, `(episodes, steps, cfg) -> advantages` (one row per episode
turn: episode_id, step, advantage, span_start, span_end), and is dispatched only from here."""

from rollwise.credit.grpo import grpo

ESTIMATORS = {"grpo": grpo}
