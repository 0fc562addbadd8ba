"""Real Prefect, MLflow and S3 (moto) servers on 127.0.0.1 for tests (and anything else that
needs them).

Each server is started from the venv that runs the tests, in its own process group, with its
state and logs in a caller-given folder; `stop` kills the whole group (mlflow and prefect both
fork workers).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent  # the venv running the tests owns the server executables
HEALTH_TIMEOUT_S = 60.0
QUIET_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "HF_HUB_OFFLINE": "1",
    "RAY_AUTH_MODE": "disabled",
}


@dataclass
class Server:
    """A running server: its URL for clients, its process, its log file."""

    name: str
    url: str
    proc: subprocess.Popen
    log: Path
    started_s: float  # seconds from launch to healthy


def free_port() -> int:
    """A port nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name: str, cmd: list[str], env: dict[str, str], health: str, url: str, log: Path):
    """Launch `cmd` in a new process group and wait until GET `health` answers 200."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            cmd,
            env={**os.environ, **QUIET_ENV, **env},
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = Server(name, url, proc, log, 0.0)
    try:
        _wait_healthy(server, health)
    except BaseException:
        stop(server)
        raise
    server.started_s = time.monotonic() - t0
    return server


def _wait_healthy(server: Server, health: str) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"{server.name} exited with {server.proc.returncode}\n{_tail(server)}"
            )
        try:
            with urllib.request.urlopen(health, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise TimeoutError(
        f"{server.name} not healthy at {health} after {HEALTH_TIMEOUT_S:.0f} s\n{_tail(server)}"
    )


def _tail(server: Server, lines: int = 40) -> str:
    text = server.log.read_text(errors="replace") if server.log.exists() else ""
    return f"--- last lines of {server.log} ---\n" + "\n".join(text.splitlines()[-lines:])


def stop(server: Server, grace_s: float = 10.0) -> None:
    """SIGTERM the server's process group, SIGKILL it if still alive after `grace_s`."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(server.proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.proc.wait(timeout=wait)
            # the leader is gone; workers may linger in the group: make sure they go too
            os.killpg(server.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
        return


def start_prefect(home: Path, port: int | None = None) -> Server:
    """`prefect server start` with its database and settings under `home`.

    The UI is told its API's URL (PREFECT_UI_API_URL): unset, Prefect hands the browser :4200
    whatever the port, and the UI on any other port cannot reach its API.
    """
    port = port or free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        "PREFECT_HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "PREFECT_UI_API_URL": base + "/api",
    }
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    cmd = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    return start("prefect", cmd, env, f"{base}/api/health", f"{base}/api", home / "server.log")


def start_mlflow(
    root: Path,
    port: int | None = None,
    artifacts_destination: str | None = None,
    s3_endpoint: str | None = None,
) -> Server:
    """`mlflow server` (2 processes) with a sqlite store under `root`.

    Artifacts go under `root` too, unless `artifacts_destination` (e.g. s3://bucket/prefix) is
    given: then the server proxies them there (clients need no S3 access), talking to the S3
    at `s3_endpoint` (MLFLOW_S3_ENDPOINT_URL) with the AWS_* credentials of the environment.
    """
    port = port or free_port()
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    if s3_endpoint:
        env["MLFLOW_S3_ENDPOINT_URL"] = s3_endpoint
    root.mkdir(parents=True, exist_ok=True)
    artifacts = (
        ["--artifacts-destination", artifacts_destination]
        if artifacts_destination
        else ["--default-artifact-root", str(root / "artifacts")]
    )
    cmd = [
        str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
        *artifacts,
        "--workers", "1",
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    return start("mlflow", cmd, env, f"{base}/health", base, root / "server.log")


def start_moto(root: Path, port: int | None = None) -> Server:
    """`moto_server`: an in-memory S3 over real HTTP, so boto3, DVC (s3fs) and MLflow all talk
    to it as they would to AWS (endpoint http://127.0.0.1:P, path-style, any credentials)."""
    port = port or free_port()
    cmd = [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)]
    base = f"http://127.0.0.1:{port}"
    return start("moto", cmd, {}, f"{base}/moto-api/", base, root / "server.log")
