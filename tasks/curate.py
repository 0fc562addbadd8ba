"""Stage `curate@NN`: which episodes may teach -> data/curated/round_NN/.

Reads the round's episodes and steps, the suite (data/envs: the environments the curator
replays calls against, loaded by the runtime as the rollout stage loads them) and the previous
round's curated folder (success bank and quarantine list; round 00's is empty, written by the
warmstart stage). The curator itself never reads data/envs/audit.parquet or episodes' audit
rows (curate/attribution.py).

Writes:
  attributions.parquet  per episode: cause, confidence, per-cause scores, evidence, verifier calls
  decisions.parquet     per episode: kept, reason, evidence, cause, confidence, weight
  quarantine.parquet    tasks the next round's scheduler skips (curate/filters.py)
  success_bank.parquet  verified successes per task, merged with the previous round's
  positives.parquet     banked successes of this round's tasks as episodes (replay_positives>0)
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rollwise.config import Params
from rollwise.curate import success_bank
from rollwise.curate.attribution import CAUSES, attribute
from rollwise.curate.filters import QUARANTINE_COLUMNS, decide, quarantine
from rollwise.envs.runtime import load_suite
from tasks.common import atomic_dir, envs_dir, log, read_table, require, round_dir, stage_main


def curate_round(
    episodes: pd.DataFrame, steps: pd.DataFrame, suite, previous: Path | None, r: int, cfg
) -> tuple[dict[str, pd.DataFrame], dict]:
    """Every output table of one round (by file stem) and the round's metrics."""
    attributions, checks = attribute(episodes, steps, suite, cfg)
    decisions = decide(attributions, cfg)
    prev_q = success_bank.load(previous / "quarantine.parquet") if previous else None
    prev_bank = success_bank.load(previous / "success_bank.parquet") if previous else None
    quarantined, recheck_calls = quarantine(attributions, checks, prev_q, suite, r, cfg)
    new = success_bank.verified_successes(episodes, steps, attributions)
    bank = success_bank.update(prev_bank, new, cfg.bank_per_task)
    tables = {
        "attributions": attributions,
        "decisions": decisions,
        "quarantine": quarantined,
        "success_bank": bank,
    }
    if cfg.replay_positives:  # prior successes only: this round's are in the batch already
        prior = prev_bank if prev_bank is not None else bank.iloc[:0]
        tasks = list(episodes["task_id"].unique())
        tables["positives"] = success_bank.positives(prior, tasks, cfg.replay_positives, r)
    return tables, curate_metrics(attributions, decisions, quarantined, bank, recheck_calls)


def curate_metrics(attributions, decisions, quarantined, bank, recheck_calls: int) -> dict:
    causes = attributions["cause"].value_counts().to_dict()
    kept = int(decisions["kept"].sum())
    return {
        "kept": kept,
        "dropped": len(decisions) - kept,
        **{f"cause_{c}": int(causes.get(c, 0)) for c in ("policy", *CAUSES)},
        "verifier_calls": int(attributions["verifier_calls"].sum()) + recheck_calls,
        "quarantined": len(quarantined),
        "bank_entries": len(bank),
        "bank_tasks": int(bank["task_id"].nunique()),
    }


def run(params: Params, root: Path, r: str) -> dict:
    rollouts = round_dir(root, "rollouts", r)
    episodes = read_table(rollouts / "episodes.parquet", f"rollout@{r}")
    steps = read_table(rollouts / "steps.parquet", f"rollout@{r}")
    suite = load_suite(require(envs_dir(root), "generate"))
    prev = params.rounds[r].start
    previous = require(round_dir(root, "curated", prev), "warmstart" if prev == "00" else
                       f"curate@{prev}")  # fmt: skip
    tables, metrics = curate_round(episodes, steps, suite, previous, int(r), params.curate)
    with atomic_dir(round_dir(root, "curated", r)) as out:
        for name, table in tables.items():
            table.to_parquet(out / f"{name}.parquet")
    if params.curate.bank_url:
        url = f"{params.curate.bank_url.rstrip('/')}/round_{r}"
        success_bank.publish(round_dir(root, "curated", r) / "success_bank.parquet", url)
    log(
        f"curate@{r}",
        f"kept {metrics['kept']}, dropped {metrics['dropped']}, "
        f"quarantined {metrics['quarantined']}, {metrics['verifier_calls']} verifier calls",
    )
    return metrics


def write_initial_state(out: Path) -> None:
    """An empty success bank and quarantine list: the folder of round 00."""
    pd.DataFrame(columns=success_bank.BANK_COLUMNS).to_parquet(out / "success_bank.parquet")
    pd.DataFrame(columns=QUARANTINE_COLUMNS).to_parquet(out / "quarantine.parquet")


def main() -> None:
    stage_main("curate", run, with_round=True)


if __name__ == "__main__":
    main()
