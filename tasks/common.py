"""Stage plumbing shared by every task module: paths, params, atomic outputs, metrics, logging."""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import threading
import time
from pathlib import Path

from rollwise import track
from rollwise.artifacts import (  # noqa: F401  (the stages' and tests' names for them)
    CorruptArtifact,
    MissingUpstream,
    atomic_dir,
    corrupt,
    read_json,
    read_table,
    require,
    write_json,
)
from rollwise.config import Params, ParamsError, check_rounds_file, load_params


def envs_dir(root: Path) -> Path:
    return root / "data" / "envs"


def model_dir(root: Path, r: str) -> Path:
    return root / "models" / f"round_{r}"


def round_dir(root: Path, kind: str, r: str) -> Path:
    return root / "data" / kind / f"round_{r}"


def metrics_path(root: Path, stage: str) -> Path:
    return root / "data" / "metrics" / f"{stage}.json"


def read_suite(suite_dir: Path, stage: str = "generate"):
    """The generated suite (envs/runtime.load_suite). When it fails to load, a damaged table or
    JSON file in it is named (CorruptArtifact); any other failure is raised as it was."""
    from rollwise.envs.runtime import load_suite

    require(suite_dir / "catalog.parquet", stage)
    try:
        return load_suite(suite_dir)
    except Exception:
        for path in sorted(suite_dir.rglob("*")):  # only on failure: find the culprit
            if path.suffix == ".parquet":
                read_table(path, stage)
            elif path.suffix == ".json":
                read_json(path, stage)
        raise


# ---------------------------------------------------------------------------- loaded policy
# In one process (the Prefect flow) the policy train@r just saved is the one rollout@r+1 and
# train@r+1 read next: keep it in memory instead of reloading it. One slot, so memory holds one
# model; the files' stamps decide whether the slot still matches the folder on disk (a restore
# from DVC's cache or any other rewrite misses and reloads). Under `dvc repro` every stage is a
# fresh process and this is simply a load.
# Stages may run in threads at once (the flow overlaps rollout@r+1 with train@r under
# rollout.policy_lag 1, both on round r-1's checkpoint): the slot is guarded by a lock, and a
# model that went to a reader is never handed to a concurrent trainer: it gets its own copy.
_LOADED: dict[str, object] = {}
_LOADED_LOCK = threading.Lock()


def _stamp(folder: Path) -> tuple:
    return tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in sorted(folder.iterdir()))


def load_checkpoint(folder: Path, stage: str, take: bool = False, concurrent: bool = False):
    """(model, tokenizer) of a checkpoint folder that `stage` writes. `take=True` is for a
    caller that will change the model (training): the slot is emptied so nobody else reads the
    changed weights under the old folder's name. `concurrent=True` (the flow overlaps stages,
    rollout.policy_lag 1): a model some reader was given, maybe still sampling with it in
    another thread, is copied for the trainer, never trained in place. Without it no copy: a
    real model's second copy could be the GPU memory the trainer needs."""
    from rollwise.policy.build import load_policy

    require(folder, stage)
    key = str(folder.resolve())
    with _LOADED_LOCK:
        hit = _LOADED.get("key") == key and _LOADED.get("stamp") == _stamp(folder)
        found = (_LOADED["model"], _LOADED["tokenizer"], _LOADED["lent"]) if hit else None
        if take:
            _LOADED.clear()
        elif hit:
            _LOADED["lent"] = True
    if found is not None:
        model, tokenizer, lent = found
        return (copy.deepcopy(model) if take and lent and concurrent else model), tokenizer
    try:
        model, tokenizer = load_policy(folder)  # outside the lock: a load takes a while
    except Exception as e:  # safetensors/json/tokenizer errors of a damaged checkpoint
        raise corrupt(folder, stage, e) from e
    if not take:
        with _LOADED_LOCK:
            _LOADED.clear()
            _LOADED.update(key=key, stamp=_stamp(folder), model=model, tokenizer=tokenizer,
                           lent=True)  # fmt: skip
    return model, tokenizer


def keep_checkpoint(folder: Path, model, tokenizer) -> None:
    """Remember the model just saved to `folder` (after its atomic rename); its trainer is done
    with it, so nobody holds it yet (not lent)."""
    with _LOADED_LOCK:
        _LOADED.clear()
        _LOADED.update(key=str(folder.resolve()), stamp=_stamp(folder), model=model,
                       tokenizer=tokenizer, lent=False)  # fmt: skip


# ---------------------------------------------------------------------------- progress
# Long loops report (stage, done, total) here; the terminal gets a line per report and every
# registered sink is called too (the Prefect flow registers one that updates a progress artifact
# in the UI), so this module stays free of Prefect.
PROGRESS_SINKS: list = []


def report_progress(stage: str, done: int, total: int, note: str = "") -> None:
    """A line per report, with a bar: readable in a terminal, in DVC's output and in Prefect."""
    filled = round(20 * done / max(total, 1))
    bar = "#" * filled + "." * (20 - filled)
    log(stage, f"[{bar}] {done}/{total} {note}".rstrip())
    for sink in PROGRESS_SINKS:
        sink(stage, done, total)


def log(stage: str, message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {stage}: {message}", flush=True)


def finish_stage(root: Path, params: Params, stage: str, metrics: dict, step: int | None) -> None:
    """Write the stage's DVC metrics file and log the same numbers to the pipeline's MLflow run."""
    write_json(metrics_path(root, stage), metrics)
    log_stage_metrics(root, params, stage, metrics, step)


def recorded_metrics(root: Path, params: Params, stage: str) -> dict:
    """A stage DVC restored instead of running: its metrics file, logged to this MLflow run too
    (so every run holds every round's numbers, computed here or not)."""
    metrics = json.loads(require(metrics_path(root, stage), stage).read_text())
    _, _, r = stage.partition("@")
    log_stage_metrics(root, params, stage, metrics, int(r) if r else None)
    return metrics


def log_stage_metrics(root: Path, params: Params, stage: str, metrics: dict, step: int | None):
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
        check_rounds_file(args.root, params)  # what `dvc repro` planned is what params say
    except ParamsError as e:
        sys.exit(f"error: {e}")
    # torch reads this when first imported; one thread unless told otherwise (stack-notes.md:
    # 2-thread torch collapses when servers share the two cores).
    os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("ROLLWISE_TORCH_THREADS", "1"))
    try:
        metrics = timed_stage(stage, run, params, args.root, args.round if with_round else None)
    except (MissingUpstream, CorruptArtifact) as e:
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


# ---------------------------------------------------------------------------- round state
def stage_of_model(r: str) -> str:
    return "warmstart" if r == "00" else f"train@{r}"


def stage_of_state(r: str, stage: str) -> str:
    """Round 00's (empty) scheduler, curator and credit states come with the warm start."""
    return "warmstart" if r == "00" else f"{stage}@{r}"


def round_state(root: Path, r: str, *parts: str):
    """The loop.RoundState round `r`'s stages left on disk, the `parts` a stage reads of it:
    "rollout" (the scheduler's history), "curate" (quarantine and success bank), "credit"
    (SPO's tracker and the drift so far). A missing or damaged file names its stage."""
    from rollwise.envs.tool_pool import POOL_FILE
    from rollwise.loop import RoundState

    state = RoundState()
    if "rollout" in parts:
        state.history = read_history(root, r)
    if "curate" in parts:
        folder = round_dir(root, "curated", r)
        stage = stage_of_state(r, "curate")
        state.quarantine = read_table(folder / "quarantine.parquet", stage)
        state.bank = read_table(folder / "success_bank.parquet", stage)
        if (folder / "skill_bank.parquet").exists():  # rollout.memory.skills
            state.skills = read_table(folder / "skill_bank.parquet", stage)
        if (folder / POOL_FILE).exists():  # a tool-building suite's pool (SMITH)
            state.tools = read_tool_pool(folder / POOL_FILE, stage)
    if "credit" in parts:
        from rollwise.credit.tracker import from_json

        path = round_dir(root, "advantages", r) / CREDIT_STATE
        state.tracker, state.drift = from_json(read_json(path, stage_of_state(r, "credit")))
    return state


CREDIT_STATE = "credit_state.json"


def read_tool_pool(path: Path, stage: str):
    """The tool pool a curate stage wrote; damaged, the error names the file and the stage."""
    from rollwise.envs.tool_pool import ToolPool

    try:
        return ToolPool.load(path)
    except ValueError as e:
        raise corrupt(path, stage, e) from e


def read_history(root: Path, r: str):
    """The scheduler's history in round r's state file; unreadable or of the wrong shape, the
    error names the file and the stage that writes it."""
    from rollwise.schedule.history import from_state

    stage = stage_of_state(r, "rollout")
    path = round_dir(root, "rollouts", r) / "scheduler_state.json"
    try:
        return from_state(read_json(path, stage))
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        if isinstance(e, CorruptArtifact):
            raise
        raise corrupt(path, stage, e) from e


def round_batch(root: Path, r: str, with_steps: bool = True):
    """(training batch, its steps, the curator's decisions) of round r: the kept episodes plus
    replayed positives (loop.kept_episodes), as credit@r and train@r both read them (train@r
    needs no steps: None)."""
    from rollwise.loop import kept_episodes, with_positive_steps

    rollouts, curated = round_dir(root, "rollouts", r), round_dir(root, "curated", r)
    episodes = read_table(rollouts / "episodes.parquet", f"rollout@{r}")
    steps = read_table(rollouts / "steps.parquet", f"rollout@{r}") if with_steps else None
    decisions = read_table(curated / "decisions.parquet", f"curate@{r}")
    path = curated / "positives.parquet"  # written only when curate.replay_positives > 0
    positives = read_table(path, f"curate@{r}") if path.exists() else None
    batch = kept_episodes(episodes, decisions, positives)
    if steps is not None:
        steps = with_positive_steps(steps, positives)
    return batch, steps, decisions


def with_train_drift(params: Params, root: Path, r: str, state):
    """The state with the KL of train@r-1 added to its drift: the update that made policy
    version r-1 (none for round 01: its start is the warm start). Drift is kept per version, so
    episodes sampled with an older version (rollout.policy_lag) find theirs."""
    from rollwise.credit.tracker import next_drift
    from rollwise.train.guard import travelled_kl

    prev = params.rounds[r].start
    if prev not in params.rounds:
        return state
    train = read_json(metrics_path(root, f"train@{prev}"), f"train@{prev}")
    start = int(params.rounds[prev].start)
    state.drift = next_drift(state.drift, int(prev), start, travelled_kl(train))
    return state
