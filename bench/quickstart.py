"""Benchmark: the default pipeline (`make run`'s job) with 3 seeds, each in its own copy of the
project, run through `python -m flows.run` (dvc repro). Writes bench/results/quickstart.json:
wall_s_median (pipeline after install), heldout_gain_pts_median (final minus warm start, paired
on the held-out tasks both ran: halving runs the warm start on fewer),
per-stage wall times, and per-seed figures with the gain's 95% interval. Targets (issue 35):
wall <= 900 s (stretch 600), gain >= +10 points with every seed's interval excluding 0.

    .venv/bin/python bench/quickstart.py [--seeds 0 1 2] [--recipe smollm2] [KEY=VALUE ...]
        [--out FILE]

`--recipe` (bench/learning.py's RECIPES; default tiny: params.yaml as it is) and KEY=VALUE
overrides are written into each copy's params.yaml (a bad key fails by name before any seed
runs), so another substrate is measured through the same `make run` job, e.g.
`--recipe smollm2 rounds=2 evaluate.max_tasks=96`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import bench_params  # noqa: E402
from bench.learning import RECIPES  # noqa: E402
from bench.provenance import STARTED_AT  # noqa: E402
from flows.summary import read_metrics, stage_walls  # noqa: E402
from rollwise.config import apply_overrides, dump_for_dvc, load_params, parse_overrides  # noqa: E402
from rollwise.evaluate.report import paired_gain  # noqa: E402


def project_copy(dest: Path, seed: int, overrides: dict | None = None) -> Path:
    """A fresh project folder (its own git + DVC) with every seed set to `seed` and params.yaml
    changed by `overrides` (dotted keys)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in ("src", "tasks", "flows"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "dvc.yaml", dest)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params = apply_overrides(params, overrides or {})
    params["seed"] = seed  # every stage's seed derives from it (params.yaml sets none of its own)
    (dest / "params.yaml").write_text(dump_for_dvc(params))
    bin_dir = Path(sys.executable).parent
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run([str(bin_dir / "dvc"), "init", "-q"], cwd=dest, check=True)
    return dest


def run_seed(seed: int, work: Path, overrides: dict | None = None) -> dict:
    dest = project_copy(work / f"seed_{seed}", seed, overrides)
    env = {
        **os.environ,
        "DVC_NO_ANALYTICS": "1",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(dest / "src"),  # the copy's code, not the editable install's
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("MLFLOW_RUN_ID", None)
    t0 = time.perf_counter()
    log = (work / f"seed_{seed}.log").open("w")
    code = subprocess.call(
        [sys.executable, "-m", "flows.run"], cwd=dest, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    wall = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"seed {seed} failed (exit {code}); see {work / f'seed_{seed}.log'}")
    metrics = read_metrics(dest)
    stages = stage_walls(metrics)
    ev = metrics["evaluate"]
    # Halving (the default) runs the warm start and the final round on different tasks: the gain
    # is paired on the tasks both ran (the run summary's figure), not the metrics' unpaired one.
    matrix = pd.read_parquet(dest / "data" / "eval" / "matrix.parquet")
    gain = paired_gain(matrix, "round_00", f"round_{max(load_params(dest / 'params.yaml').rounds)}")
    return {
        "seed": seed,
        "wall_s": wall,
        "stage_wall_s": stages,
        "warmstart_success": ev["warmstart_success"],
        "final_success": ev["final_success"],
        "heldout_gain_pts": gain.gain_pts,
        "heldout_gain_interval": [gain.lo, gain.hi],
        "heldout_gain_tasks": gain.tasks,
        "heldout_tasks": ev["tasks"],
        "eval_cells": ev["cells"],
        "eval_cells_full": ev["cells_full"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--work", type=Path, default=ROOT / ".rollwise" / "bench")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "quickstart.json")
    parser.add_argument("--recipe", choices=list(RECIPES), default="tiny")
    parser.add_argument("overrides", nargs="*", help="params.yaml KEY=VALUE, e.g. rounds=2")
    args = parser.parse_args()
    overrides = {**RECIPES[args.recipe], **parse_overrides(args.overrides)}
    bench_params(overrides)  # a bad key fails by name before any seed runs
    runs = []
    for seed in args.seeds:  # a stopped run resumes: a seed finished at this code is kept
        done = args.work / f"seed_{seed}.result.json"
        kept = json.loads(done.read_text()) if done.exists() else {}
        if (kept.get("git_commit") == STARTED_AT and kept.get("overrides") == overrides
                and not STARTED_AT.endswith("+uncommitted")):  # fmt: skip
            runs.append(kept["run"])
        else:
            runs.append(run_seed(seed, args.work, overrides))
            record = {"git_commit": STARTED_AT, "overrides": overrides, "run": runs[-1]}
            done.write_text(json.dumps(record) + "\n")
        print(json.dumps(runs[-1]), flush=True)
        write(runs, args, overrides)


def write(runs: list[dict], args: argparse.Namespace, overrides: dict) -> None:
    """The results file from the seeds run so far (`seeds_done`; every seed when finished)."""
    stage_names = runs[0]["stage_wall_s"].keys()
    recipe = [] if args.recipe == "tiny" else ["--recipe", args.recipe]
    command = " ".join(["--seeds", *map(str, args.seeds), *recipe, *args.overrides])
    if args.out != ROOT / "bench" / "results" / "quickstart.json":
        command += f" --out {args.out}"
    make = "make bench  # " if command == "--seeds 0 1 2" else ""  # what `make bench` runs
    result = {
        "command": make + ".venv/bin/python bench/quickstart.py " + command,
        "git_commit": STARTED_AT,
        "recipe": args.recipe,
        "overrides": overrides,
        "seeds": args.seeds,
        "seeds_done": [r["seed"] for r in runs],
        "wall_s_median": statistics.median(r["wall_s"] for r in runs),
        "heldout_gain_pts_median": statistics.median(r["heldout_gain_pts"] for r in runs),
        "every_seed_interval_excludes_0": all(
            r.get("heldout_gain_interval", [0])[0] > 0 for r in runs
        ),  # fmt: skip
        "warmstart_success_median": statistics.median(r["warmstart_success"] for r in runs),
        "final_success_median": statistics.median(r["final_success"] for r in runs),
        "stage_wall_s_median": {
            s: statistics.median(r["stage_wall_s"][s] for r in runs) for s in stage_names
        },
        "targets": {
            "wall_s_median": "<= 900 (stretch 600)",
            "heldout_gain_pts_median": ">= 10",
            "every_seed_interval_excludes_0": True,
        },  # fmt: skip
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
