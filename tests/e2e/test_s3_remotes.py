"""DVC's remote and MLflow's artifact store on S3 (a moto server over real HTTP on loopback)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest
from mlflow.tracking import MlflowClient

from rollwise import track
from tests import servers
from tests.helpers import make_suite

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def new_bucket(endpoint: str) -> str:
    name = f"rw-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    return name


def keys(endpoint: str, bucket: str, prefix: str) -> list[str]:
    client = boto3.client("s3", endpoint_url=endpoint)
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def sh(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{cmd}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout


def test_dvc_push_then_pull_into_a_clean_clone(tmp_path: Path, s3_server: str):
    repo, clone = tmp_path / "repo", tmp_path / "clone"
    assert REPO not in tmp_path.parents  # git and DVC must not nest in the main repo
    repo.mkdir()
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "DVC_NO_ANALYTICS": "1",
        "GIT_AUTHOR_NAME": "test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
    }  # credentials: the dummy AWS_* keys conftest put in the environment
    bucket = new_bucket(s3_server)
    dvc = str(BIN / "dvc")
    sh(["git", "init", "-q"], repo, env)
    sh([dvc, "init", "-q"], repo, env)
    make_suite(repo / "data" / "envs")
    sh([dvc, "add", "-q", "data/envs"], repo, env)
    sh([dvc, "remote", "add", "-d", "store", f"s3://{bucket}/dvcstore"], repo, env)
    sh([dvc, "remote", "modify", "store", "endpointurl", s3_server], repo, env)
    sh(["git", "add", "-A"], repo, env)
    sh(["git", "commit", "-q", "-m", "suite on an S3 remote"], repo, env)
    sh([dvc, "push"], repo, env)
    original = tree_bytes(repo / "data" / "envs")
    pushed = keys(s3_server, bucket, "dvcstore/")
    assert len(pushed) >= len(original) + 1  # every file plus the directory listing (.dir)

    sh(["git", "clone", "-q", str(repo), str(clone)], tmp_path, env)
    assert not (clone / "data" / "envs").exists()
    assert not (clone / ".dvc" / "cache").exists()  # the pull can only come from S3
    sh([dvc, "pull"], clone, env)
    assert tree_bytes(clone / "data" / "envs") == original
    assert "up to date" in sh([dvc, "status"], clone, env).lower()


def test_mlflow_artifacts_land_in_the_bucket(
    tmp_path: Path, s3_server: str, monkeypatch: pytest.MonkeyPatch
):
    bucket = new_bucket(s3_server)
    server = servers.start_mlflow(
        tmp_path / "mlflow", artifacts_destination=f"s3://{bucket}/mlflow", s3_endpoint=s3_server
    )
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
        root = tmp_path / "project"
        report = root / "data" / "eval" / "report.md"
        report.parent.mkdir(parents=True)
        report.write_text("# Held-out evaluation\n\nstored on S3\n")
        run_id = track.open_run(root, {"storage": "s3"}, run_name="s3-artifacts", fresh=True)
        track.log_artifacts(run_id, [report], "eval", root=root)
        track.finish_run(run_id, root=root)
        assert not track.buffer_path(root).exists()  # nothing was parked for a later replay

        landed = [k for k in keys(s3_server, bucket, "mlflow/") if k.endswith("/report.md")]
        assert len(landed) == 1, landed
        assert landed[0].endswith(f"/{run_id}/artifacts/eval/report.md")
        body = boto3.client("s3", endpoint_url=s3_server).get_object(Bucket=bucket, Key=landed[0])
        assert body["Body"].read() == report.read_bytes()
        listed = MlflowClient(server.url).list_artifacts(run_id, "eval")
        assert [a.path for a in listed] == ["eval/report.md"]
    finally:
        servers.stop(server)
