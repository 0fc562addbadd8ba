"""Benchmark: what orchestration costs. The same small config (3 rounds) is run twice, side by
side in one bench run, each in a fresh process and a fresh git+DVC copy of the project:
- `inprocess`: a plain loop calling every stage's `run` in DAG order (no Prefect, no DVC);
- `flow`: the `rollwise-pipeline` Prefect flow against a real Prefect server on 127.0.0.1
  (worktree, DVC status/commit per stage, task runs, logs to the server).
Then `dvc repro` in the flow's worktree, which must run nothing. A second pair of flows, with
more RL (RL_HEAVY), runs with `rollout.policy_lag` 0 and 1 (asynchronous single rollout:
rollout@r+1 overlaps train@r, TIS-corrected): what the overlap saves on these cores,
`async_vs_sync_flow_ratio`.
Writes bench/results/orchestration.json: flow_vs_inprocess_ratio (target <= 1.10), noop_repro_s
(target <= 3 s), the walls behind them, command and git_commit. Both sides log to an MLflow
sqlite store and use one torch thread (the Prefect server shares the cores).

    .venv/bin/python bench/orchestration.py [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "orchestration.json"
sys.path.insert(0, str(ROOT))

from bench.provenance import STARTED_AT  # noqa: E402
from tests import servers  # noqa: E402

# Small enough to repeat, big enough that stage compute (not start-up) dominates, as in real use.
CONFIG = {
    "envs.n_envs": 6,
    "envs.tasks_per_env": 24,
    "warmstart.steps": 60,
    "schedule.tasks_per_round": 16,
    "evaluate.max_tasks": 60,
    "rounds": 3,
}
ASYNC = ["rollout.policy_lag=1", "train.tis_cap=2.0"]
# The async pair (lag 0 vs lag 1, both flows) trains for real: CONFIG's 60-step warm start gives
# rollouts too uniform to train on, so there train@r (the overlapped part) takes under a second.
RL_HEAVY = ["warmstart.steps=300", "rounds=5", "train.epochs=4"]

INPROCESS = """
import sys, time
from pathlib import Path
from rollwise.config import load_params
from tasks import credit, curate, evaluate, generate, rollout, train, warmstart
from tasks.common import timed_stage
root = Path(".").resolve()
params = load_params(root / "params.yaml")
t0 = time.perf_counter()
timed_stage("generate", generate.run, params, root)
timed_stage("warmstart", warmstart.run, params, root)
for r in params.rounds:
    for name, stage in (("rollout", rollout), ("curate", curate), ("credit", credit),
                        ("train", train)):
        timed_stage(name, stage.run, params, root, r)
timed_stage("evaluate", evaluate.run, params, root)
print("stages_s", time.perf_counter() - t0)
"""


def project_copy(dest: Path) -> Path:
    """A fresh git+DVC project with CONFIG applied to params.yaml, committed (flows need HEAD)."""
    from rollwise.config import apply_overrides, dump_for_dvc, read_raw

    dest.mkdir(parents=True)
    for name in ("src", "tasks", "flows"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "dvc.yaml", dest)
    raw = apply_overrides(read_raw(ROOT / "params.yaml"), CONFIG)
    (dest / "params.yaml").write_text(dump_for_dvc(raw))
    (dest / ".gitignore").write_text("__pycache__/\nmlflow.db\nmlruns/\n.rollwise/\n")
    dvc = str(Path(sys.executable).parent / "dvc")
    for cmd in (["git", "init", "-q"], [dvc, "init", "-q"], ["git", "add", "-A"],
                ["git", "commit", "-q", "-m", "bench"]):  # fmt: skip
        subprocess.run(cmd, cwd=dest, check=True, capture_output=True, env=ENV)
    return dest


def stage_walls(metrics: Path) -> dict[str, float]:
    """Each stage's own compute seconds, from its metrics: what an overlap can hide."""
    return {f.stem: round(json.loads(f.read_text()).get("wall_s", 0.0), 2)
            for f in sorted(metrics.glob("*.json"))}  # fmt: skip


def timed(cmd: list[str], cwd: Path, log: Path) -> float:
    t0 = time.perf_counter()
    with log.open("w") as fh:
        # The copy's own code, not the editable install's: what was copied is what is timed.
        path = f"{cwd}{os.pathsep}{cwd / 'src'}"
        code = subprocess.call(cmd, cwd=cwd, env={**ENV, "PYTHONPATH": path}, stdout=fh,
                               stderr=subprocess.STDOUT)  # fmt: skip
    wall = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {code}); see {log}")
    return wall


ENV = {
    **os.environ,
    **servers.QUIET_ENV,
    "ROLLWISE_TORCH_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rollwise-bench-orch-"))
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "PREFECT_API_URL"):
        ENV.pop(key, None)
    ENV.update(PREFECT_HOME=str(work / "prefect-home"), DVC_SITE_CACHE_DIR=str(work / "dvc-site"))
    prefect = servers.start_prefect(work / "prefect")
    ENV["PREFECT_API_URL"] = prefect.url
    rows = []
    try:
        for i in range(args.repeats):
            plain, flowed = project_copy(work / f"plain_{i}"), project_copy(work / f"flow_{i}")
            inproc = timed([sys.executable, "-c", INPROCESS], plain, work / f"plain_{i}.log")
            flow = timed([sys.executable, "-m", "flows.pipeline", "--run-name", "bench"], flowed,
                         work / f"flow_{i}.log")  # fmt: skip
            worktree = flowed / ".rollwise" / "runs" / "bench"
            dvc = str(Path(sys.executable).parent / "dvc")
            noop = timed([dvc, "repro"], worktree, work / f"noop_{i}.log")
            ran = "Running stage" in (work / f"noop_{i}.log").read_text()
            synced, lagged = project_copy(work / f"sync_{i}"), project_copy(work / f"lag_{i}")
            flow_sync = timed([sys.executable, "-m", "flows.pipeline", *RL_HEAVY, "--run-name",
                               "bench-sync"], synced, work / f"sync_{i}.log")  # fmt: skip
            lag_cmd = [sys.executable, "-m", "flows.pipeline", *RL_HEAVY, *ASYNC]
            flow_lag = timed([*lag_cmd, "--run-name", "bench-lag"], lagged, work / f"lag_{i}.log")
            metrics = lagged / ".rollwise" / "runs" / "bench-lag" / "data" / "metrics"
            trained = [json.loads((metrics / f"train@{r:02d}.json").read_text())
                       for r in range(2, 6)]  # fmt: skip
            walls = {arm: stage_walls(folder / ".rollwise" / "runs" / run / "data" / "metrics")
                     for arm, folder, run in (("flow_lag0", synced, "bench-sync"),
                                              ("flow_lag1", lagged, "bench-lag"))}  # fmt: skip
            keys = ("policy_lag", "tis_weight", "tis_capped", "approx_kl")
            rows.append({"inprocess_s": inproc, "flow_s": flow, "noop_repro_s": noop,
                         "noop_repro_ran_a_stage": ran, "flow_lag0_s": flow_sync,
                         "flow_lag1_s": flow_lag,
                         "lag1_train": [{k: t.get(k) for k in keys} for t in trained],
                         "stage_walls_s": walls})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    finally:
        servers.stop(prefect)
    ratio = statistics.median(r["flow_s"] / r["inprocess_s"] for r in rows)
    result = {
        "command": "python bench/orchestration.py " + " ".join(sys.argv[1:]),
        "git_commit": STARTED_AT,
        "config": CONFIG,
        "flow_vs_inprocess_ratio": ratio,
        "noop_repro_s": statistics.median(r["noop_repro_s"] for r in rows),
        "async_vs_sync_flow_ratio": statistics.median(
            r["flow_lag1_s"] / r["flow_lag0_s"] for r in rows
        ),
        "async_overrides": ASYNC,
        "async_pair_config": RL_HEAVY,
        "targets": {"flow_vs_inprocess_ratio": 1.10, "noop_repro_s": 3.0},
        "prefect_server_start_s": prefect.started_s,
        "runs": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    keys = ("flow_vs_inprocess_ratio", "noop_repro_s", "async_vs_sync_flow_ratio")
    print(json.dumps({k: result[k] for k in keys}))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
