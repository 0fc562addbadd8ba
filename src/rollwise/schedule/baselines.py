"""Baseline schedulers. Pure: the plan depends only on (catalog, history, budget, seed)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def plan_random(
    catalog: pd.DataFrame, history: pd.DataFrame | None, n_tasks: int, n_samples: int, seed: int
) -> pd.DataFrame:
    """Uniform over the train split, without replacement within a round."""
    train = catalog[catalog["split"] == "train"]
    rng = np.random.default_rng(seed)
    picked = train.iloc[rng.choice(len(train), size=min(n_tasks, len(train)), replace=False)]
    return pd.DataFrame(
        {
            "env_id": picked["env_id"].to_numpy(),
            "task_id": picked["task_id"].to_numpy(),
            "n_samples": n_samples,
            "score": 1.0 / len(train),
            "reason": "random",
        }
    )
