"""MLflow tracking: the one module that talks to MLflow.

Why it looks the way it does:
- Under `dvc repro` every stage is its own process, yet all stages of one pipeline run must land
  in one MLflow run. `open_run` therefore finds the run by a hash of the run's params (or takes
  `MLFLOW_RUN_ID` from the environment, which the Prefect flow sets) instead of keeping a global
  active run.
- Everything goes through `MlflowClient` with an explicit run id and batched `log_batch` calls:
  no hidden module state, safe across threads and processes.
- Tags pin what produced a run: the git commit and the Prefect flow-run id (PREFECT__FLOW_RUN_ID,
  which the flow sets) when the run is opened, the sha256 of dvc.lock when it is finished.
- A tracking server that is down must not fail (or lose) a training run: records that cannot be
  sent are appended to `<root>/.rollwise/mlflow-buffer.jsonl` and replayed by `flush_buffer`,
  which every log call runs first.

This module imports neither prefect nor dvc.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

EXPERIMENT = "rollwise"
HASH_TAG = "rollwise.params_hash"
GIT_COMMIT_TAG = "rollwise.git_commit"
DVC_LOCK_TAG = "rollwise.dvc_lock_hash"
FLOW_RUN_TAG = "rollwise.prefect_flow_run_id"
# MLflow 3's UI picks an experiment's view from this tag: untagged, it may open our runs as a GenAI
# app ("Traces 0"); custom_model_development opens the training-runs view with metric charts.
KIND_TAG, KIND = "mlflow.experimentKind", "custom_model_development"
FLOW_RUN_ENV = "PREFECT__FLOW_RUN_ID"  # what Prefect sets in a flow run's process; the flow too
MAX_PARAM_CHARS = 6000  # MLflow rejects longer param values
_PARAMS_PER_BATCH = 100  # MLflow's log_batch limits
_METRICS_PER_BATCH = 1000
_PENDING = "pending-"  # prefix of run ids handed out while the server was unreachable
_LOCK = threading.Lock()


class _Unreachable(Exception):
    """The tracking backend could not be reached; the record belongs in the buffer."""


# ---------------------------------------------------------------------------- public helpers


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dict -> {"a.b.c": value}: MLflow params are flat, params.yaml is nested."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, prefix=f"{name}."))
        else:
            out[name] = value
    return out


def params_hash(params: dict) -> str:
    """sha256 of the canonical JSON of `params`: the identity of one pipeline run."""
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def tracking_uri(root: Path) -> str:
    """MLFLOW_TRACKING_URI if set (a server), else a sqlite file in the repo (no server needed)."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return "sqlite:///" + (Path(root).resolve() / "mlflow.db").as_posix()


def buffer_path(root: Path) -> Path:
    """Where records wait while the tracking server is unreachable."""
    return Path(root).resolve() / ".rollwise" / "mlflow-buffer.jsonl"


def git_commit(root: Path) -> str | None:
    """HEAD of the git work tree holding `root` (None outside one): the code that ran."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--verify", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def dvc_lock_hash(root: Path) -> str | None:
    """sha256 of `<root>/dvc.lock` (None if absent): pins every stage's inputs and outputs."""
    path = Path(root) / "dvc.lock"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def start_tags(root: Path) -> dict[str, str]:
    """Tags known when a run opens: the git commit and, inside a Prefect flow run, its id."""
    tags = {}
    if commit := git_commit(root):
        tags[GIT_COMMIT_TAG] = commit
    if flow_run_id := os.environ.get(FLOW_RUN_ENV):
        tags[FLOW_RUN_TAG] = flow_run_id
    return tags


# ---------------------------------------------------------------------------- public API


def open_run(root: Path, params: dict, run_name: str | None = None, fresh: bool = False) -> str:
    """Return the MLflow run id of the pipeline run that `params` describe.

    MLFLOW_RUN_ID wins; otherwise the latest RUNNING/FINISHED run in experiment "rollwise" tagged
    with this params hash is reused, or a new one is created with the flattened params. If the
    server is unreachable a pending id is returned and the run is created on the next flush.
    `fresh` always creates a new run (a Prefect flow run is one pipeline run, even when its
    params equal an earlier one's). The run gets (or, reused, refreshes) the `start_tags`.
    """
    if os.environ.get("MLFLOW_RUN_ID"):
        return os.environ["MLFLOW_RUN_ID"]
    root = Path(root)
    tags = start_tags(root)
    record = {"op": "open", "params": params, "run_name": run_name, "fresh": fresh, "tags": tags}
    if not flush_buffer(root):
        return _buffer_open(root, record)
    try:
        return _find_or_create(_client(root), root, params, run_name, fresh, tags)
    except _Unreachable as exc:
        _warn(exc)
        return _buffer_open(root, record)


def log_metrics(
    run_id: str, metrics: dict[str, float], step: int | None = None, root: Path | None = None
) -> None:
    """Log metrics (one batch, one timestamp) at `step`; buffered if the server is down."""
    record = {
        "op": "metrics",
        "run_id": run_id,
        "metrics": {k: float(v) for k, v in metrics.items()},
        "step": step,
        "timestamp": int(time.time() * 1000),
    }
    _send(_root(root), record)


def log_params(run_id: str, params: dict, root: Path | None = None) -> None:
    """Log params flattened to dotted keys (values cut to MLflow's 6000 chars)."""
    _send(_root(root), {"op": "params", "run_id": run_id, "params": _param_strings(params)})


def log_artifacts(
    run_id: str, paths: list[Path], artifact_path: str | None = None, root: Path | None = None
) -> None:
    """Upload files or folders under `artifact_path`; buffered (by path) if the server is down."""
    files = [str(Path(p).resolve()) for p in paths]
    _send(_root(root), {"op": "artifacts", "run_id": run_id, "paths": files, "dir": artifact_path})


def finish_run(run_id: str, status: str = "FINISHED", root: Path | None = None) -> None:
    """Mark the run terminated (FINISHED, FAILED or KILLED), tagged with the dvc.lock hash of
    `root` as it stands now (the end of the pipeline run), when there is one."""
    root = _root(root)
    digest = dvc_lock_hash(root)
    tags = {DVC_LOCK_TAG: digest} if digest else {}
    _send(root, {"op": "finish", "run_id": run_id, "status": status, "tags": tags})


def flush_buffer(root: Path) -> bool:
    """Replay buffered records in order; True when the buffer is empty afterwards.

    Stops at the first record that still cannot be sent and keeps it and the rest.
    """
    path = buffer_path(root)
    if not path.exists():
        return True
    with _locked(path):
        records = _read_buffer(path)
        if not records:
            path.unlink(missing_ok=True)
            return True
        done = _replay(Path(root), records)
        rest = records[done:]
        _write_buffer(path, rest)
    if rest:
        return False
    print(f"rollwise.track: replayed {done} buffered MLflow record(s)", file=sys.stderr)
    return True


# ---------------------------------------------------------------------------- sending


def _root(root: Path | None) -> Path:
    return Path(root) if root is not None else Path.cwd()


def _send(root: Path, record: dict) -> None:
    """Flush what waits, then apply `record`; append it to the buffer if that is impossible."""
    if flush_buffer(root):
        try:
            _apply(_client(root), root, record)
            return
        except _Unreachable as exc:
            _warn(exc)
    _append(root, record)


def _apply(client: MlflowClient, root: Path, record: dict) -> None:
    """Send one record. Raises _Unreachable on connection problems."""
    op = record["op"]
    if op == "open":
        _find_or_create(
            client,
            root,
            record["params"],
            record["run_name"],
            record.get("fresh", False),
            record.get("tags", {}),
        )
        return
    with _translate_errors(client):
        run_id = _resolve(client, root, record["run_id"])
        if op == "metrics":
            _log_metric_batches(client, run_id, record)
        elif op == "params":
            _log_param_batches(client, run_id, record["params"])
        elif op == "artifacts":
            _upload(client, run_id, record["paths"], record["dir"])
        elif op == "finish":
            _log_tags(client, run_id, record.get("tags", {}))
            client.set_terminated(run_id, status=record["status"])


def _log_metric_batches(client: MlflowClient, run_id: str, record: dict) -> None:
    step, ts = record["step"] or 0, record["timestamp"]
    metrics = [Metric(k, v, ts, step) for k, v in record["metrics"].items()]
    for i in range(0, len(metrics), _METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + _METRICS_PER_BATCH])


def _log_param_batches(client: MlflowClient, run_id: str, params: dict[str, str]) -> None:
    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), _PARAMS_PER_BATCH):
        client.log_batch(run_id, params=items[i : i + _PARAMS_PER_BATCH])


def _upload(client: MlflowClient, run_id: str, paths: list[str], artifact_path: str | None):
    for p in map(Path, paths):
        if p.is_dir():
            sub = f"{artifact_path}/{p.name}" if artifact_path else p.name
            client.log_artifacts(run_id, str(p), sub)
        elif p.exists():
            client.log_artifact(run_id, str(p), artifact_path)
        else:
            print(f"rollwise.track: artifact {p} is gone, not uploaded", file=sys.stderr)


def _log_tags(client: MlflowClient, run_id: str, tags: dict[str, str]) -> None:
    if tags:
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])


def _param_strings(params: dict) -> dict[str, str]:
    return {k: str(v)[:MAX_PARAM_CHARS] for k, v in flatten(params).items()}


# ---------------------------------------------------------------------------- runs


def _find_or_create(
    client: MlflowClient,
    root: Path,
    params: dict,
    run_name: str | None,
    fresh: bool = False,
    tags: dict[str, str] | None = None,
) -> str:
    """The latest live run with this params hash (its tags refreshed: the code that writes to it
    now), or a new one carrying the params and tags."""
    digest = params_hash(params)
    tags = tags or {}
    with _translate_errors(client):
        exp_id = _experiment_id(client, root)
        found = None if fresh else _find_run(client, exp_id, digest)
        if found is not None:
            _log_tags(client, found, tags)
            return found
        run = client.create_run(exp_id, run_name=run_name, tags={HASH_TAG: digest, **tags})
        _log_param_batches(client, run.info.run_id, _param_strings(params))
        return run.info.run_id


def _find_run(client: MlflowClient, exp_id: str, digest: str) -> str | None:
    runs = client.search_runs(
        [exp_id],
        filter_string=f"tags.`{HASH_TAG}` = '{digest}'",
        order_by=["attributes.start_time DESC"],
        max_results=20,
    )
    live = [r.info.run_id for r in runs if r.info.status in ("RUNNING", "FINISHED")]
    return live[0] if live else None


def _resolve(client: MlflowClient, root: Path, run_id: str) -> str:
    """A pending id (handed out while the server was down) -> the run created on replay.

    The pending id carries the params hash, so any process can resolve it once the buffered
    "open" record has been replayed.
    """
    if not run_id.startswith(_PENDING):
        return run_id
    found = _find_run(client, _experiment_id(client, root), run_id.removeprefix(_PENDING))
    if found is None:
        raise _Unreachable(f"run {run_id} is not created yet")
    return found


def _experiment_id(client: MlflowClient, root: Path) -> str:
    """The id of experiment "rollwise", created (or tagged) with the kind MLflow's UI reads."""
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is not None:
        if KIND_TAG not in exp.tags:  # made by an older rollwise or by hand; a set kind stays
            client.set_experiment_tag(exp.experiment_id, KIND_TAG, KIND)
        return exp.experiment_id
    location = None
    if client.tracking_uri.startswith("sqlite:"):  # artifacts beside the database file
        db = Path(client.tracking_uri.removeprefix("sqlite:///"))
        location = (db.parent / "mlruns").as_uri()
    try:
        return client.create_experiment(
            EXPERIMENT, artifact_location=location, tags={KIND_TAG: KIND}
        )
    except MlflowException:  # another process created it first
        exp = client.get_experiment_by_name(EXPERIMENT)
        if exp is None:
            raise
        return exp.experiment_id


# ---------------------------------------------------------------------------- connectivity


def _client(root: Path) -> MlflowClient:
    uri = tracking_uri(root)
    if uri.startswith(("http://", "https://")):
        _probe(uri)
    return MlflowClient(tracking_uri=uri)


def _probe(uri: str) -> None:
    """Fail fast when the server is down: MLflow's own retries would stall for minutes."""
    try:
        requests.get(uri.rstrip("/") + "/health", timeout=2)
    except requests.RequestException as exc:
        raise _Unreachable(f"MLflow server {uri} unreachable: {exc}") from exc


@contextmanager
def _translate_errors(client: MlflowClient) -> Iterator[None]:
    """Turn connection failures (however MLflow wraps them) into _Unreachable."""
    try:
        yield
    except (MlflowException, requests.RequestException, OSError) as exc:
        if _is_connection_error(exc):
            raise _Unreachable(f"MLflow at {client.tracking_uri} unreachable: {exc}") from exc
        raise


def _is_connection_error(exc: BaseException) -> bool:
    """True if `exc` or anything it wraps is a connection/timeout error.

    MLflow re-raises requests' errors as MlflowException, sometimes only chained implicitly.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, requests.ConnectionError | requests.Timeout | ConnectionError):
            return True
        if isinstance(exc, MlflowException) and "Max retries exceeded" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _warn(exc: BaseException) -> None:
    print(f"rollwise.track: WARNING {exc}; buffering records locally", file=sys.stderr)


# ---------------------------------------------------------------------------- buffer file


def _buffer_open(root: Path, record: dict) -> str:
    """Hand out a pending run id; the run is created when the buffer is replayed."""
    pending = _PENDING + params_hash(record["params"])
    _append(root, record)
    return pending


def _append(root: Path, record: dict) -> None:
    path = buffer_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path), path.open("a") as f:
        f.write(json.dumps(record, default=str) + "\n")


def _replay(root: Path, records: list[dict]) -> int:
    """Apply records in order; returns how many went through."""
    done = 0
    try:
        client = _client(root)
        for record in records:
            _apply(client, root, record)
            done += 1
    except _Unreachable as exc:
        _warn(exc)
    return done


def _read_buffer(path: Path) -> list[dict]:
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _write_buffer(path: Path, records: list[dict]) -> None:
    if not records:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One writer at a time, across threads (lock) and processes (flock on a side file)."""
    lock_path = path.with_suffix(".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with _LOCK, lock_path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
