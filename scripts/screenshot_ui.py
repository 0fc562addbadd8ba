"""Screenshots of the two UIs for docs/ui.md, taken from real servers on 127.0.0.1.

Starts Prefect and MLflow servers, serves the deployments from a git+DVC copy of the project
with the micro params (tests/e2e/micro_params.yaml, ~2 minutes on 2 cores) as `make ui` serves
them, and points headless Chromium (Debian's `chromium` package) at:
  prefect-run-form.png   the `pipeline` deployment's run form
  prefect-flow-run.png   a finished flow run: its stages as task runs
  mlflow-metrics.png     that run in MLflow, the per-round metric charts (step = round)

    .venv/bin/python scripts/screenshot_ui.py [--out-dir docs] [--form-only]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import servers  # noqa: E402

MICRO = ROOT / "tests" / "e2e" / "micro_params.yaml"
FLOW, DEPLOYMENT, RUN_NAME = "rollwise-pipeline", "pipeline", "micro"
ML_VIEW = "workflowType=machine_learning"  # MLflow's UI: the "Model training" toggle
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
# The last flag: without it MLflow's metric charts are still spinners when the shot is taken.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--hide-scrollbars", "--virtual-time-budget=30000",
                  "--run-all-compositor-stages-before-draw"]  # fmt: skip


def api(base: str, path: str, body: dict | None = None) -> dict | list:
    """GET (or POST `body` as JSON to) the Prefect API."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(base + path, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def make_project(root: Path) -> Path:
    """A git+DVC copy of the project's code with the micro params as params.yaml."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("src", "tasks", "flows"):
        shutil.copytree(ROOT / folder, root / folder, ignore=ignore)
    shutil.copy(ROOT / "dvc.yaml", root / "dvc.yaml")
    shutil.copy(MICRO, root / "params.yaml")
    (root / ".gitignore").write_text("__pycache__/\nmlflow.db\nmlruns/\n.rollwise/\n")
    who = {"GIT_AUTHOR_NAME": "rollwise", "GIT_AUTHOR_EMAIL": "rollwise@localhost"}
    env = {**os.environ, **who, "GIT_COMMITTER_NAME": "rollwise",
           "GIT_COMMITTER_EMAIL": "rollwise@localhost"}  # fmt: skip
    dvc = str(servers.BIN / "dvc")
    for cmd in (["git", "init", "-q"], [dvc, "init", "-q"], ["git", "add", "-A"],
                ["git", "commit", "-q", "-m", "project"]):  # fmt: skip
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True)
    return root


def start_serve(project: Path, prefect: servers.Server, mlflow: servers.Server) -> servers.Server:
    """`python -m flows.serve` in `project`, as `make ui` runs it (its own process group)."""
    state = project.parent / "serve"
    (state / "tmp").mkdir(parents=True)
    env = {**os.environ, **servers.QUIET_ENV, "PREFECT_API_URL": prefect.url,
           "MLFLOW_TRACKING_URI": mlflow.url, "PREFECT_HOME": str(state / "home"),
           "TMPDIR": str(state / "tmp"), "OMP_NUM_THREADS": "1",
           "PREFECT_RUNNER_POLL_FREQUENCY": "1",
           "PYTHONPATH": os.pathsep.join([str(project / "src"), str(project)])}  # fmt: skip
    log = state / "serve.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "flows.serve"], cwd=project, env=env,
                                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
    return servers.Server("flows.serve", prefect.url, proc, log, 0.0)


def wait_for(what: str, check, serve: servers.Server, timeout_s: float):
    """Poll `check()` until it returns something; fail if serve dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if serve.proc.poll() is not None:
            raise SystemExit(f"flows.serve exited while waiting for {what}; see {serve.log}")
        try:
            if found := check():
                return found
        except OSError:
            pass
        time.sleep(1.0)
    raise SystemExit(f"no {what} after {timeout_s:.0f} s; see {serve.log}")


def shoot(browser: str, url: str, out: Path, size: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [browser, *CHROMIUM_FLAGS, f"--window-size={size}", f"--screenshot={out.resolve()}", url]
    subprocess.run(cmd, check=True, capture_output=True, timeout=180)
    print(f"{out} <- {url}", flush=True)


def finished_run(base: str, deployment_id: str, serve: servers.Server) -> dict:
    """Trigger the `pipeline` deployment as the UI's Run button does; wait until it ends."""
    run_id = api(base, f"/deployments/{deployment_id}/create_flow_run",
                 {"parameters": {}, "name": RUN_NAME})["id"]  # fmt: skip
    t0 = time.monotonic()

    def ended() -> dict | None:
        run = api(base, f"/flow_runs/{run_id}")
        return run if run["state"] and run["state"]["type"] in TERMINAL else None

    run = wait_for("finished flow run", ended, serve, 900.0)
    print(f"flow run {RUN_NAME}: {run['state']['type']} in {time.monotonic() - t0:.0f} s")
    if run["state"]["type"] != "COMPLETED":
        raise SystemExit(f"flow run {run['state']['type']}: {run['state'].get('message')}")
    return run


def mlflow_page(uri: str) -> str:
    """The MLflow run page's metric charts of the run named RUN_NAME, in the UI's "Model
    training" mode (MLflow 3.17's UI opens in GenAI mode whatever the experiment's kind tag)."""
    from mlflow.tracking import MlflowClient

    from rollwise import track

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(track.EXPERIMENT)
    (run,) = client.search_runs([exp.experiment_id], f"attributes.run_name = '{RUN_NAME}'")
    return f"{uri}/#/experiments/{exp.experiment_id}/runs/{run.info.run_id}/model-metrics?{ML_VIEW}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", type=Path, default=ROOT / "docs")
    parser.add_argument("--form-only", action="store_true", help="only prefect-run-form.png")
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        raise SystemExit("error: no chromium on PATH (Debian: apt-get install chromium)")
    work = Path(tempfile.mkdtemp(prefix="rollwise-shot-"))
    os.environ.update(PREFECT_HOME=str(work / "home"), **servers.QUIET_ENV)
    started: list[servers.Server] = []
    try:
        started.append(prefect := servers.start_prefect(work / "prefect"))
        started.append(mlflow := servers.start_mlflow(work / "mlflow"))
        started.append(serve := start_serve(make_project(work / "project"), prefect, mlflow))
        ui = prefect.url.removesuffix("/api")
        deployment = wait_for(
            "deployment", lambda: api(prefect.url, f"/deployments/name/{FLOW}/{DEPLOYMENT}"),
            serve, 180.0,
        )  # fmt: skip
        form = f"{ui}/deployments/deployment/{deployment['id']}/run"
        shoot(browser, form, args.out_dir / "prefect-run-form.png", "1280,1500")
        if args.form_only:
            return
        run = finished_run(prefect.url, deployment["id"], serve)
        shoot(browser, f"{ui}/runs/flow-run/{run['id']}", args.out_dir / "prefect-flow-run.png",
              "1400,1000")  # fmt: skip
        shoot(browser, mlflow_page(mlflow.url), args.out_dir / "mlflow-metrics.png", "1400,1100")
    finally:
        for server in reversed(started):  # serve first, while the servers it talks to are up
            servers.stop(server)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
