"""Stage `evaluate`: every checkpoint on the held-out split -> data/eval/ (matrix, summary,
report.md, per_round.png), logged to MLflow."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rollwise import track
from rollwise.config import Params
from rollwise.envs.runtime import load_suite
from tasks.common import atomic_dir, envs_dir, log, model_dir, require, stage_main, write_json
from tasks.rollout import stage_of_model


def run(params: Params, root: Path) -> dict:
    from rollwise.evaluate.full import evaluate_policy, summarize
    from rollwise.evaluate.report import markdown, plot_rounds
    from rollwise.policy.build import load_policy
    from rollwise.policy.hf import HFBackend
    from rollwise.rollout.engine import Limits

    cfg = params.evaluate
    suite = load_suite(require(envs_dir(root), "generate"))
    tasks = suite.split(cfg.split)[: cfg.max_tasks]
    limits = Limits(
        max_turns=cfg.max_turns,
        max_new_tokens=cfg.max_new_tokens,
        max_context=params.policy.max_context,
        greedy=True,
    )
    rows, matrix = [], []
    for r in ["00", *params.rounds]:
        model, tokenizer = load_policy(require(model_dir(root, r), stage_of_model(r)))
        episodes = evaluate_policy(HFBackend(model, tokenizer), tokenizer, suite, tasks, limits)
        rows.append({"round": int(r), "candidate": f"round_{r}", **summarize(episodes)})
        matrix.append(episodes.assign(candidate=f"round_{r}")[MATRIX_COLUMNS])
        log("evaluate", f"round {r}: held-out success {100 * rows[-1]['success']:.1f}%")
    summary = pd.DataFrame(rows)
    out_dir = root / "data" / "eval"
    with atomic_dir(out_dir) as out:
        pd.concat(matrix).to_parquet(out / "matrix.parquet")
        summary.to_parquet(out / "summary.parquet")
        write_json(out / "selection.json", selection(summary))
        plot_rounds(summary, out / "per_round.png")
        (out / "report.md").write_text(markdown(summary, len(tasks)))
    run_id = track.open_run(root, params.model_dump())
    track.log_artifacts(
        run_id, [out_dir / "report.md", out_dir / "per_round.png"], "eval", root=root
    )
    first, last = summary.iloc[0], summary.iloc[-1]
    return {
        "tasks": len(tasks),
        "warmstart_success": first["success"],
        "warmstart_success_lo": first["success_lo"],
        "warmstart_success_hi": first["success_hi"],
        "final_success": last["success"],
        "final_success_lo": last["success_lo"],
        "final_success_hi": last["success_hi"],
        "gain_pts": 100 * (last["success"] - first["success"]),
        "final_reward": last["reward"],
        "warmstart_reward": first["reward"],
    }


MATRIX_COLUMNS = [
    "candidate",
    "task_id",
    "env_id",
    "success",
    "reward",
    "rubric",
    "termination",
    "turns",
    "tool_calls",
    "generated_tokens",
]


def selection(summary: pd.DataFrame) -> dict:
    best = summary.loc[summary["success"].idxmax()]
    return {
        "mode": "full",
        "winner": best["candidate"],
        "success": float(best["success"]),
        "interval": [float(best["success_lo"]), float(best["success_hi"])],
        "cells_used": int(summary["n"].sum()),
        "cells_full": int(summary["n"].sum()),
    }


def main() -> None:
    stage_main("evaluate", run)


if __name__ == "__main__":
    main()
