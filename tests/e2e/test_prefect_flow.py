"""The `rollwise-pipeline` flow, served and triggered the way the Prefect UI does it.

A copy of the project (tasks/, flows/, dvc.yaml, the micro params as params.yaml) is served with
`python -m flows.serve` against the session's real Prefect and MLflow servers; a run with an
override is created over the REST API and must finish with one task run per stage, the override
in MLflow, and the copy's workspace untouched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests import servers

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
MICRO = Path(__file__).with_name("micro_params.yaml")
FLOW, DEPLOYMENT = "rollwise-pipeline", "pipeline"
SERVE_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 300.0
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
PER_ROUND = ("rollout", "curate", "credit", "train")


def expected_task_runs(rounds: list[str]) -> list[str]:
    return ["generate", "warmstart", *[f"{s}@{r}" for r in rounds for s in PER_ROUND], "evaluate"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The parts of the project the flow needs (rollwise itself is installed editable)."""
    root = tmp_path / "project"
    ignore = shutil.ignore_patterns("__pycache__")
    for folder in ("tasks", "flows"):
        shutil.copytree(REPO / folder, root / folder, ignore=ignore)
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    shutil.copy(MICRO, root / "params.yaml")
    return root


@contextlib.contextmanager
def serving(project: Path, prefect_url: str, mlflow_uri: str) -> Iterator[servers.Server]:
    """`python -m flows.serve` in `project`, in its own process group; always stopped."""
    state = project.parent / "serve-state"
    (state / "tmp").mkdir(parents=True)
    env = {
        **os.environ,
        **servers.QUIET_ENV,
        "PREFECT_API_URL": prefect_url,
        "MLFLOW_TRACKING_URI": mlflow_uri,
        "PREFECT_HOME": str(state / "prefect-home"),
        "TMPDIR": str(state / "tmp"),
        "OMP_NUM_THREADS": "1",
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        "PYTHONPATH": str(project),
    }
    env.pop("MLFLOW_RUN_ID", None)
    log = state / "serve.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.serve"],
            cwd=project,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = servers.Server("flows.serve", prefect_url, proc, log, 0.0)
    try:
        yield server
    finally:
        servers.stop(server)


def wait_for_deployment(api: httpx.Client, serve: servers.Server) -> dict:
    deadline = time.monotonic() + SERVE_TIMEOUT_S
    while time.monotonic() < deadline:
        if serve.proc.poll() is not None:
            pytest.fail(f"flows.serve exited with {serve.proc.returncode}\n{tail(serve.log)}")
        resp = api.get(f"/deployments/name/{FLOW}/{DEPLOYMENT}")
        if resp.status_code == 200:
            return resp.json()
        time.sleep(0.5)
    pytest.fail(f"deployment {FLOW}/{DEPLOYMENT} not served in {SERVE_TIMEOUT_S:.0f} s")


def wait_for_terminal(api: httpx.Client, run_id: str, serve: servers.Server) -> dict:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        run = api.get(f"/flow_runs/{run_id}").raise_for_status().json()
        if run["state"] and run["state"]["type"] in TERMINAL:
            return run
        if serve.proc.poll() is not None:
            pytest.fail(f"flows.serve exited with {serve.proc.returncode}\n{tail(serve.log)}")
        time.sleep(1.0)
    pytest.fail(f"flow run {run_id} not finished in {RUN_TIMEOUT_S:.0f} s\n{tail(serve.log)}")


def wait_for_logs(api: httpx.Client, run_id: str, wanted: list[str], timeout_s=15.0) -> str:
    """The run's logs once they hold every `wanted` piece (they reach the API in batches)."""
    deadline = time.monotonic() + timeout_s
    while True:
        logs = flow_run_logs(api, run_id)
        if all(w in logs for w in wanted) or time.monotonic() > deadline:
            return logs
        time.sleep(1.0)


def tail(path: Path, lines: int = 60) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return f"--- last lines of {path} ---\n" + "\n".join(text.splitlines()[-lines:])


def flow_run_logs(api: httpx.Client, run_id: str) -> str:
    """Every log line of the flow run and its task runs, oldest first (pages of 200)."""
    lines: list[str] = []
    while True:
        body = {
            "logs": {"flow_run_id": {"any_": [run_id]}},
            "sort": "TIMESTAMP_ASC",
            "offset": len(lines),
            "limit": 200,
        }
        page = api.post("/logs/filter", json=body).raise_for_status().json()
        lines += [log["message"] for log in page]
        if len(page) < 200:
            return "\n".join(lines)


def test_ui_triggered_run_with_override(project: Path, prefect_server: str, mlflow_server: str):
    from mlflow.tracking import MlflowClient

    rounds = list(yaml.safe_load(MICRO.read_text())["rounds"])
    params_before = (project / "params.yaml").read_bytes()
    with (
        serving(project, prefect_server, mlflow_server) as serve,
        httpx.Client(base_url=prefect_server, timeout=10) as api,
    ):
        deployment = wait_for_deployment(api, serve)
        schema = deployment["parameter_openapi_schema"]["properties"]
        assert {"overrides", "run_name", "params_file"} <= set(schema)
        assert all(schema[k].get("description") for k in ("overrides", "run_name"))

        t0 = time.monotonic()
        created = api.post(
            f"/deployments/{deployment['id']}/create_flow_run",
            json={"parameters": {"overrides": {"train.lr": 0.0002}}, "name": "e2e-lr"},
        ).raise_for_status()
        run = wait_for_terminal(api, created.json()["id"], serve)
        took = time.monotonic() - t0
        state = run["state"]
        assert state["type"] == "COMPLETED", (
            f"{state['type']}: {state.get('message')}\n"
            f"{flow_run_logs(api, run['id'])}\n{tail(serve.log)}"
        )
        print(f"\nmicro flow run: {took:.1f} s from trigger to COMPLETED")
        wanted = [
            f"rollout@{rounds[0]} metrics: ",  # get_run_logger, once per stage
            f"rollout@{rounds[0]}: 3 tasks x 3 samples",  # the stage's own print (log_prints)
        ]
        logs = wait_for_logs(api, run["id"], wanted)
        assert all(w in logs for w in wanted), logs

        body = {
            "task_runs": {"flow_run_id": {"any_": [run["id"]]}},
            "sort": "EXPECTED_START_TIME_ASC",
        }
        task_runs = api.post("/task_runs/filter", json=body).raise_for_status().json()
    assert len(task_runs) == 2 + 4 * len(rounds) + 1
    assert [t["name"] for t in task_runs] == expected_task_runs(rounds)
    assert {t["state"]["type"] for t in task_runs} == {"COMPLETED"}

    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("rollwise")
    found = client.search_runs(
        [experiment.experiment_id], filter_string="params.`override.train.lr` = '0.0002'"
    )
    assert len(found) == 1
    mlrun = found[0]
    assert mlrun.info.status == "FINISHED"
    assert mlrun.info.run_name == "e2e-lr"
    assert mlrun.data.params["train.lr"] == "0.0002"
    history = client.get_metric_history(mlrun.info.run_id, "rollout/reward_mean")
    assert sorted(m.step for m in history) == [int(r) for r in rounds]
    assert "evaluate/final_success" in mlrun.data.metrics

    # The copy's workspace is untouched; everything lives in the run's work folder.
    assert (project / "params.yaml").read_bytes() == params_before
    for path in ("data", "models", "mlflow.db", "mlruns"):
        assert not (project / path).exists(), path
    work = project / ".rollwise" / "runs" / "e2e-lr"
    assert yaml.safe_load((work / "params.yaml").read_text())["train"]["lr"] == 0.0002
    assert (work / "data" / "envs" / "catalog.parquet").exists()
    assert (work / "models" / f"round_{rounds[-1]}" / "config.json").exists()
    assert (work / "data" / "eval" / "report.md").exists()
    assert {p.stem for p in (work / "data" / "metrics").glob("*.json")} == set(
        expected_task_runs(rounds)
    )


def test_bad_override_fails_the_run_at_once(prefect_server: str, monkeypatch):
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.pipeline import ROOT, pipeline

    monkeypatch.setenv("PREFECT_API_URL", prefect_server)
    t0 = time.monotonic()
    with temporary_settings({PREFECT_API_URL: prefect_server}):
        state = pipeline(
            overrides={"train.lrr": 1},
            run_name="e2e-bad-override",
            params_file=str(MICRO),
            return_state=True,
        )
        took = time.monotonic() - t0
        APILogWorker.drain_all(timeout=5)  # send the run's logs while the server is up
    assert state.is_failed()
    assert "train.lrr" in state.message
    assert took < 30, f"a bad override took {took:.1f} s to fail"
    assert not (ROOT / ".rollwise" / "runs" / "e2e-bad-override").exists()
    run_id = state.state_details.flow_run_id
    with httpx.Client(base_url=prefect_server, timeout=10) as api:
        recorded = api.get(f"/flow_runs/{run_id}").raise_for_status().json()["state"]
        logs = wait_for_logs(api, str(run_id), ["unknown key 'lrr'"])
    assert recorded["type"] == "FAILED"
    assert "train.lrr" in recorded["message"]
    assert "ParamsError" in logs  # the traceback is in the run's logs, as the UI shows them
