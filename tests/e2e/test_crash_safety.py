"""kill -9 mid-stage, then rerun: nothing partial at an output path, upstream never recomputed,
and the final outputs equal an uninterrupted run's (timing columns aside).

The micro pipeline runs once uninterrupted (the reference). Then 20 trials, spread over every
stage: `dvc repro -f -s <stage>` is started and its whole process group is SIGKILLed after a
random delay (every other trial counted from the moment DVC removed the stage's output, so the
kill lands inside the stage); the stage's output path must then be absent or
complete (equal to the reference), and `dvc repro -s <stage>` must rerun that stage alone to the
reference outputs. A final plain `dvc repro` brings every stage back to the reference.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from flows.lockfile import repair
from rollwise.config import load_params
from tests.e2e.test_dvc_pipeline import BIN, copy_project, run

pytestmark = pytest.mark.e2e

TRIALS = 20
TIMING = re.compile(r"(^|_)(wall|seconds)(_s)?$|_s$")  # columns/keys that are clocks, not results


def outs_of(root: Path) -> dict[str, Path]:
    """Each stage's output folder (dvc.yaml's `outs`) by stage name, in DAG order."""
    rounds = load_params(root / "params.yaml").rounds
    outs = {"generate": root / "data/envs", "warmstart": root / "models/round_00"}
    for r in rounds:
        outs[f"rollout@{r}"] = root / f"data/rollouts/round_{r}"
        outs[f"curate@{r}"] = root / f"data/curated/round_{r}"
        outs[f"credit@{r}"] = root / f"data/advantages/round_{r}"
        outs[f"train@{r}"] = root / f"models/round_{r}"
    outs["evaluate"] = root / "data/eval"
    return outs


def fingerprint(folder: Path) -> dict[str, object]:
    """Comparable content of an output folder: parquet frames without clock columns, JSON without
    clock keys, every other file's bytes (plots and reports aside: they may embed timings)."""
    found: dict[str, object] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = str(path.relative_to(folder))
        if path.suffix == ".parquet":
            df = pd.read_parquet(path)
            df = df[[c for c in df.columns if not TIMING.search(c)]]
            found[rel] = df.to_json(orient="split", default_handler=str)
        elif path.suffix == ".json":
            obj = json.loads(path.read_text())
            found[rel] = {k: v for k, v in obj.items() if not TIMING.search(k)} if isinstance(
                obj, dict) else obj  # fmt: skip
        elif path.suffix in (".png", ".md", ".txt"):
            found[rel] = "present"
        else:
            found[rel] = path.read_bytes()
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("crash")
    copy_project(root)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "OMP_NUM_THREADS": "1",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}  # fmt: skip
    env.pop("MLFLOW_RUN_ID", None)
    for cmd in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"]):
        assert run(cmd, root, env, 60).returncode == 0
    done = run([str(BIN / "dvc"), "repro"], root, env, 900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    walls = {p.stem: json.loads(p.read_text())["wall_s"]
             for p in (root / "data" / "metrics").glob("*.json")}  # fmt: skip
    return root, env, {stage: fingerprint(out) for stage, out in outs_of(root).items()}, walls


def kill_after(
    cmd: list[str], root: Path, env: dict, delay_s: float, aim_at: Path | None = None
) -> None:
    """SIGKILL the command's process group `delay_s` after its start, or, with `aim_at`, that
    long after DVC removed that output (the stage is running then: its compute, or the python
    start-up before it)."""
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while aim_at and aim_at.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(delay_s)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_kill_9_mid_stage_then_rerun(reference):
    root, env, expected, walls = reference
    dvc = str(BIN / "dvc")
    outs = outs_of(root)
    order = list(outs)
    rng = random.Random(0)
    killed_mid_stage = lock_cut = 0
    for trial in range(TRIALS):
        stage = order[trial % len(order)]
        wall, aimed = walls.get(stage, 1.0), trial % 2 == 0
        # Odd trials: anywhere (DVC's start-up, the stage, DVC's records after it). Even ones:
        # inside the stage, since a run of a micro stage is mostly start-up.
        delay = rng.uniform(0.0, wall) if aimed else rng.uniform(1.0, 5.0 + wall)
        kill_after([dvc, "repro", "-f", "-s", stage], root, env, delay,
                   aim_at=outs[stage] if aimed else None)  # fmt: skip
        if outs[stage].exists():  # complete or absent: never half-written
            assert fingerprint(outs[stage]) == expected[stage], (trial, stage, delay, aimed)
        else:
            killed_mid_stage += 1
        # DVC rewrites dvc.lock in place: a kill during that write cuts it (flows/lockfile.py).
        lock_cut += repair(root) is not None
        done = run([dvc, "repro", "-s", stage], root, env, 600)
        assert done.returncode == 0, (trial, stage, done.stdout[-2000:], done.stderr[-2000:])
        ran = set(re.findall(r"Running stage '([^']+)'", done.stdout))
        assert ran <= {stage}, (trial, stage, ran)  # nothing finished is redone
        assert fingerprint(outs[stage]) == expected[stage], (trial, stage)
    print(
        f"\n{killed_mid_stage} of {TRIALS} kills landed mid-stage (output gone); "
        f"{lock_cut} cut dvc.lock short (repaired)"
    )
    assert killed_mid_stage >= 2, killed_mid_stage  # some kills really hit running stages
    done = run([dvc, "repro"], root, env, 900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for name, folder in outs.items():
        assert fingerprint(folder) == expected[name], name
    # A killed writer's temp folder is a hidden sibling, never at or inside an output path (the
    # next writer of that output clears it; a stage DVC restores from its cache writes nothing).
    for leftover in root.rglob(".*.tmp-*"):
        assert not any(leftover.is_relative_to(out) for out in outs.values()), leftover
