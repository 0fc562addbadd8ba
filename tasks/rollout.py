"""Stage `rollout@NN`: schedule tasks, sample G episodes each with policy round NN-1.

Reads the scheduler state of round NN-1 (data/rollouts/round_{NN-1}/scheduler_state.json: what
earlier rounds observed; round 00's, empty, comes with the warm start). Writes
data/rollouts/round_NN/: plan.parquet (what was scheduled and why, what ran and was kept),
episodes.parquet and steps.parquet (the kept groups: the training batch), scheduler_state.json
(the history with this round's groups appended, every group run, kept or burned)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from rollwise.config import Params
from rollwise.envs.runtime import load_suite
from rollwise.schedule import SCHEDULERS
from rollwise.schedule.history import extend, from_state, observe, to_state
from rollwise.schedule.plan import Budget, execute_plan, plan_metrics, timed
from rollwise.types import STEP_COLUMNS
from tasks.common import (
    atomic_dir,
    envs_dir,
    load_checkpoint,
    log,
    model_dir,
    read_table,
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
    state = require(
        round_dir(root, "rollouts", prev) / "scheduler_state.json", stage_of_state(prev)
    )
    history = from_state(json.loads(state.read_text()))
    budget = Budget(params.schedule.tasks_per_round, cfg.samples_per_task, int(r), seed)
    method = params.schedule.method
    knobs = getattr(params.schedule, method, None)  # the method's own section; random has none
    quarantine = read_table(
        round_dir(root, "curated", prev) / "quarantine.parquet", stage_of_state(prev, "curate")
    )
    catalog = schedulable(suite.catalog, quarantine)
    plan, schedule_s = timed(SCHEDULERS[method], catalog, history, budget, knobs)
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
        f"{method}: {budget.tasks} tasks x {cfg.samples_per_task} samples, policy round {prev}, "
        f"executor {cfg.executor}, backend {cfg.backend}",
    )
    steps: list[dict] = []

    def run_batch(rows: pd.DataFrame) -> pd.DataFrame:
        """Episodes of some plan rows (one call for a static plan; DAPO calls it per batch)."""
        specs = [
            EpisodeSpec(
                f"r{r}/{task_id}/s{k}",
                suite.tasks[task_id],
                clone_env(suite.envs[suite.tasks[task_id].env_id]),
                group=task_id,
                sample=k,
                seed=cfg.seed * 100000 + int(r) * 1000 + k,
            )
            for task_id, n in zip(rows["task_id"], rows["n_samples"], strict=True)
            for k in range(n)
        ]
        episodes, batch_steps = EXECUTORS[cfg.executor](
            specs,
            policy_dir,
            suite_dir,
            limits,
            cfg,
            load=lambda: load_checkpoint(policy_dir, stage_of_model(prev)),  # local: loaded model
        )
        steps.extend(batch_steps)
        return pd.DataFrame(episodes)

    executed, ran = execute_plan(plan, run_batch, budget.tasks)
    ran = ran.assign(round=int(r), policy_version=int(prev))
    ran["cost"] = episode_costs(ran, cfg.cost)
    # The training batch is the kept groups; every rollout run (burned ones too) is spent,
    # costed and observed by the scheduler.
    episodes = ran[ran["task_id"].isin(executed.loc[executed["kept"], "task_id"])]
    steps_table = pd.DataFrame(steps, columns=STEP_COLUMNS)
    steps_table = steps_table[steps_table["episode_id"].isin(episodes["episode_id"])]
    history = extend(history, observe(ran, int(r)))
    with atomic_dir(round_dir(root, "rollouts", r)) as out:
        executed.assign(round=int(r)).to_parquet(out / "plan.parquet")
        episodes.reset_index(drop=True).to_parquet(out / "episodes.parquet")
        steps_table.reset_index(drop=True).to_parquet(out / "steps.parquet")
        write_json(out / "scheduler_state.json", to_state(history, method=method, round=int(r)))
    return {
        **rollout_metrics(ran),
        **plan_metrics(executed),
        "episodes_kept": len(episodes),
        "schedule_s": schedule_s,
    }


def stage_of_model(r: str) -> str:
    return "warmstart" if r == "00" else f"train@{r}"


def stage_of_state(r: str, stage: str = "rollout") -> str:
    """Round 00's (empty) scheduler and curator states come with the warm start."""
    return "warmstart" if r == "00" else f"{stage}@{r}"


def schedulable(catalog: pd.DataFrame, quarantine: pd.DataFrame) -> pd.DataFrame:
    """The catalog minus the tasks the curator quarantined last round (their failures were not
    the policy's; they sit out until the evidence changes)."""
    return catalog[~catalog["task_id"].isin(set(quarantine["task_id"]))]


def rollout_metrics(episodes: pd.DataFrame) -> dict:
    """Per-round numbers for MLflow (step = round) and the summary table, over every rollout
    run (`episodes` is rollouts spent, burned ones included); `cost` is the round's rollout cost
    (rollout/cost.py)."""
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
