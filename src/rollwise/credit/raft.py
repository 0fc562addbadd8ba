"""RAFT (Dong et al. 2023, Reward rAnked FineTuning; also ReST / rejection-sampling fine-tuning):
every turn of a verified successful episode gets advantage 1, every other turn 0. The trainer
drops all-zero episodes, so a round's PPO step is supervised fine-tuning on the policy's own
successes on fresh tasks (at ratio 1 the clipped objective's gradient is the NLL's). No group
baseline: a group whose samples all succeed still teaches, where GRPO gives it zero; failures
teach nothing. Uses `success`, not the trained reward, so a partial rubric score is no demo."""

from __future__ import annotations

import pandas as pd

from rollwise.credit.turns import advantage_rows, per_episode, turn_table


def raft(episodes: pd.DataFrame, steps: pd.DataFrame, cfg) -> pd.DataFrame:
    turns = turn_table(episodes, steps)
    success = episodes["success"].astype(float)  # [E] 1 verified success, else 0
    return advantage_rows(turns, per_episode(turns, episodes, success))
