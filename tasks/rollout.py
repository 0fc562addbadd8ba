"""Stage `rollout@NN`: schedule tasks, sample G episodes each with policy round NN-1 (with
`rollout.policy_lag: 1`, round max(NN-2, 0): the round's `policy` in params' `rounds`, so that
the flow can run this stage while train@NN-1 trains; train@NN corrects the lag by TIS).

Reads the scheduler state of round NN-1, the round's `start` (data/rollouts/round_{NN-1}/
scheduler_state.json: what earlier rounds observed; round 00's, empty, comes with the warm
start). Writes data/rollouts/round_NN/: plan.parquet (what was scheduled and why, what ran
and was kept, policy_round: the checkpoint sampled with), episodes.parquet and steps.parquet
(the kept groups: the training batch), scheduler_state.json (the history with this round's
groups appended, every group run, kept or burned), and audit.parquet: one row per episode
run, with the faults injected into it (engine.audit_row; ground truth for tests and benches,
which the curator never reads).
A damaged upstream file (suite, scheduler state, quarantine, checkpoint) fails naming it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rollwise.config import Params
from rollwise.envs.faults import AUDIT_FILE
from rollwise.schedule import SCHEDULERS
from rollwise.schedule.history import extend, from_state, observe, to_state
from rollwise.schedule.plan import Budget, execute_plan, plan_metrics, timed
from rollwise.types import STEP_COLUMNS
from tasks.common import (
    atomic_dir,
    corrupt,
    envs_dir,
    load_checkpoint,
    log,
    model_dir,
    read_json,
    read_suite,
    read_table,
    require,
    round_dir,
    stage_main,
    write_json,
)


def run(params: Params, root: Path, r: str) -> dict:
    from rollwise.rollout.cost import episode_costs
    from rollwise.rollout.engine import AUDIT_COLUMNS, EpisodeSpec, Limits, audit_row, clone_env
    from rollwise.rollout.executors import EXECUTORS

    prev, policy = params.rounds[r].start, params.rounds[r].policy
    suite_dir = require(envs_dir(root), "generate")
    suite = read_suite(suite_dir)
    policy_dir = require(model_dir(root, policy), stage_of_model(policy))
    cfg, seed = params.rollout, params.schedule.seed * 1000 + int(r)
    state = require(
        round_dir(root, "rollouts", prev) / "scheduler_state.json", stage_of_state(prev)
    )
    history = read_history(state, stage_of_state(prev))
    budget = Budget(params.schedule.tasks_per_round, cfg.samples_per_task, int(r), seed)
    method = params.schedule.method
    knobs = getattr(params.schedule, method, None)  # the method's own section; random has none
    quarantine = read_table(
        round_dir(root, "curated", prev) / "quarantine.parquet", stage_of_state(prev, "curate")
    )
    catalog = schedulable(suite.catalog, quarantine)
    plan, schedule_s = timed(SCHEDULERS[method], catalog, history, budget, knobs)
    demos, too_long = opening_demonstrations(params, root, prev, suite, plan, policy_dir)
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
        f"{method}: {budget.tasks} tasks x {cfg.samples_per_task} samples, policy round {policy}, "
        f"executor {cfg.executor}, backend {cfg.backend}",
    )
    steps: list[dict] = []
    audit: list[dict] = []  # every episode run, burned ones too

    def run_batch(rows: pd.DataFrame) -> pd.DataFrame:
        """Episodes of some plan rows (one call for a static plan; DAPO calls it per batch)."""
        specs = [
            EpisodeSpec(
                f"r{r}/{task_id}/s{k}",
                suite.tasks[task_id],
                demonstrated(clone_env(suite.envs[suite.tasks[task_id].env_id]), demos, task_id),
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
            load=lambda: load_checkpoint(policy_dir, stage_of_model(policy)),  # local: in memory
        )
        steps.extend(batch_steps)
        audit.extend(audit_row(e) for e in episodes)
        return pd.DataFrame(episodes)

    executed, ran = execute_plan(plan, run_batch, budget.tasks)
    ran = ran.assign(round=int(r), policy_version=int(policy))
    ran["cost"] = episode_costs(ran, cfg.cost)
    # The training batch is the kept groups; every rollout run (burned ones too) is spent,
    # costed and observed by the scheduler.
    episodes = ran[ran["task_id"].isin(executed.loc[executed["kept"], "task_id"])]
    steps_table = pd.DataFrame(steps, columns=STEP_COLUMNS)
    steps_table = steps_table[steps_table["episode_id"].isin(episodes["episode_id"])]
    history = extend(history, observe(ran, int(r)))
    with atomic_dir(round_dir(root, "rollouts", r)) as out:
        executed.assign(round=int(r), policy_round=int(policy)).to_parquet(out / "plan.parquet")
        episodes.reset_index(drop=True).to_parquet(out / "episodes.parquet")
        steps_table.reset_index(drop=True).to_parquet(out / "steps.parquet")
        pd.DataFrame(audit, columns=AUDIT_COLUMNS).to_parquet(out / AUDIT_FILE)
        write_json(out / "scheduler_state.json", to_state(history, method=method, round=int(r)))
    return {
        **rollout_metrics(ran),
        **plan_metrics(executed),
        "episodes_kept": len(episodes),
        "schedule_s": schedule_s,
        "demonstrated_tasks": len(demos),
        "demonstrations_skipped_context": len(too_long),
        "policy_round": int(policy),  # the checkpoint sampled with
        "policy_lag": int(prev) - int(policy),  # versions behind the one train@r updates
    }


def opening_demonstrations(params: Params, root: Path, prev: str, suite, plan, policy_dir: Path):
    """With `curate.demonstrations`, the best banked success (bank of round prev) of each planned
    task as demonstration messages, and the tasks whose demonstration would overflow the
    context (skipped). Ray workers get them with each spec row (executors.spec_row)."""
    from rollwise.curate.success_bank import demonstrations
    from rollwise.policy.build import load_tokenizer

    if not params.curate.demonstrations:
        return {}, []
    bank_file = round_dir(root, "curated", prev) / "success_bank.parquet"
    bank = read_table(bank_file, stage_of_state(prev, "curate"))
    tasks = [suite.tasks[t] for t in plan["task_id"]]
    reply = params.rollout.max_new_tokens
    tok = load_tokenizer(policy_dir)
    return demonstrations(bank, tasks, suite.envs, tok, params.policy.max_context, reply)


def demonstrated(env, demos: dict, task_id: str):
    """The episode's environment, opening with the task's demonstration when it has one."""
    from rollwise.curate.success_bank import Demonstrated

    return Demonstrated(env, demos[task_id]) if task_id in demos else env


def read_history(path: Path, stage: str) -> pd.DataFrame | None:
    """The scheduler's history in a state file; unreadable or of the wrong shape, the error
    names the file and the stage that writes it."""
    state = read_json(path, stage)
    try:
        return from_state(state)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise corrupt(path, stage, e) from e


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
