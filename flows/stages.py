"""The Prefect tasks of the pipeline flow and the scheduler that runs dvc.yaml's DAG with them.

Each stage is one Prefect task run (named like DVC's stage: `rollout@01`) around
`tasks.<stage>.run`, brought up to date through DVC (skip, restore from the run-cache, or run
here and record in dvc.lock). `run_stages` submits a stage once its upstream stages in DVC's own
graph are done, so stages overlap exactly where their data allows (rollout.policy_lag 1).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from flows.retries import RETRIES, RETRY_DELAYS_S, retry_if_transient
from flows.workspace import DvcStages, inside
from rollwise.config import Params
from tasks import credit, curate, evaluate, generate, rollout, train, warmstart
from tasks.common import recorded_metrics, timed_stage


def stage_task(name: str, run: Callable[..., dict], per_round: bool = False):
    """A Prefect task around `tasks.<name>.run`, brought up to date through DVC (skip, restore
    from the run-cache, or run here and record in dvc.lock)."""

    def stage(params: Params, stages: DvcStages, r: str | None = None) -> dict:
        label = f"{name}@{r}" if per_round else name
        root = stages.root
        found: dict = {}

        def compute() -> None:
            found.update(timed_stage(name, run, params, root, r if per_round else None))

        how = stages.run(label, compute)
        metrics = found or recorded_metrics(root, params, label)
        logger = get_run_logger()
        logger.info("%s %s; metrics: %s", label, how, json.dumps(metrics, default=float))
        return {**metrics, "dvc": how}

    stage.__name__ = stage.__qualname__ = name  # distinct Prefect task keys per stage
    return task(
        name=name,
        task_run_name=f"{name}@{{r}}" if per_round else name,
        retries=RETRIES,
        retry_delay_seconds=RETRY_DELAYS_S,
        retry_condition_fn=retry_if_transient,
        log_prints=True,
        cache_policy=NO_CACHE,  # what is stale is DVC's call, not Prefect's cache
        persist_result=False,
    )(stage)


generate_stage = stage_task("generate", generate.run)
warmstart_stage = stage_task("warmstart", warmstart.run)
rollout_stage = stage_task("rollout", rollout.run, per_round=True)
curate_stage = stage_task("curate", curate.run, per_round=True)
credit_stage = stage_task("credit", credit.run, per_round=True)
train_stage = stage_task("train", train.run, per_round=True)
evaluate_stage = stage_task("evaluate", evaluate.run)
PER_ROUND = (rollout_stage, curate_stage, credit_stage, train_stage)


def stage_order(params: Params) -> list[tuple[Any, str | None]]:
    """dvc.yaml's stages in DAG order, as (task, round or None)."""
    rounds = [(stage, r) for r in params.rounds for stage in PER_ROUND]
    return [(generate_stage, None), (warmstart_stage, None), *rounds, (evaluate_stage, None)]


def label(stage, r: str | None) -> str:
    return stage.name if r is None else f"{stage.name}@{r}"


def run_stages(params: Params, stages: DvcStages) -> dict[str, dict]:
    """The DAG of dvc.yaml; returns each stage's metrics by stage name, in DAG order.

    A stage is submitted (a Prefect task run on the flow's thread pool) once its upstream stages
    in DVC's own graph are done, so stages run at once exactly where their data allows: the
    off-policy lag of rollout.policy_lag is in the data dependencies, nothing here knows of it.
    The process stays in the worktree throughout (DvcStages: one working directory for every
    thread). After a failure nothing new starts; the running stages finish, then it raises."""
    from prefect.futures import as_completed

    order = {label(stage, r): (stage, r) for stage, r in stage_order(params)}
    upstream = {name: deps & order.keys() for name, deps in stages.upstream().items()}
    waiting, running, results = list(order), {}, {}
    failure: BaseException | None = None
    with inside(stages.root):
        while running or (waiting and failure is None):
            unfinished = set(waiting) | running.keys()
            ready = [n for n in waiting if not upstream.get(n, set()) & unfinished]
            for name in ready if failure is None else []:
                stage, r = order[name]
                args = (params, stages) if r is None else (params, stages, r)
                running[name] = stage.submit(*args)
                waiting.remove(name)
            future = next(as_completed(list(running.values())))
            name = next(n for n, f in running.items() if f is future)
            del running[name]
            try:
                results[name] = future.result()
            except BaseException as e:  # noqa: BLE001 - raised once the running ones finish
                failure = failure or e
                continue
            flow_progress(len(results), len(order))
    if failure is not None:
        raise failure
    return {name: results[name] for name in order}


_PROGRESS_IDS: dict[str, Any] = {}  # flow run id -> its progress artifact


def flow_progress(done: int, total: int) -> None:
    """The flow run's progress artifact (stages done of dvc.yaml's DAG), shown in the UI."""
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    key, percent = str(flow_run.id), 100 * done / total
    with contextlib.suppress(Exception):  # progress is a courtesy, never a failure
        if key in _PROGRESS_IDS:
            update_progress_artifact(_PROGRESS_IDS[key], percent)
        else:
            _PROGRESS_IDS[key] = create_progress_artifact(percent, description="stages done")


def log_progress_to_prefect(stage: str, done: int, total: int) -> None:
    """A tasks.common progress sink: long stages' progress in the task run's logs."""
    with contextlib.suppress(Exception):
        get_run_logger().info("%s progress %d/%d", stage, done, total)
