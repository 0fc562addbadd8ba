"""Full evaluation: every candidate on every held-out task, greedy, one episode per cell."""

from __future__ import annotations

import hashlib
import json
import math

import pandas as pd

from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes
from rollwise.types import Task


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a success rate (sane at 0% and 100%)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def evaluation_tasks(suite, split: str, max_tasks: int) -> list[Task]:
    """Up to `max_tasks` of a split, spread over every environment: ordered by a hash of the
    task id (stable across runs and machines), not by environment, so a cap never means "the
    first few environments only"."""
    tasks = sorted(suite.split(split), key=lambda t: hashlib.sha256(t.task_id.encode()).hexdigest())
    return tasks[:max_tasks]


def evaluate_policy(
    backend, tokenizer, suite, tasks: list[Task], limits: Limits, env_of=None
) -> pd.DataFrame:
    """One greedy episode per task; rows as the rollout engine writes them. `env_of(env, env_id)`:
    the episode's environment as a round's rollout would wrap it (loop.remembering)."""
    wrap = env_of or (lambda env, env_id: env)
    specs = [
        EpisodeSpec(
            f"eval/{t.task_id}", t, wrap(clone_env(suite.envs[t.env_id]), t.env_id), group=t.task_id
        )  # fmt: skip
        for t in tasks
    ]
    episodes, _ = run_episodes(specs, backend, tokenizer, limits)
    return pd.DataFrame(episodes)


def summarize(episodes: pd.DataFrame) -> dict[str, float]:
    """Success rate with its 95% interval, mean reward, and each rubric criterion's mean."""
    n, k = len(episodes), int(episodes["success"].sum())
    lo, hi = wilson(k, n)
    criteria = pd.json_normalize(episodes["rubric"].map(json.loads)).mean().to_dict()
    return {
        "n": n,
        "success": k / max(n, 1),
        "success_lo": lo,
        "success_hi": hi,
        "reward": float(episodes["reward"].mean()),
        **{f"criterion_{c}": float(v) for c, v in criteria.items()},
    }
