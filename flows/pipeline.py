"""The Prefect flow `rollwise-pipeline`: every stage of dvc.yaml, in DAG order, in one process.

generate -> warmstart -> (rollout@r -> curate@r -> credit@r -> train@r for each round r) ->
evaluate. Each stage is one Prefect task wrapping `tasks.<stage>.run`, so a flow run has exactly
one task run per stage (named like dvc's stages: `rollout@01`).

Where it departs from `dvc repro` (design.md §2, Orchestration):
- Overrides (`{"train.lr": 3e-4, "rounds": 2}`) are checked against params.yaml before any stage
  runs; a bad key fails the flow run at once with the key path in the message.
- A flow run never touches the user's workspace: it works in `.rollwise/runs/<name>/` (its own
  params.yaml with the overrides applied, data/, models/). A later issue makes this a DVC
  experiment sharing the cache; for now it is a plain folder and nothing is written to dvc.lock.
- One MLflow run per flow run; the overrides are logged as `override.<key>` params. Without
  MLFLOW_TRACKING_URI the project's own mlflow.db is used (not the work folder's), so runs from
  `make run` and from the UI land in one store.

`python -m flows.pipeline [key=value ...] [--run-name NAME]` runs the flow once, here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from pydantic import Field

from flows.summary import summary_table
from rollwise import track
from rollwise.config import Params, apply_overrides, read_raw, validate
from tasks import credit, curate, evaluate, generate, rollout, train, warmstart
from tasks.common import timed_stage

ROOT = Path(__file__).resolve().parents[1]  # the project: params.yaml, mlflow.db, .rollwise/
RUNS_DIR = Path(".rollwise") / "runs"
RETRIES = 2
RETRY_DELAYS_S = [10, 60]

# ---------------------------------------------------------------------------- retries


def _network_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the network or a server blinked": worth a retry."""
    types: list[type[BaseException]] = [ConnectionError, TimeoutError, socket.gaierror]
    optional = {
        "requests": ("ConnectionError", "Timeout"),
        "httpx": ("TransportError",),
        "urllib3.exceptions": ("ProtocolError", "NewConnectionError", "TimeoutError"),
        "botocore.exceptions": ("ConnectionError", "HTTPClientError"),
    }
    for module, names in optional.items():
        with contextlib.suppress(ImportError):
            mod = __import__(module, fromlist=list(names))
            types += [getattr(mod, n) for n in names if hasattr(mod, n)]
    return tuple(types)


NETWORK_ERRORS = _network_errors()
# Never retried, whatever they wrap: bad params/data (ParamsError is a ValueError), a missing
# upstream artifact, code errors. A retry would only fail the same way, later.
PERMANENT_ERRORS = (ValueError, TypeError, LookupError, FileNotFoundError, PermissionError)


def is_transient(exc: BaseException | None) -> bool:
    """True for connection/timeout errors (to MLflow, S3, ...), also when wrapped by a client."""
    if exc is None or isinstance(exc, PERMANENT_ERRORS):
        return False
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NETWORK_ERRORS) or "Max retries exceeded" in str(exc):
            return True  # the last: how MLflow's REST client reports a refused connection
        exc = exc.__cause__ or exc.__context__
    return False


def retry_if_transient(task, task_run, state) -> bool:
    """Prefect `retry_condition_fn`: retry a failed stage only on a transient network error."""
    exc = state.result(raise_on_failure=False)
    return is_transient(exc if isinstance(exc, BaseException) else None)


# ---------------------------------------------------------------------------- stage tasks


def stage_task(name: str, run: Callable[..., dict], per_round: bool = False):
    """A Prefect task around `tasks.<name>.run`: run it, time it, record it like `stage_main`."""

    def stage(params: Params, root: Path, r: str | None = None) -> dict:
        label = f"{name}@{r}" if per_round else name
        metrics = timed_stage(name, run, params, root, r if per_round else None)
        get_run_logger().info("%s metrics: %s", label, json.dumps(metrics, default=float))
        return metrics

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


def run_stages(params: Params, root: Path) -> dict[str, dict]:
    """The DAG of dvc.yaml, in order; returns each stage's metrics by stage name."""
    results = {"generate": generate_stage(params, root)}
    results["warmstart"] = warmstart_stage(params, root)
    for r in params.rounds:
        for stage in (rollout_stage, curate_stage, credit_stage, train_stage):
            results[f"{stage.name}@{r}"] = stage(params, root, r)
    results["evaluate"] = evaluate_stage(params, root)
    return results


# ---------------------------------------------------------------------------- the flow run's world


def resolve_params(params_file: str, overrides: dict[str, Any]) -> tuple[Params, dict]:
    """params file + overrides -> (validated Params, raw mapping); ParamsError names the key."""
    path = Path(params_file) if Path(params_file).is_absolute() else ROOT / params_file
    raw = apply_overrides(read_raw(path), overrides)
    return validate(raw, str(path)), raw


def work_folder(name: str, raw: dict, overrides: dict[str, Any]) -> Path:
    """`.rollwise/runs/<name>/` with its own params.yaml, data/ and models/."""
    root = ROOT / RUNS_DIR / name
    for sub in ("data", "models"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    header = f"# written by the rollwise-pipeline flow; overrides: {json.dumps(overrides)}\n"
    (root / "params.yaml").write_text(header + yaml.safe_dump(raw, sort_keys=False))
    return root


def folder_name(run_name: str | None) -> str:
    """The run's name, safe as one path component."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", run_name or flow_run.name or "run").strip(".-")
    return name or "run"


@contextlib.contextmanager
def mlflow_run(root: Path, params: Params, overrides: dict, name: str) -> Iterator[str]:
    """One MLflow run for this flow run, found by the stages through MLFLOW_RUN_ID."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID")}
    if not os.environ.get("MLFLOW_TRACKING_URI"):  # the project's store, not the work folder's
        os.environ["MLFLOW_TRACKING_URI"] = track.tracking_uri(ROOT)
    os.environ.pop("MLFLOW_RUN_ID", None)  # this flow run owns its MLflow run
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


@flow(name="rollwise-pipeline", log_prints=True)
def pipeline(
    overrides: dict[str, Any] = Field(
        default={},
        description='params.yaml keys to change, dotted: {"train.lr": 0.0003, "rounds": 2}. '
        "Checked before any stage runs; an unknown key fails the run.",
    ),
    run_name: str | None = Field(
        default=None,
        description="Name of the work folder .rollwise/runs/<name>/ and of the MLflow run "
        "(default: the flow run's name). Reusing a name overwrites that folder's outputs.",
    ),
    params_file: str = Field(
        default="params.yaml",
        description="The params file the overrides apply to, relative to the project root.",
    ),
) -> dict[str, dict]:
    """The whole rollwise pipeline (generate, warmstart, rounds of rollout/curate/credit/train,
    evaluate) with parameter overrides, in its own work folder; metrics go to MLflow."""
    logger = get_run_logger()
    params, raw = resolve_params(params_file, overrides)  # fail fast, before any work
    name = folder_name(run_name)
    root = work_folder(name, raw, overrides)
    logger.info("work folder %s; %d round(s); overrides %s", root, params.n_rounds, overrides)
    one_torch_thread()
    with mlflow_run(root, params, overrides, name) as run_id:
        logger.info("MLflow run %s at %s", run_id, os.environ["MLFLOW_TRACKING_URI"])
        results = run_stages(params, root)
        logger.info(summary_table(root, params))
    return results


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
