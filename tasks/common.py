"""Stage plumbing shared by every task module: paths, params, atomic outputs, metrics, logging."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rollwise import track
from rollwise.config import Params, ParamsError, load_params


def envs_dir(root: Path) -> Path:
    return root / "data" / "envs"


def model_dir(root: Path, r: str) -> Path:
    return root / "models" / f"round_{r}"


def round_dir(root: Path, kind: str, r: str) -> Path:
    return root / "data" / kind / f"round_{r}"


def metrics_path(root: Path, stage: str) -> Path:
    return root / "data" / "metrics" / f"{stage}.json"


class MissingUpstream(FileNotFoundError):
    """An input another stage should have written is not there."""


def require(path: Path, stage: str) -> Path:
    """A missing upstream artifact names the file and the stage that makes it."""
    if not path.exists():
        raise MissingUpstream(f"{path} is missing; it is written by the `{stage}` stage")
    return path


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Write a stage output into a sibling temp folder, then rename: never a partial output."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, default=float))
    os.replace(tmp, path)


def log(stage: str, message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {stage}: {message}", flush=True)


def finish_stage(root: Path, params: Params, stage: str, metrics: dict, step: int | None) -> None:
    """Write the stage's DVC metrics file and log the same numbers to the pipeline's MLflow run."""
    write_json(metrics_path(root, stage), metrics)
    name = stage.split("@")[0]
    numeric = {f"{name}/{k}": float(v) for k, v in metrics.items() if isinstance(v, int | float)}
    run_id = track.open_run(root, params.model_dump())
    track.log_metrics(run_id, numeric, step=step, root=root)


def stage_main(stage: str, run, with_round: bool = False) -> None:
    """`python -m tasks.<stage> [--round NN] [--root DIR]`: validate params, run, record."""
    parser = argparse.ArgumentParser(prog=f"tasks.{stage}")
    parser.add_argument("--root", type=Path, default=Path("."))
    if with_round:
        parser.add_argument("--round", required=True)
    args = parser.parse_args()
    try:
        params = load_params(args.root / "params.yaml")
    except ParamsError as e:
        sys.exit(f"error: {e}")
    # torch reads this when first imported; one thread unless told otherwise (stack-notes.md:
    # 2-thread torch collapses when servers share the two cores).
    os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("ROLLWISE_TORCH_THREADS", "1"))
    try:
        metrics = timed_stage(stage, run, params, args.root, args.round if with_round else None)
    except MissingUpstream as e:
        sys.exit(f"error: {e}")
    name = f"{stage}@{args.round}" if with_round else stage
    log(name, f"done in {metrics['wall_s']:.1f}s")


def timed_stage(stage: str, run, params: Params, root: Path, r: str | None = None) -> dict:
    """Run one stage (per-round when `r` is given), add its wall time, record its metrics.
    The one path for both `dvc repro` (stage_main) and the Prefect flow."""
    t0 = time.perf_counter()
    metrics = run(params, root) if r is None else run(params, root, r)
    metrics["wall_s"] = time.perf_counter() - t0
    finish_stage(root, params, stage if r is None else f"{stage}@{r}", metrics,
                 None if r is None else int(r))  # fmt: skip
    return metrics
