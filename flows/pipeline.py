"""The Prefect flows `rollwise-pipeline` (everything) and `rollwise-evaluate` (evaluation alone).

generate -> warmstart -> (rollout@r -> curate@r -> credit@r -> train@r for each round r) ->
evaluate: every stage of dvc.yaml, in one process, so a model stays loaded across stages. Each
stage is one Prefect task run (named like DVC's stage: `rollout@01`) that starts when its
upstream stages in dvc.yaml's graph are done. With `rollout.policy_lag: 0` that graph is one
chain; with 1, rollout@r+1 samples with round r-1's checkpoint, so it and curate@r+1 run while
credit@r and train@r do (two threads; `dvc repro` runs the same graph one stage at a time).

How a flow run relates to DVC and the workspace (design.md §2, Orchestration; flows/workspace.py):
- Overrides are checked against the params schema before any stage runs; a bad key fails the
  flow run at once with the key path in the message.
- The run is its own experiment: a git worktree `.rollwise/runs/<name>/` on branch
  `rollwise-runs/<name>`, sharing the project's DVC cache. The user's params.yaml, data/, models/
  and dvc.lock are never touched; two runs at once never share a folder.
- Each stage is brought up to date the way `dvc repro` would: skipped when dvc.lock says it is,
  restored from DVC's run-cache when any run computed it before with the same deps and params,
  else computed here and recorded in dvc.lock (as `dvc commit` does). `dvc repro` in the worktree
  afterwards runs nothing.
- One MLflow run per flow run, with the overrides as `override.<key>` params and the metrics of
  every stage, restored ones included. Without MLFLOW_TRACKING_URI the project's own mlflow.db is
  used, so runs from `make run` and from the UI land in one store.

`python -m flows.pipeline [key=value ...] [--run-name NAME]` runs the pipeline flow once, here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import yaml
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from pydantic import Field

from flows.retries import RETRIES, RETRY_DELAYS_S, retry_if_transient
from flows.summary import summary_table
from flows.workspace import (
    BRANCH_PREFIX,
    RUNS_DIR,
    DvcStages,
    WorkspaceError,
    commit_run,
    create_worktree,
    inside,
)
from rollwise import track
from rollwise.config import Params, ParamsError, apply_overrides, dump_for_dvc, read_raw, validate
from rollwise.credit import ESTIMATORS
from rollwise.schedule import SCHEDULERS
from tasks import credit, curate, evaluate, generate, rollout, train, warmstart
from tasks.common import PROGRESS_SINKS, recorded_metrics, timed_stage

ROOT = Path(__file__).resolve().parents[1]  # the project: params.yaml, mlflow.db, .rollwise/

# ---------------------------------------------------------------------------- stage tasks


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


# ---------------------------------------------------------------------------- progress in the UI


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


# ---------------------------------------------------------------------------- the flow run's world


def resolve_params(params_file: str | Path, overrides: dict[str, Any]) -> tuple[Params, dict, Path]:
    """params file + overrides -> (validated Params, raw mapping, file); ParamsError names the
    key."""
    path = Path(params_file) if Path(params_file).is_absolute() else ROOT / params_file
    raw = apply_overrides(read_raw(path), overrides)
    return validate(raw, str(path)), raw, path


def params_text(raw: dict, overrides: dict[str, Any], base: Path) -> str:
    header = f"# written by a rollwise flow from {base}; overrides: {json.dumps(overrides)}\n"
    return header + dump_for_dvc(raw)


def folder_name(run_name: str | None) -> str:
    """The run's name, safe as one path component and one git branch component."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", run_name or flow_run.name or "run").strip(".-")
    return name or "run"


@contextlib.contextmanager
def mlflow_run(root: Path, params: Params, overrides: dict, name: str) -> Iterator[str]:
    """One MLflow run for this flow run, found by the stages through MLFLOW_RUN_ID."""
    saved = {
        k: os.environ.get(k)
        for k in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "PREFECT__FLOW_RUN_ID")
    }
    if not os.environ.get("MLFLOW_TRACKING_URI"):  # the project's store, not the worktree's
        os.environ["MLFLOW_TRACKING_URI"] = track.tracking_uri(ROOT)
    os.environ.pop("MLFLOW_RUN_ID", None)  # this flow run owns its MLflow run
    if flow_run.id:
        os.environ["PREFECT__FLOW_RUN_ID"] = str(flow_run.id)  # track tags the run with it
    try:
        run_id = track.open_run(root, params.model_dump(), run_name=name, fresh=True)
        os.environ["MLFLOW_RUN_ID"] = run_id
        if overrides:
            track.log_params(run_id, {f"override.{k}": v for k, v in overrides.items()}, root)
        try:
            yield run_id
        except BaseException:
            track.finish_run(run_id, "FAILED", root=root)
            raise
        track.finish_run(run_id, root=root)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def one_torch_thread() -> None:
    """Servers share the two cores; 2-thread torch collapses under contention (stack-notes)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ.get("ROLLWISE_TORCH_THREADS", "1")))


@contextlib.contextmanager
def experiment(
    name: str, raw: dict, overrides: dict, base: Path, params: Params
) -> Iterator[tuple[DvcStages, str]]:
    """The run's worktree with its DVC stages and MLflow run; commits the worktree at the end
    (also after a failure: the finished stages are recorded, a rerun of the name resumes)."""
    root = create_worktree(ROOT, name, params_text(raw, overrides, base))
    stages = DvcStages(root)
    PROGRESS_SINKS.append(log_progress_to_prefect)
    try:
        with mlflow_run(root, params, overrides, name) as run_id:
            yield stages, run_id
    finally:
        PROGRESS_SINKS.remove(log_progress_to_prefect)
        stages.close()
        logger = get_run_logger()
        try:
            commit = commit_run(root, f"rollwise run {name}; overrides {json.dumps(overrides)}")
            logger.info("worktree %s, branch %s%s at %s", root, BRANCH_PREFIX, name, commit)
        except WorkspaceError as e:  # never hide the run's own outcome behind this
            logger.warning("could not commit the run's worktree: %s", e)


# ---------------------------------------------------------------------------- the form


def _choice(names) -> Any:
    return Literal[tuple(sorted(names))]  # type: ignore[valid-type]


# Form field -> the dotted params key it overrides (None: leave params.yaml's value).
FORM_KEYS = {
    "rounds": "rounds",
    "train_lr": "train.lr",
    "samples_per_task": "rollout.samples_per_task",
    "schedule_method": "schedule.method",
    "credit_method": "credit.method",
}


def form_overrides(form: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The form's typed fields as dotted overrides, merged with the free-form mapping; the same
    key set two ways to two values is an error, not a silent choice."""
    merged = dict(overrides)
    for field, key in FORM_KEYS.items():
        value = form.get(field)
        if value is None:
            continue
        if key in merged and merged[key] != value:
            raise ParamsError(f"{key}: {value!r} in {field} but {merged[key]!r} in overrides")
        merged[key] = value
    return merged


RUN_NAME = Field(
    default=None,
    description="Names the run's worktree .rollwise/runs/NAME/, its git branch "
    "rollwise-runs/NAME and the MLflow run (default: the flow run's name). Reusing a name "
    "resumes that run: stages already recorded there are skipped.",
)
OVERRIDES = Field(
    default={},
    description='Any other params.yaml keys, dotted: {"train.epochs": 4, "envs.n_envs": 12}. '
    "Checked before any stage runs; an unknown key fails the run.",
)
PARAMS_FILE = Field(
    default="params.yaml",
    description="The params file the overrides apply to, relative to the project root.",
)


@flow(name="rollwise-pipeline", log_prints=True)
def pipeline(
    run_name: str | None = RUN_NAME,
    rounds: int | None = Field(default=None, ge=1, le=100, description="RL rounds (rounds=N)."),
    train_lr: float | None = Field(
        default=None, gt=0, description="Policy learning rate (train.lr)."
    ),
    samples_per_task: int | None = Field(
        default=None, ge=1, description="Rollouts per scheduled task, G (rollout.samples_per_task)."
    ),
    schedule_method: _choice(SCHEDULERS) | None = Field(
        default=None, description="Which tasks get the next rollouts (schedule.method)."
    ),
    credit_method: _choice(ESTIMATORS) | None = Field(
        default=None, description="Credit assignment (credit.method)."
    ),
    overrides: dict[str, Any] = OVERRIDES,
    params_file: str = PARAMS_FILE,
) -> dict[str, dict]:
    """The whole rollwise pipeline (generate, warmstart, rounds of rollout/curate/credit/train,
    evaluate) as its own experiment; stages computed before are restored by DVC, not rerun."""
    logger = get_run_logger()
    form = {"rounds": rounds, "train_lr": train_lr, "samples_per_task": samples_per_task,
            "schedule_method": schedule_method, "credit_method": credit_method}  # fmt: skip
    overrides = form_overrides(form, overrides)
    params, raw, base = resolve_params(params_file, overrides)  # fail fast, before any work
    name = folder_name(run_name)
    logger.info("run %s; %d round(s); overrides %s", name, params.n_rounds, overrides)
    one_torch_thread()
    with experiment(name, raw, overrides, base, params) as (stages, run_id):
        logger.info("MLflow run %s at %s", run_id, os.environ["MLFLOW_TRACKING_URI"])
        results = run_stages(params, stages)
        logger.info(summary_table(stages.root, params))
    return results


@flow(name="rollwise-evaluate", log_prints=True)
def evaluate_only(
    from_run: str | None = Field(
        default=None,
        description="A pipeline run (its name) whose params to start from; default: the "
        "params file.",
    ),
    run_name: str | None = RUN_NAME,
    overrides: dict[str, Any] = Field(
        default={},
        description='Evaluation keys to change, dotted: {"evaluate.max_tasks": 100}.',
    ),
    params_file: str = PARAMS_FILE,
    candidates: dict[str, str] = Field(
        default={},
        description="Your own checkpoints, {name: Hugging Face model folder} (relative: to the "
        "project root); evaluated beside every round's checkpoint (evaluate.candidates).",
    ),
    candidates_only: bool = Field(
        default=False,
        description="Evaluate only `candidates`: no pipeline rounds needed, only the generated "
        "suite; outputs in the run's data/eval_candidates/.",
    ),
) -> dict:
    """Evaluation alone: every upstream stage must come from DVC (up to date or in the
    run-cache); only `evaluate` runs here. Fails, naming the stage, if anything upstream was
    never computed with these params. A missing or unloadable candidate folder fails before
    any cell runs."""
    base = ROOT / RUNS_DIR / folder_name(from_run) / "params.yaml" if from_run else params_file
    if from_run and not Path(base).exists():
        raise WorkspaceError(f"no pipeline run named {from_run!r}: {base} does not exist")
    if candidates:  # absolute: the run's worktree is another folder
        found = {k: str(ROOT / Path(v).expanduser()) for k, v in candidates.items()}
        overrides = {**overrides, "evaluate.candidates": found}
    params, raw, base = resolve_params(base, overrides)
    if candidates_only and not params.evaluate.candidates:
        raise ParamsError("candidates_only: no candidates given")
    name = folder_name(run_name)
    one_torch_thread()
    with experiment(name, raw, overrides, base, params) as (stages, _):
        upstream = stage_order(params)[: 1 if candidates_only else -1]
        for stage, r in upstream:
            name = label(stage, r)
            if not (stages.is_up_to_date(name) or stages.restore(name)):
                raise WorkspaceError(
                    f"stage {name} was never computed with these params: run the pipeline "
                    "deployment with them first"
                )
            recorded_metrics(stages.root, params, name)
        if candidates_only:
            return evaluate_candidates_task(params, stages.root)
        return evaluate_stage(params, stages)


@task(name="evaluate-candidates", log_prints=True, cache_policy=NO_CACHE, persist_result=False)
def evaluate_candidates_task(params: Params, root: Path) -> dict:
    """Only params' own candidates, outside DVC's record (nothing in dvc.lock changes)."""
    found = evaluate.user_candidates(params.evaluate.candidates, root)
    out = root / evaluate.CANDIDATES_OUT
    chosen, summary, n_tasks = evaluate.evaluate_candidates(params, root, found, out)
    return evaluate.stage_metrics(chosen, found, summary, n_tasks)


# ---------------------------------------------------------------------------- CLI


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`train.lr=3e-4 rounds=2` -> {"train.lr": 0.0003, "rounds": 2} (values read as YAML)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: override {item!r} is not key=value")
        out[key] = yaml.safe_load(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description=__doc__)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    parser.add_argument("--run-name")
    parser.add_argument("--params-file", default="params.yaml")
    args = parser.parse_args(argv)
    state = pipeline(
        overrides=parse_overrides(args.overrides),
        run_name=args.run_name,
        params_file=args.params_file,
        return_state=True,
    )
    if not state.is_completed():
        print(f"error: {state.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
