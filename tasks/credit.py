"""Stage `credit@NN`: advantages of the kept episodes -> data/advantages/round_NN/.

Reads round NN-1's credit_state.json (round 00's, empty, comes with the warm start) and writes
advantages.parquet (one row per episode turn) and this round's credit_state.json: the per-task
Beta tracker of spo/spo_pp (updated whatever the method, so a later switch to spo starts warm) and
the KL each policy version travelled from the warm start (train@NN-1's approx_kl added).

The curator's decisions apply in full: only kept episodes get advantages, each scaled by its
decision weight (`curate.action: weight`; 1 otherwise), and replayed positives
(positives.parquet, `curate.replay_positives` > 0) join their task's group here and the
training batch (train@NN reads `kept_episodes` too). Positives keep the log-probs of the older
policy that sampled them: PPO's ratio pi_theta / pi_rollout is then the off-policy importance
ratio, clipped like any other (and with `train.tis_cap` the trainer's TIS weight corrects the
same staleness, capped). They do not update the SPO tracker: their outcome was counted when
they were sampled."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from rollwise.config import Params
from rollwise.credit import ESTIMATORS, trained_reward
from rollwise.credit.tracker import attach, from_json, next_drift, next_tracker, to_json
from rollwise.curate import success_bank
from rollwise.curate.filters import weighted_advantages
from rollwise.train.guard import travelled_kl
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
    """The round's episodes the curator kept, then the replayed positives (if any)."""
    episodes = read_table(round_dir(root, "rollouts", r) / "episodes.parquet", f"rollout@{r}")
    kept = set(decisions_of(root, r).query("kept")["episode_id"])
    episodes = episodes[episodes["episode_id"].isin(kept)]
    replayed = positives_of(root, r)
    parts = [episodes] if replayed is None or replayed.empty else [episodes, replayed]
    return pd.concat(parts, ignore_index=True)


def decisions_of(root: Path, r: str) -> pd.DataFrame:
    return read_table(round_dir(root, "curated", r) / "decisions.parquet", f"curate@{r}")


def positives_of(root: Path, r: str) -> pd.DataFrame | None:
    """positives.parquet, written by curate@r only when `curate.replay_positives` > 0."""
    path = round_dir(root, "curated", r) / "positives.parquet"
    return read_table(path, f"curate@{r}") if path.exists() else None


def round_steps(root: Path, r: str) -> pd.DataFrame:
    """The round's step rows, plus those of the replayed positives (from their trajectories)."""
    steps = read_table(round_dir(root, "rollouts", r) / "steps.parquet", f"rollout@{r}")
    replayed = positives_of(root, r)
    if replayed is None or replayed.empty:
        return steps
    return pd.concat([steps, success_bank.positive_steps(replayed)], ignore_index=True)


def previous_state(params: Params, root: Path, r: str) -> tuple[pd.DataFrame, dict[int, float]]:
    """Round r-1's tracker and drift, plus the KL of train@r-1, the update that made policy
    version r-1 (none for round 01: its start is the warm start). Drift is kept per version, so
    episodes sampled with an older version (rollout.policy_lag) find theirs."""
    prev = params.rounds[r].start
    stage = f"credit@{prev}" if prev in params.rounds else "warmstart"
    path = require(round_dir(root, "advantages", prev) / STATE_FILE, stage)
    tracker, drift = from_json(json.loads(path.read_text()))
    if prev not in params.rounds:
        return tracker, drift
    train = json.loads(require(metrics_path(root, f"train@{prev}"), f"train@{prev}").read_text())
    kl = travelled_kl(train)
    return tracker, next_drift(drift, int(prev), int(params.rounds[prev].start), kl)


def run(params: Params, root: Path, r: str) -> dict:
    tracker, drift = previous_state(params, root, r)
    episodes = attach(trained_reward(kept_episodes(root, r), params.credit.reward), tracker, drift)
    replayed = episodes["episode_id"].str.startswith(success_bank.REPLAY_PREFIX)
    decisions = decisions_of(root, r)
    advantages = ESTIMATORS[params.credit.method](episodes, round_steps(root, r), params.credit)
    advantages = weighted_advantages(advantages, decisions)
    tracker = next_tracker(episodes[~replayed].reset_index(drop=True), tracker, params.credit)
    with atomic_dir(round_dir(root, "advantages", r)) as out:
        advantages.to_parquet(out / "advantages.parquet")
        write_json(out / STATE_FILE, to_json(tracker, drift, int(r)))
    log(f"credit@{r}", f"{params.credit.method}: {len(advantages)} turn advantages")
    return {
        **credit_metrics(advantages),
        "tracker_tasks": len(tracker),
        "replayed_positives": int(replayed.sum()),
        "down_weighted": int((decisions["kept"] & (decisions["weight"] < 1)).sum()),
    }


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
