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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from pydantic import Field

from flows.form import OVERRIDES, PARAMS_FILE, RUN_NAME, choice, form_overrides
from flows.stages import evaluate_stage, label, log_progress_to_prefect, run_stages, stage_order
from flows.summary import summary_table
from flows.tracking import mlflow_run
from flows.workspace import (
    BRANCH_PREFIX,
    RUNS_DIR,
    DvcStages,
    WorkspaceError,
    commit_run,
    create_worktree,
)
from rollwise.config import (
    Params,
    ParamsError,
    apply_overrides,
    dump_for_dvc,
    parse_overrides,
    read_raw,
    validate,
    write_rounds_file,
)
from rollwise.credit import ESTIMATORS
from rollwise.evaluate.candidates import stage_metrics
from rollwise.schedule import SCHEDULERS
from tasks import evaluate
from tasks.common import PROGRESS_SINKS, recorded_metrics

ROOT = Path(__file__).resolve().parents[1]  # the project: params.yaml, mlflow.db, .rollwise/


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
    write_rounds_file(root, params)  # what the worktree's dvc.yaml loops over
    stages = DvcStages(root)
    PROGRESS_SINKS.append(log_progress_to_prefect)
    try:
        with mlflow_run(ROOT, root, params, overrides, name) as run_id:
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
    schedule_method: choice(SCHEDULERS) | None = Field(
        default=None, description="Which tasks get the next rollouts (schedule.method)."
    ),
    credit_method: choice(ESTIMATORS) | None = Field(
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
    return stage_metrics(chosen, found, summary, n_tasks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description=__doc__)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    parser.add_argument("--run-name")
    parser.add_argument("--params-file", default="params.yaml")
    args = parser.parse_args(argv)
    try:
        overrides = parse_overrides(args.overrides)
    except ParamsError as e:
        raise SystemExit(f"error: {e}") from e
    state = pipeline(
        overrides=overrides,
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
