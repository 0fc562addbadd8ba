"""Publish and fetch environment suites and success banks at s3:// URLs (boto3).

Why it looks the way it does:
- The endpoint is boto3's own: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (a local S3-compatible
  server in tests, AWS when unset), so nothing here knows about moto or MinIO.
- `publish` uploads the files, then a manifest (relative path, size, sha256) last, after deleting
  the previous one first: a reader sees either a complete publish or none, never a half one.
  `fetch` downloads exactly the manifest's files, checks every hash, and renames a sibling temp
  folder into place, so nothing half-written ever sits at the output path. Keys under the
  prefix that the manifest does not list are ignored (publish never deletes them: it may share
  a prefix with other data).
- One retry policy, visible here: connection errors, timeouts and 5xx/throttling answers are
  retried per object with exponential backoff, then `S3Unreachable` names the URL and the
  endpoint. botocore's own retries are off so the two never multiply each other's waits.
  `S3Unreachable` is a ConnectionError, so callers (Prefect task retries) can treat it as
  transient.
- Objects go up in one PUT each (up to 5 GB): suites and banks are megabytes.

This module imports neither prefect nor dvc.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TypeVar
from urllib.parse import urlsplit

import boto3
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

MANIFEST = ".rollwise-manifest.json"
ATTEMPTS = 5  # per object: waits of 1, 2, 4, 8 s between them (15 s) before giving up
BACKOFF_S = 1.0
MAX_BACKOFF_S = 20.0
_CHUNK = 1 << 20
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_RETRY_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError"}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
T = TypeVar("T")


class StorageError(RuntimeError):
    """S3 answered, but not with what was asked for (missing bucket or manifest, bad hash)."""


class S3Unreachable(StorageError, ConnectionError):
    """S3 could not be reached after every retry: transient, worth retrying later."""


# ---------------------------------------------------------------------------- URLs and client


def parse_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix"); ValueError on anything else.

    Checked before any request so a typo fails at once instead of after the retries.
    """
    parts = urlsplit(url)
    if parts.scheme != "s3":
        raise ValueError(f"not an s3:// URL: {url!r} (expected s3://bucket/prefix)")
    if not parts.netloc:
        raise ValueError(f"no bucket in {url!r} (expected s3://bucket/prefix)")
    if not _BUCKET.match(parts.netloc):
        raise ValueError(
            f"bad bucket name {parts.netloc!r} in {url!r}: "
            "3-63 characters, lowercase letters, digits, '.' and '-'"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"s3 URL {url!r} must not carry '?' or '#'")
    prefix = parts.path.strip("/")
    if prefix and any(seg in ("", ".", "..") for seg in prefix.split("/")):
        raise ValueError(f"bad key prefix {prefix!r} in {url!r}: empty, '.' or '..' segment")
    return parts.netloc, prefix


def s3_client() -> BaseClient:
    """A boto3 S3 client on the configured endpoint, with botocore's own retries off."""
    config = Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=5,
        read_timeout=60,
    )
    return boto3.session.Session().client("s3", config=config)


def _key(prefix: str, rel: str) -> str:
    return f"{prefix}/{rel}" if prefix else rel


# ---------------------------------------------------------------------------- public API


def publish(
    src: Path | str, url: str, *, attempts: int = ATTEMPTS, backoff_s: float = BACKOFF_S
) -> list[str]:
    """Upload a folder (a suite) or one file (a success bank) under `url`; returns the keys.

    The manifest goes up last and is the one key `fetch` trusts, so an interrupted publish is
    seen as "nothing published" rather than as a mix of old and new files.
    """
    bucket, prefix = parse_url(url)
    src = Path(src)
    if not src.exists():
        raise FileNotFoundError(f"nothing to publish: {src} does not exist")
    files = _local_files(src)
    if MANIFEST in files:
        raise ValueError(f"{src} contains a file named {MANIFEST}, which publish reserves")
    client = s3_client()
    retry = _Retry(client, url, attempts, backoff_s)
    manifest_key = _key(prefix, MANIFEST)
    retry("delete the old manifest", lambda: client.delete_object(Bucket=bucket, Key=manifest_key))
    entries: dict[str, dict] = {}
    keys = []
    for rel, path in files.items():
        entries[rel] = {"size": path.stat().st_size, "sha256": _sha256(path)}
        key = _key(prefix, rel)
        retry(f"upload {rel}", lambda key=key, path=path: _put_file(client, bucket, key, path))
        keys.append(key)
    body = json.dumps({"format": 1, "files": entries}, indent=1, sort_keys=True).encode()
    retry(
        "upload the manifest",
        lambda: client.put_object(Bucket=bucket, Key=manifest_key, Body=body),
    )
    return [*keys, manifest_key]


def fetch(
    url: str, dest: Path | str, *, attempts: int = ATTEMPTS, backoff_s: float = BACKOFF_S
) -> list[Path]:
    """Download what `publish` put under `url` into the folder `dest`; returns the files.

    Everything lands in a sibling temp folder first and is hash-checked; only then is `dest`
    replaced by it, so a failure leaves `dest` as it was.
    """
    bucket, prefix = parse_url(url)
    dest = Path(dest)
    client = s3_client()
    retry = _Retry(client, url, attempts, backoff_s)
    manifest_key = _key(prefix, MANIFEST)
    raw = retry(
        "read the manifest",
        lambda: client.get_object(Bucket=bucket, Key=manifest_key)["Body"].read(),
    )
    entries = json.loads(raw)["files"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for rel, meta in sorted(entries.items()):
            target = tmp / _safe_rel(rel, url)
            target.parent.mkdir(parents=True, exist_ok=True)
            key = _key(prefix, rel)
            digest = retry(
                f"download {rel}",
                lambda key=key, target=target: _get_file(client, bucket, key, target),
            )
            size = target.stat().st_size
            if (size, digest) != (meta["size"], meta["sha256"]):
                raise StorageError(
                    f"{url}/{rel}: got {size} bytes with sha256 {digest[:12]}, the manifest says "
                    f"{meta['size']} bytes with sha256 {meta['sha256'][:12]} "
                    "(changed since it was published, or a publish is in progress)"
                )
        _swap(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [dest / rel for rel in sorted(entries)]


# ---------------------------------------------------------------------------- files


def _local_files(src: Path) -> dict[str, Path]:
    """Relative POSIX path -> file, sorted; a single file publishes as itself."""
    if src.is_file():
        return {src.name: src}
    found = sorted(p for p in src.rglob("*") if p.is_file())
    return {p.relative_to(src).as_posix(): p for p in found}


def _safe_rel(rel: str, url: str) -> PurePosixPath:
    """A manifest path must stay inside the output folder."""
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise StorageError(f"{url}: manifest lists an unsafe path {rel!r}")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _put_file(client: BaseClient, bucket: str, key: str, path: Path) -> None:
    with path.open("rb") as fh:
        client.put_object(Bucket=bucket, Key=key, Body=fh)


def _get_file(client: BaseClient, bucket: str, key: str, target: Path) -> str:
    """Stream one object to `target` (whole object again on a retry); returns its sha256."""
    h = hashlib.sha256()
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    with target.open("wb") as fh:
        for chunk in body.iter_chunks(_CHUNK):
            h.update(chunk)
            fh.write(chunk)
    return h.hexdigest()


def _swap(tmp: Path, dest: Path) -> None:
    """Put `tmp` at `dest`; the old `dest` is moved aside first and removed last."""
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    if dest.exists() or dest.is_symlink():
        os.replace(dest, old)
    os.replace(tmp, dest)
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- retries


class _Retry:
    """Run one S3 call with backoff on transient errors; translate the rest into clear errors."""

    def __init__(self, client: BaseClient, url: str, attempts: int, backoff_s: float):
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.client, self.url, self.attempts, self.backoff_s = client, url, attempts, backoff_s

    def __call__(self, what: str, call: Callable[[], T]) -> T:
        endpoint = self.client.meta.endpoint_url
        attempt, waited = 0, 0.0
        while True:
            attempt += 1
            try:
                return call()
            except NoCredentialsError as exc:
                raise StorageError(
                    f"{what} at {self.url}: no AWS credentials (set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY, or a profile)"
                ) from exc
            except (BotoConnectionError, HTTPClientError, ClientError) as exc:
                if not _transient(exc):
                    raise _client_error(what, self.url, endpoint, exc) from exc
                if attempt == self.attempts:
                    raise S3Unreachable(
                        f"S3 unreachable: {what} at {self.url} (endpoint {endpoint}) failed "
                        f"after {attempt} attempts and {waited:.1f} s of backoff: {exc}"
                    ) from exc
                wait = min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
                print(
                    f"rollwise.storage: {what} at {self.url} failed ({exc}); "
                    f"retry {attempt}/{self.attempts - 1} in {wait:.1f} s",
                    file=sys.stderr,
                )
                time.sleep(wait)
                waited += wait


def _transient(exc: BotoCoreError | ClientError) -> bool:
    if not isinstance(exc, ClientError):
        return True  # connection refused/reset, timeouts, a stream cut mid-body
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return status >= 500 or exc.response.get("Error", {}).get("Code") in _RETRY_CODES


def _client_error(what: str, url: str, endpoint: str, exc: BaseException) -> StorageError:
    code = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else None
    bucket = parse_url(url)[0]
    if code == "NoSuchBucket":
        return StorageError(f"{what}: bucket {bucket!r} of {url} does not exist at {endpoint}")
    if code in _MISSING_CODES and "manifest" in what:
        return StorageError(
            f"nothing published at {url} (endpoint {endpoint}): no {MANIFEST} there "
            "(publish writes it last, so an interrupted publish has none)"
        )
    return StorageError(f"{what} at {url} (endpoint {endpoint}) failed: {exc}")


# ---------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """`python -m rollwise.storage publish SRC s3://...` or `fetch s3://... DEST`."""
    parser = argparse.ArgumentParser(
        prog="python -m rollwise.storage",
        description="Publish a folder or file at an s3:// URL, or fetch one into a folder.",
    )
    parser.add_argument("command", choices=["publish", "fetch"])
    parser.add_argument("src", help="publish: a local folder or file; fetch: an s3:// URL")
    parser.add_argument("dst", help="publish: an s3:// URL; fetch: the local output folder")
    parser.add_argument("--attempts", type=int, default=ATTEMPTS, help="tries per object")
    parser.add_argument("--backoff", type=float, default=BACKOFF_S, help="first wait, seconds")
    args = parser.parse_args(argv)
    retry = {"attempts": args.attempts, "backoff_s": args.backoff}
    try:
        if args.command == "publish":
            for key in publish(args.src, args.dst, **retry):
                print(key)
        else:
            files = fetch(args.src, args.dst, **retry)
            print(f"fetched {len(files)} file(s) into {args.dst}")
    except (ValueError, FileNotFoundError, StorageError) as exc:
        print(f"rollwise.storage: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
