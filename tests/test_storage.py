"""rollwise.storage against a real S3 API (moto over HTTP), a bad URL, and an S3 that is down."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import pandas as pd
import pytest

from rollwise import storage
from tests import servers
from tests.helpers import make_suite


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Relative path -> content of every file under `root`."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def leftovers(dest: Path) -> list[str]:
    """Temp or backup siblings that fetch must never leave behind."""
    return [p.name for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}.")]


@pytest.fixture
def bucket(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on the moto server, with boto3 pointed at it; returns `s3://name`."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)
    name = f"rw-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=name)
    return f"s3://{name}"


@pytest.mark.e2e
def test_suite_round_trip_is_byte_identical(tmp_path: Path, bucket: str):
    suite = tmp_path / "envs"
    make_suite(suite)
    keys = storage.publish(suite, f"{bucket}/suites/small")
    files = tree_bytes(suite)
    assert len(files) >= 10  # catalog + 3 envs x (state, tools, tasks)
    expected = {f"suites/small/{rel}" for rel in files} | {f"suites/small/{storage.MANIFEST}"}
    assert set(keys) == expected
    assert keys[-1].endswith(storage.MANIFEST)  # the manifest goes up last
    listed = boto3.client("s3").list_objects_v2(Bucket=bucket.removeprefix("s3://"))
    assert {o["Key"] for o in listed["Contents"]} == expected

    out = tmp_path / "fetched" / "envs"
    out.mkdir(parents=True)
    (out / "stale.txt").write_text("from an older fetch")
    fetched = storage.fetch(f"{bucket}/suites/small/", out)
    assert tree_bytes(out) == files  # byte-identical, and the stale file is gone
    assert sorted(p.relative_to(out).as_posix() for p in fetched) == sorted(files)
    assert leftovers(out) == []


@pytest.mark.e2e
def test_success_bank_through_the_cli(tmp_path: Path, bucket: str):
    bank = tmp_path / "curated" / "round_01" / "success_bank.parquet"
    bank.parent.mkdir(parents=True)
    pd.DataFrame(
        {
            "task_id": ["t1", "t2"],
            "episode_id": ["e1", "e2"],
            "round": [1, 1],
            "reward": [1.0, 0.75],
            "token_ids": [[1, 2, 3], [4, 5]],
            "prompt_len": [2, 1],
        }
    ).to_parquet(bank)
    url = f"{bucket}/banks/round_01"
    cli = [sys.executable, "-m", "rollwise.storage"]
    env = {**os.environ}  # carries AWS_ENDPOINT_URL_S3 from the fixture
    up = subprocess.run([*cli, "publish", str(bank), url], env=env, capture_output=True, text=True)
    assert up.returncode == 0, up.stderr
    assert up.stdout.split() == [
        "banks/round_01/success_bank.parquet",
        f"banks/round_01/{storage.MANIFEST}",
    ]
    out = tmp_path / "bank"
    down = subprocess.run([*cli, "fetch", url, str(out)], env=env, capture_output=True, text=True)
    assert down.returncode == 0, down.stderr
    assert tree_bytes(out) == {"success_bank.parquet": bank.read_bytes()}
    assert pd.read_parquet(out / "success_bank.parquet")["reward"].tolist() == [1.0, 0.75]


@pytest.mark.e2e
def test_changed_object_fails_fetch_and_leaves_dest_alone(tmp_path: Path, bucket: str):
    suite = tmp_path / "envs"
    make_suite(suite)
    storage.publish(suite, f"{bucket}/suite")
    catalog = tree_bytes(suite)["catalog.parquet"]
    boto3.client("s3").put_object(
        Bucket=bucket.removeprefix("s3://"), Key="suite/catalog.parquet", Body=catalog[:-1]
    )
    out = tmp_path / "envs-copy"
    out.mkdir()
    (out / "keep.txt").write_text("the previous fetch")
    with pytest.raises(storage.StorageError, match=r"catalog\.parquet.*sha256"):
        storage.fetch(f"{bucket}/suite", out)
    assert tree_bytes(out) == {"keep.txt": b"the previous fetch"}
    assert leftovers(out) == []


@pytest.mark.e2e
def test_nothing_published_and_missing_bucket(tmp_path: Path, bucket: str):
    out = tmp_path / "out"
    with pytest.raises(storage.StorageError, match="nothing published at .*/empty"):
        storage.fetch(f"{bucket}/empty", out)
    assert not out.exists() and leftovers(out) == []
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(storage.StorageError, match="bucket 'rw-no-such-bucket' .* does not exist"):
        storage.publish(tmp_path / "f.txt", "s3://rw-no-such-bucket/x")


@pytest.mark.parametrize(
    "url",
    ["data/envs", "/abs/path", "http://host/x", "s3://", "s3:///prefix", "s3://Bad_Bucket/x",
     "s3://bucket/a//b", "s3://bucket/a/../b"],
)  # fmt: skip
def test_bad_url_is_a_clear_value_error(tmp_path: Path, url: str):
    with pytest.raises(ValueError, match=r"s3://|bucket|prefix") as err:
        storage.fetch(url, tmp_path / "out")
    assert url in str(err.value)
    with pytest.raises(ValueError):
        storage.publish(tmp_path, url)
    assert not (tmp_path / "out").exists()


def test_parse_url():
    assert storage.parse_url("s3://bucket/a/b/") == ("bucket", "a/b")
    assert storage.parse_url("s3://my.bucket-1") == ("my.bucket-1", "")


def test_s3_down_retries_with_backoff_then_names_url_and_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    endpoint = f"http://127.0.0.1:{servers.free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "catalog.parquet").write_bytes(b"x")
    url = "s3://rw-down/suite"
    t0 = time.monotonic()
    with pytest.raises(storage.S3Unreachable) as err:
        storage.publish(tmp_path / "suite", url, attempts=3, backoff_s=0.1)
    elapsed = time.monotonic() - t0
    message = str(err.value)
    assert url in message and endpoint in message and "after 3 attempts" in message
    assert isinstance(err.value, ConnectionError)  # transient for callers' retry policies
    assert elapsed >= 0.1 + 0.2  # two backoff waits, doubling
    assert capsys.readouterr().err.count("retry ") == 2

    out = tmp_path / "out"
    with pytest.raises(storage.S3Unreachable, match="after 2 attempts"):
        storage.fetch(url, out, attempts=2, backoff_s=0.01)
    assert not out.exists() and leftovers(out) == []
