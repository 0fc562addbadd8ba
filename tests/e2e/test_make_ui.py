"""`make ui` (scripts/ui.sh) on non-default ports, as a new user meets it.

ui.sh runs in a scratch root (its own .rollwise/ and mlflow.db) that links to this venv and the
project's flows/ and tasks/. Once the deployments are served, the Prefect UI must hand the
browser the API on the chosen port (GET /ui-settings, what the UI fetches first), and a SIGTERM
to the script alone, as another script would send it, must end every process it started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests import servers

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SERVE_TIMEOUT_S = 150.0
STOP_TIMEOUT_S = 60.0  # ui.sh gives each of its three process groups 10 s after TERM


def fetch(url: str) -> bytes | None:
    """The body of GET `url`, None if nothing answers there (or not with 200)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.read()
    except (urllib.error.URLError, OSError):
        return None


def children(pid: int) -> list[int]:
    """Pids whose parent is `pid` (ui.sh's setsid'd children: each leads its own group)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A scratch project root for ui.sh: the script, this venv as .venv, flows/ and tasks/."""
    root = tmp_path / "project"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "ui.sh", root / "scripts" / "ui.sh")
    (root / ".venv").symlink_to(Path(sys.executable).parent.parent)
    for folder in ("flows", "tasks"):
        (root / folder).symlink_to(REPO / folder)
    return root


def test_ui_on_other_ports_reaches_its_api_and_stops_on_term(root: Path):
    prefect_port, mlflow_port = servers.free_port(), servers.free_port()
    env = {
        **os.environ,
        "PREFECT_PORT": str(prefect_port),
        "MLFLOW_PORT": str(mlflow_port),
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(root)]),
    }
    env.pop("PREFECT_API_URL", None)  # the script must set it itself
    base = f"http://127.0.0.1:{prefect_port}"
    log = root / "ui.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            ["bash", str(root / "scripts" / "ui.sh")],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    groups: list[int] = []
    try:
        deployment = f"{base}/api/deployments/name/rollwise-pipeline/pipeline"
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while fetch(deployment) is None:
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(1.0)
        groups = children(proc.pid)
        assert json.loads(fetch(f"{base}/ui-settings") or b"{}").get("api_url") == f"{base}/api"
        assert fetch(f"http://127.0.0.1:{mlflow_port}/health") is not None
        assert len(groups) == 3, groups  # prefect server, mlflow server, flows.serve

        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)  # the script only, not its group
        assert proc.wait(timeout=STOP_TIMEOUT_S) == 143
        stop_s = time.monotonic() - t0
        assert not [pg for pg in groups if group_alive(pg)], stop_s
        assert fetch(f"{base}/api/health") is None
    finally:  # whatever failed, nothing it started outlives the test
        for pg in [proc.pid, *(groups or children(proc.pid))]:
            if group_alive(pg):
                os.killpg(pg, signal.SIGKILL)
        proc.wait(timeout=10)
