"""One MLflow run per flow run: opened before the first stage, found by every stage through
MLFLOW_RUN_ID, finished (or failed) when the flow run ends."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from prefect.runtime import flow_run

from rollwise import track
from rollwise.config import Params


@contextlib.contextmanager
def mlflow_run(
    project: Path, root: Path, params: Params, overrides: dict, name: str
) -> Iterator[str]:
    """One MLflow run for this flow run, found by the stages through MLFLOW_RUN_ID; without
    MLFLOW_TRACKING_URI, the store of `project` (not the run's worktree `root`)."""
    saved = {
        k: os.environ.get(k)
        for k in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "PREFECT__FLOW_RUN_ID")
    }
    if not os.environ.get("MLFLOW_TRACKING_URI"):  # the project's store, not the worktree's
        os.environ["MLFLOW_TRACKING_URI"] = track.tracking_uri(project)
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
