"""The `rollwise-pipeline` flow, served and triggered the way the Prefect UI does it.

A git+DVC copy of the project (src/, tasks/, flows/, dvc.yaml, the micro params as params.yaml)
is served with `python -m flows.serve` against the session's real Prefect and MLflow servers.
Two runs with different overrides are created at once over the REST API; both must finish with
one task run per stage, their overrides in MLflow, each in its own worktree, the second restoring
from DVC's run-cache what the first computed, and the copy's workspace untouched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from rollwise.config import load_params
from rollwise.credit import ESTIMATORS
from tests import servers
from tests.helpers import assert_bench_arm_matches

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


GIT_ENV = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A git+DVC repo with the parts of the project the flow needs (rollwise itself is installed
    editable; src/ is there because dvc.yaml's stages depend on it)."""
    root = tmp_path / "project"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("src", "tasks", "flows"):
        shutil.copytree(REPO / folder, root / folder, ignore=ignore)
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    shutil.copy(MICRO, root / "params.yaml")
    (root / ".gitignore").write_text("__pycache__/\nmlflow.db\nmlruns/\n.rollwise/\n")
    env = {**os.environ, **GIT_ENV, "DVC_NO_ANALYTICS": "1"}
    dvc = str(Path(sys.executable).parent / "dvc")
    for cmd in (["git", "init", "-q"], [dvc, "init", "-q"], ["git", "add", "-A"],
                ["git", "commit", "-q", "-m", "project"]):  # fmt: skip
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True)
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


def create_run(api: httpx.Client, deployment_id: str, parameters: dict, name: str) -> str:
    """POST create_flow_run as the UI does; a busy server's 503 is retried, as a user would."""
    for attempt in range(5):
        resp = api.post(
            f"/deployments/{deployment_id}/create_flow_run",
            json={"parameters": parameters, "name": name},
        )
        if resp.status_code < 500 or attempt == 4:
            return resp.raise_for_status().json()["id"]
        time.sleep(2.0 * (attempt + 1))
    raise AssertionError("unreachable")


def task_runs_of(api: httpx.Client, run_id: str) -> list[dict]:
    body = {"task_runs": {"flow_run_id": {"any_": [run_id]}}, "sort": "EXPECTED_START_TIME_ASC"}
    return api.post("/task_runs/filter", json=body).raise_for_status().json()


def stage_outcomes(logs: str, stages: list[str]) -> dict[str, str]:
    """What DVC did per stage ("ran", "restored", "up-to-date"), from the stage's log line."""
    found = {}
    for stage in stages:
        hit = re.search(rf"{re.escape(stage)} (ran|restored|up-to-date); metrics", logs)
        found[stage] = hit.group(1) if hit else "missing"
    return found


def test_two_ui_runs_at_once(project: Path, prefect_server: str, mlflow_server: str):
    from mlflow.tracking import MlflowClient

    rounds = list(load_params(MICRO).rounds)
    stages = expected_task_runs(rounds)
    params_before = (project / "params.yaml").read_bytes()
    triggers = {  # one through the free-form mapping, one through the typed form field
        "e2e-lr2": {"overrides": {"train.lr": 0.0002}},
        "e2e-lr3": {"train_lr": 0.0003},
    }
    with (
        serving(project, prefect_server, mlflow_server) as serve,
        httpx.Client(base_url=prefect_server, timeout=10) as api,
    ):
        deployment = wait_for_deployment(api, serve)
        schema = deployment["parameter_openapi_schema"]["properties"]
        assert {"overrides", "run_name", "params_file", "rounds", "train_lr"} <= set(schema)
        assert all(schema[k].get("description") for k in schema), schema
        choice = schema["credit_method"]["anyOf"][0]  # a drop-down of ESTIMATORS, not free text
        assert choice.get("enum", [choice.get("const")]) == sorted(ESTIMATORS)

        t0 = time.monotonic()
        created = {
            name: create_run(api, deployment["id"], parameters, name)
            for name, parameters in triggers.items()
        }  # both queued before either starts: "at once", as two users clicking Run
        runs = {name: wait_for_terminal(api, run_id, serve) for name, run_id in created.items()}
        print(f"\ntwo micro flow runs: {time.monotonic() - t0:.1f} s from trigger to COMPLETED")
        for name, run in runs.items():
            state = run["state"]
            assert state["type"] == "COMPLETED", (
                f"{name} {state['type']}: {state.get('message')}\n"
                f"{flow_run_logs(api, run['id'])}\n{tail(serve.log)}"
            )
        wanted = ["evaluate ran; metrics"]
        logs = {name: wait_for_logs(api, run["id"], wanted) for name, run in runs.items()}
        task_runs = {name: task_runs_of(api, run["id"]) for name, run in runs.items()}
        progress = {
            name: api.post(
                "/artifacts/filter",
                json={"artifacts": {"flow_run_id": {"any_": [run["id"]]},
                                    "type": {"any_": ["progress"]}}},
            ).raise_for_status().json()
            for name, run in runs.items()
        }  # fmt: skip

    first, second = sorted(runs, key=lambda n: runs[n]["start_time"])
    for name in runs:  # the UI's progress bar: one artifact per run, ending at 100%
        assert [a["data"] for a in progress[name]] == [100.0], progress[name]
    for name in runs:
        assert [t["name"] for t in task_runs[name]] == stages
        assert {t["state"]["type"] for t in task_runs[name]} == {"COMPLETED"}
    # The first computes everything; the second restores from DVC's run-cache every stage whose
    # deps and params match (train.lr is read first by train@01) and computes the rest.
    assert set(stage_outcomes(logs[first], stages).values()) == {"ran"}
    upstream = ["generate", "warmstart", *(f"{s}@{rounds[0]}" for s in PER_ROUND[:3])]
    assert stage_outcomes(logs[second], stages) == {
        s: "restored" if s in upstream else "ran" for s in stages
    }

    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("rollwise")
    for name, lr in (("e2e-lr2", "0.0002"), ("e2e-lr3", "0.0003")):
        found = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")
        assert len(found) == 1
        mlrun = found[0]
        assert mlrun.info.status == "FINISHED"
        assert mlrun.data.params["train.lr"] == lr
        assert mlrun.data.params["override.train.lr"] == lr
        history = client.get_metric_history(mlrun.info.run_id, "rollout/reward_mean")
        assert sorted(m.step for m in history) == [int(r) for r in rounds]  # restored ones too
        assert "evaluate/final_success" in mlrun.data.metrics

    # The copy's workspace is untouched; each run lives in its own committed worktree, where a
    # `dvc repro` has nothing left to do.
    assert (project / "params.yaml").read_bytes() == params_before
    for path in ("data", "models", "dvc.lock", "mlflow.db", "mlruns"):
        assert not (project / path).exists(), path
    dvc = str(Path(sys.executable).parent / "dvc")
    for name, lr in (("e2e-lr2", 0.0002), ("e2e-lr3", 0.0003)):
        work = project / ".rollwise" / "runs" / name
        assert yaml.safe_load((work / "params.yaml").read_text())["train"]["lr"] == lr
        assert (work / "models" / f"round_{rounds[-1]}" / "config.json").exists()
        assert (work / "data" / "eval" / "report.md").exists()
        assert {p.stem for p in (work / "data" / "metrics").glob("*.json")} == set(stages)
        status = subprocess.run([dvc, "status"], cwd=work, capture_output=True, text=True)
        assert "up to date" in status.stdout, status.stdout + status.stderr
        branch = subprocess.run(["git", "log", "-1", "--format=%s", f"rollwise-runs/{name}"],
                                cwd=project, capture_output=True, text=True)  # fmt: skip
        assert branch.stdout.startswith(f"rollwise run {name}")
        committed = subprocess.run(["git", "status", "--porcelain"], cwd=work,
                                   capture_output=True, text=True)  # fmt: skip
        assert committed.stdout == ""  # params.yaml and dvc.lock are on the run's branch
    # The flow ran the same stages as dvc repro (tests/e2e/test_dvc_pipeline.py checks that one
    # the same way): a bench arm of the run's params gives the run's episodes, advantages, weights.
    assert_bench_arm_matches(project / ".rollwise" / "runs" / first, rounds)


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


def settled_task_runs(api: httpx.Client, run_id: str, n: int, timeout_s: float = 30.0) -> dict:
    """name -> task run, once all n have reported their end (states arrive as events)."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = {t["name"]: t for t in task_runs_of(api, run_id)}
        if len(runs) == n and all(t["end_time"] for t in runs.values()):
            return runs
        if time.monotonic() > deadline:
            pytest.fail(f"task runs not settled: {sorted(runs)}")
        time.sleep(0.5)


def test_lagged_rollout_overlaps_training(
    project: Path, prefect_server: str, mlflow_server: str, monkeypatch
):
    """rollout.policy_lag 1 through the flow: rollout@02 samples with round 00 while train@01
    trains (its Prefect task run overlaps train@01's), and the run is recorded as `dvc repro`
    would record it (nothing left to do). The micro stages take well under a second, so the two
    computations meet at a barrier first: a flow that ran them one after the other would break
    it (timeout) instead of leaving the overlap to luck."""
    import threading

    from prefect.settings import PREFECT_API_URL, temporary_settings

    import flows.pipeline as pipeline_module
    import flows.stages as stages_module

    meet = threading.Barrier(2, timeout=60)
    timed_stage = stages_module.timed_stage

    def meeting(stage: str, run, params, root: Path, r: str | None = None) -> dict:
        if f"{stage}@{r}" in ("rollout@02", "train@01"):
            meet.wait()
        return timed_stage(stage, run, params, root, r)

    monkeypatch.setattr(stages_module, "timed_stage", meeting)
    monkeypatch.setattr(pipeline_module, "ROOT", project)
    monkeypatch.setenv("PREFECT_API_URL", prefect_server)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    rounds = list(load_params(MICRO).rounds)
    lag = {"rollout.policy_lag": 1, "train.tis_cap": 2.0}
    t0 = time.monotonic()
    with temporary_settings({PREFECT_API_URL: prefect_server}):
        state = pipeline_module.pipeline(overrides=lag, run_name="e2e-lag", return_state=True)
    print(f"\nlagged micro flow run: {time.monotonic() - t0:.1f} s")
    assert state.is_completed(), state.message
    with httpx.Client(base_url=prefect_server, timeout=10) as api:
        runs = settled_task_runs(api, str(state.state_details.flow_run_id), 4 * len(rounds) + 3)

    def interval(name: str) -> tuple[str, str]:
        return runs[name]["start_time"], runs[name]["end_time"]  # ISO 8601 UTC: sortable

    rollout, train = interval("rollout@02"), interval("train@01")
    assert rollout[0] < train[1] and train[0] < rollout[1], (rollout, train)  # they overlap
    assert interval("curate@01")[1] <= rollout[0]  # and data dependencies still hold
    assert interval("train@01")[1] <= interval("train@02")[0]
    work = project / ".rollwise" / "runs" / "e2e-lag"
    sampled = yaml.safe_load((work / "data" / "metrics" / "rollout@02.json").read_text())
    assert sampled["policy_round"] == 0 and sampled["policy_lag"] == 1
    trained = yaml.safe_load((work / "data" / "metrics" / "train@02.json").read_text())
    assert trained["policy_lag"] == 1  # its batch came from round 00; it updates round 01
    dvc = str(Path(sys.executable).parent / "dvc")
    status = subprocess.run([dvc, "status"], cwd=work, capture_output=True, text=True)
    assert "up to date" in status.stdout, status.stdout + status.stderr
    # The overlap is in the running only: `dvc repro` of the same params, one stage at a time in
    # a fresh project, writes the same outputs (clock columns aside).
    from tests.e2e.test_crash_safety import fingerprint, outs_of

    serial = project.parent / "serial"
    for folder in ("src", "tasks", "flows"):
        shutil.copytree(project / folder, serial / folder)
    for name in ("dvc.yaml", ".gitignore"):
        shutil.copy(project / name, serial / name)
    for name in ("params.yaml", "rounds.yaml"):  # the flow's, overrides applied
        shutil.copy(work / name, serial / name)
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, **GIT_ENV, "DVC_NO_ANALYTICS": "1", "OMP_NUM_THREADS": "1",
           "MLFLOW_TRACKING_URI": f"sqlite:///{serial / 'mlflow.db'}", "PATH": path}  # fmt: skip
    for cmd in (["git", "init", "-q"], [dvc, "init", "-q"], [dvc, "repro"]):
        done = subprocess.run(cmd, cwd=serial, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for stage, out in outs_of(serial).items():
        assert fingerprint(out) == fingerprint(work / out.relative_to(serial)), stage
