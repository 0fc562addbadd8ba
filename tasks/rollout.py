"""Stage `rollout@NN`: schedule tasks, sample G episodes each with policy round NN-1.

Writes data/rollouts/round_NN/: plan.parquet (what was scheduled and why), episodes.parquet,
steps.parquet, scheduler_state.json."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rollwise.config import Params
from rollwise.envs.runtime import load_suite
from rollwise.schedule import SCHEDULERS
from rollwise.types import STEP_COLUMNS
from tasks.common import (
    atomic_dir,
    envs_dir,
    load_checkpoint,
    log,
    model_dir,
    require,
    round_dir,
    stage_main,
    write_json,
)


def run(params: Params, root: Path, r: str) -> dict:
    from rollwise.rollout.cost import episode_costs
    from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env
    from rollwise.rollout.executors import EXECUTORS

    prev = params.rounds[r]
    suite_dir = require(envs_dir(root), "generate")
    suite = load_suite(suite_dir)
    policy_dir = require(model_dir(root, prev), stage_of_model(prev))
    cfg, seed = params.rollout, params.schedule.seed * 1000 + int(r)
    plan = SCHEDULERS[params.schedule.method](
        suite.catalog, None, params.schedule.tasks_per_round, cfg.samples_per_task, seed
    )
    specs = [
        EpisodeSpec(
            f"r{r}/{task_id}/s{k}",
            suite.tasks[task_id],
            clone_env(suite.envs[suite.tasks[task_id].env_id]),
            group=task_id,
            sample=k,
            seed=cfg.seed * 100000 + int(r) * 1000 + k,
        )
        for task_id, n in zip(plan["task_id"], plan["n_samples"], strict=True)
        for k in range(n)
    ]
    limits = Limits(
        max_turns=cfg.max_turns,
        max_new_tokens=cfg.max_new_tokens,
        max_context=params.policy.max_context,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        tool_timeout_s=cfg.tool_timeout_s,
        batch_size=cfg.batch_size,
        seed=seed,
    )
    log(
        f"rollout@{r}",
        f"{len(plan)} tasks x {cfg.samples_per_task} samples, policy round {prev}, "
        f"executor {cfg.executor}, backend {cfg.backend}",
    )
    episodes, steps = EXECUTORS[cfg.executor](
        specs,
        policy_dir,
        suite_dir,
        limits,
        cfg,
        load=lambda: load_checkpoint(policy_dir, stage_of_model(prev)),  # local: the loaded model
    )
    episodes = pd.DataFrame(episodes).assign(round=int(r), policy_version=int(prev))
    episodes["cost"] = episode_costs(episodes, cfg.cost)
    with atomic_dir(round_dir(root, "rollouts", r)) as out:
        plan.assign(round=int(r)).to_parquet(out / "plan.parquet")
        episodes.to_parquet(out / "episodes.parquet")
        pd.DataFrame(steps, columns=STEP_COLUMNS).to_parquet(out / "steps.parquet")
        write_json(out / "scheduler_state.json", {"method": params.schedule.method, "seed": seed})
    return rollout_metrics(episodes)


def stage_of_model(r: str) -> str:
    return "warmstart" if r == "00" else f"train@{r}"


def rollout_metrics(episodes: pd.DataFrame) -> dict:
    """Per-round numbers for MLflow (step = round) and the summary table; `cost` is the
    round's rollout cost (rollout/cost.py)."""
    group_std = episodes.groupby("group")["reward"].std(ddof=0)
    sums = episodes[
        [
            "prompt_tokens",
            "generated_tokens",
            "tool_calls",
            "tool_errors",
            "env_errors",
            "verifier_calls",
        ]
    ].sum()
    return {
        "episodes": len(episodes),
        "reward_mean": float(episodes["reward"].mean()),
        "success_rate": float(episodes["success"].mean()),
        "zero_variance_groups": float((group_std < 1e-9).mean()),
        **{k: int(v) for k, v in sums.items()},
        "cost": float(episodes["cost"].sum()),
    }


def main() -> None:
    stage_main("rollout", run, with_round=True)


if __name__ == "__main__":
    main()
