"""Keep or drop each episode, with the reason and its evidence. For now one cause is attributed:
a failure the environment caused (reset/step/verify raised, or a tool hung) is not the policy's."""

from __future__ import annotations

import json

import pandas as pd


def decide(episodes: pd.DataFrame, cfg) -> pd.DataFrame:
    env_failed = (episodes["env_errors"] > 0) & ~episodes["success"]
    drop = env_failed & cfg.drop_env_errors
    evidence = [
        json.dumps({"env_errors": int(n), "termination": t})
        for n, t in zip(episodes["env_errors"], episodes["termination"], strict=True)
    ]
    return pd.DataFrame(
        {
            "episode_id": episodes["episode_id"],
            "kept": ~drop,
            "reason": ["environment_error" if d else "policy" for d in drop],
            "evidence": evidence,
        }
    )


def success_bank(episodes: pd.DataFrame) -> pd.DataFrame:
    """Verified successes per task, kept for retrieval when the task is scheduled again."""
    ok = episodes[episodes["success"]]
    return ok[["task_id", "episode_id", "round", "reward", "token_ids", "prompt_len"]]
