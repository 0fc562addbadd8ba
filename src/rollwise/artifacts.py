"""Stage artifacts on disk, read and written so that nothing is lost: a missing or damaged
input names its file and the stage that writes it; an output is written into a sibling temp
folder (or file) and renamed, never left half-written. The library's evaluate/ and the stages
(tasks/common.py) share them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


class MissingUpstream(FileNotFoundError):
    """An input another stage should have written is not there."""


def require(path: Path, stage: str) -> Path:
    """A missing upstream artifact names the file and the stage that makes it."""
    if not path.exists():
        raise MissingUpstream(f"{path} is missing; it is written by the `{stage}` stage")
    return path


class CorruptArtifact(ValueError):
    """An input another stage wrote is there but unreadable (truncated, overwritten, bit rot)."""


def corrupt(path: Path, stage: str, error: BaseException) -> CorruptArtifact:
    return CorruptArtifact(
        f"{path} is unreadable ({type(error).__name__}: {error}); it is written by the "
        f"`{stage}` stage: rerun it with `dvc repro -f -s {stage}`"
    )


def read_table(path: Path, stage: str):
    """A parquet output of `stage`: missing or corrupted, the error names the file and stage."""
    import pandas as pd

    require(path, stage)
    try:
        return pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise corrupt(path, stage, e) from e


def read_json(path: Path, stage: str):
    """A JSON output of `stage`: missing or corrupted, the error names the file and stage."""
    require(path, stage)
    try:
        return json.loads(path.read_text())
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise corrupt(path, stage, e) from e


def _writer_alive(tmp: Path) -> bool:
    """Whether the process named in a `.name.tmp-PID` folder still runs (it may be writing)."""
    try:
        os.kill(int(tmp.name.rsplit("-", 1)[1]), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # someone else's live process
        pass
    return True


@contextlib.contextmanager
def atomic_dir(path: Path, keep_existing: bool = False) -> Iterator[Path]:
    """Write a stage output into a sibling temp folder, then rename: never a partial output.
    `keep_existing`: a cache two processes may fill at once; whoever finishes second drops its
    copy, so a reader of the first never sees it replaced."""
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # a killed writer's leftovers
        if not _writer_alive(stale):  # this process's own is cleared below
            shutil.rmtree(stale, ignore_errors=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_existing and path.exists():
        shutil.rmtree(tmp, ignore_errors=True)
        return
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # a killed writer's leftovers
        stale.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, default=float))
    os.replace(tmp, path)
