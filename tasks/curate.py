"""Stage `curate@NN`: which episodes may teach -> data/curated/round_NN/ (decisions, bank)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rollwise.config import Params
from rollwise.curate.filters import decide, success_bank
from tasks.common import atomic_dir, log, require, round_dir, stage_main


def run(params: Params, root: Path, r: str) -> dict:
    src = require(round_dir(root, "rollouts", r) / "episodes.parquet", f"rollout@{r}")
    episodes = pd.read_parquet(src)
    decisions = decide(episodes, params.curate)
    with atomic_dir(round_dir(root, "curated", r)) as out:
        decisions.to_parquet(out / "decisions.parquet")
        success_bank(episodes).to_parquet(out / "success_bank.parquet")
    dropped = int((~decisions["kept"]).sum())
    log(f"curate@{r}", f"kept {len(decisions) - dropped}, dropped {dropped}")
    return {"kept": len(decisions) - dropped, "dropped_env_error": dropped}


def main() -> None:
    stage_main("curate", run, with_round=True)


if __name__ == "__main__":
    main()
