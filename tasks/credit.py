"""Stage `credit@NN`: advantages of the kept episodes -> data/advantages/round_NN/."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rollwise.config import Params
from rollwise.credit import ESTIMATORS
from tasks.common import atomic_dir, log, require, round_dir, stage_main


def kept_episodes(root: Path, r: str) -> pd.DataFrame:
    episodes = pd.read_parquet(
        require(round_dir(root, "rollouts", r) / "episodes.parquet", f"rollout@{r}")
    )
    decisions = pd.read_parquet(
        require(round_dir(root, "curated", r) / "decisions.parquet", f"curate@{r}")
    )
    kept = set(decisions.loc[decisions["kept"], "episode_id"])
    return episodes[episodes["episode_id"].isin(kept)].reset_index(drop=True)


def run(params: Params, root: Path, r: str) -> dict:
    episodes = kept_episodes(root, r)
    steps = pd.read_parquet(round_dir(root, "rollouts", r) / "steps.parquet")
    advantages = ESTIMATORS[params.credit.method](episodes, steps, params.credit)
    with atomic_dir(round_dir(root, "advantages", r)) as out:
        advantages.to_parquet(out / "advantages.parquet")
    log(f"credit@{r}", f"{params.credit.method}: {len(advantages)} turn advantages")
    return credit_metrics(advantages)


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
