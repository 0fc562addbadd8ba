"""`make run`: the whole pipeline through `dvc repro`, in one MLflow run, then a summary.

Every stage is its own process under DVC; they find the pipeline's MLflow run through
MLFLOW_RUN_ID, which this driver opens first."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from flows.lockfile import repair
from flows.summary import NEXT_STEPS, summary_table
from rollwise import track
from rollwise.config import ParamsError, load_params, write_rounds_file


def main(root: Path = Path(".")) -> int:
    try:
        params = load_params(root / "params.yaml")  # fail on bad params before any work
    except ParamsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_rounds_file(root, params)  # dvc.yaml loops over it: in step with params.yaml's rounds
    if (kept := repair(root)) is not None:  # a crash cut dvc.lock short: keep the whole records
        print(f"dvc.lock was cut short by a crash: kept {len(kept)} stage records")
    run_id = track.open_run(root, params.model_dump(), run_name="dvc-repro")
    # dvc.yaml's stages run `python -m tasks...`: this environment's python, also when the
    # caller never activated it (`make run` from a plain shell).
    venv_bin = Path(sys.executable).parent
    path = os.pathsep.join([str(venv_bin), os.environ.get("PATH", "")])
    env = {**os.environ, "MLFLOW_RUN_ID": run_id, "PATH": path}
    dvc = str(venv_bin / "dvc")
    t0 = time.perf_counter()
    code = subprocess.call([dvc, "repro"], cwd=root, env=env)
    wall_s = time.perf_counter() - t0
    if code != 0:
        track.finish_run(run_id, "FAILED", root=root)
        print(f"dvc repro failed (exit {code}); finished stages are kept, rerun to resume")
        return code
    print(summary_table(root, params, wall_s))
    track.log_metrics(run_id, {"pipeline/wall_s": wall_s}, root=root)
    track.finish_run(run_id, root=root)
    print(NEXT_STEPS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
