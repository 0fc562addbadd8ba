"""Stage `credit@NN`: advantages of the kept episodes -> data/advantages/round_NN/.

Reads round NN-1's credit_state.json (round 00's, empty, comes with the warm start) and writes
advantages.parquet (one row per episode turn) and this round's credit_state.json: the per-task
Beta tracker of spo/spo_pp (updated whatever the method, so a later switch to spo starts warm) and
the KL each policy version travelled from the warm start (train@NN-1's approx_kl added)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from rollwise.config import Params
from rollwise.credit import ESTIMATORS
from rollwise.credit.tracker import attach, from_json, next_drift, next_tracker, to_json
from tasks.common import (
    atomic_dir,
    log,
    metrics_path,
    read_table,
    require,
    round_dir,
    stage_main,
    write_json,
)

STATE_FILE = "credit_state.json"


def kept_episodes(root: Path, r: str) -> pd.DataFrame:
    episodes = read_table(round_dir(root, "rollouts", r) / "episodes.parquet", f"rollout@{r}")
    decisions = read_table(round_dir(root, "curated", r) / "decisions.parquet", f"curate@{r}")
    kept = set(decisions.loc[decisions["kept"], "episode_id"])
    return episodes[episodes["episode_id"].isin(kept)].reset_index(drop=True)


def previous_state(params: Params, root: Path, r: str) -> tuple[pd.DataFrame, dict[int, float]]:
    """Round r-1's tracker and drift, plus the KL of train@r-1, the update that made the policy
    that sampled round r (none for round 01: its policy is the warm start)."""
    prev = params.rounds[r]
    stage = f"credit@{prev}" if prev in params.rounds else "warmstart"
    path = require(round_dir(root, "advantages", prev) / STATE_FILE, stage)
    tracker, drift = from_json(json.loads(path.read_text()))
    if prev not in params.rounds:
        return tracker, drift
    train = json.loads(require(metrics_path(root, f"train@{prev}"), f"train@{prev}").read_text())
    kl = float(train.get("approx_kl", 0.0))
    return tracker, next_drift(drift, int(prev), int(params.rounds[prev]), kl)


def run(params: Params, root: Path, r: str) -> dict:
    tracker, drift = previous_state(params, root, r)
    episodes = attach(kept_episodes(root, r), tracker, drift)
    steps = read_table(round_dir(root, "rollouts", r) / "steps.parquet", f"rollout@{r}")
    advantages = ESTIMATORS[params.credit.method](episodes, steps, params.credit)
    tracker = next_tracker(episodes, tracker, params.credit)
    with atomic_dir(round_dir(root, "advantages", r)) as out:
        advantages.to_parquet(out / "advantages.parquet")
        write_json(out / STATE_FILE, to_json(tracker, drift, int(r)))
    log(f"credit@{r}", f"{params.credit.method}: {len(advantages)} turn advantages")
    return {**credit_metrics(advantages), "tracker_tasks": len(tracker)}


def credit_metrics(advantages: pd.DataFrame) -> dict:
    if advantages.empty:
        return {"turns": 0, "episodes_with_signal": 0.0, "advantage_abs_mean": 0.0}
    magnitude = advantages["advantage"].abs()
    per_episode = magnitude.groupby(advantages["episode_id"]).max()
    return {
        "turns": len(advantages),
        "episodes_with_signal": float((per_episode > 0).mean()),
        "advantage_abs_mean": float(magnitude.mean()),
    }


def main() -> None:
    stage_main("credit", run, with_round=True)


if __name__ == "__main__":
    main()
