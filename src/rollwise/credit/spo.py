"""SPO (single-stream policy optimization): no sibling group; a persistent per-task Beta tracker
(credit/tracker.py) gives the baseline p, A = r - p before the update, then A is standardized over
the batch and copied to every turn. Departs from the paper in: an unseen task starts from a prior
(prior_p, prior_n) instead of n0 warm-up samples; D is the trainer's per-round approx KL summed
since the task's last update (not a per-prompt KL); several samples of one task in a batch update
the tracker one by one in arrival order; the sqrt(p(1-p)) + 0.05 task sampling is not done here."""

from __future__ import annotations

import pandas as pd

from rollwise.credit.tracker import walk
from rollwise.credit.turns import advantage_rows, per_episode, turn_table


def spo(episodes: pd.DataFrame, steps: pd.DataFrame, cfg) -> pd.DataFrame:
    turns = turn_table(episodes, steps)
    baseline, _ = walk(episodes, cfg.spo, by_version=False)  # [E]
    a = episodes["reward"].to_numpy(float) - baseline  # [E]
    a = (a - a.mean()) / (a.std() + cfg.eps) if len(a) else a  # [E] batch-standardized
    return advantage_rows(turns, per_episode(turns, episodes, a))
