"""Stage `evaluate`: every checkpoint on the held-out split -> data/eval/ (matrix, summary,
report.md, plots, sample trajectories), logged to MLflow."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from rollwise import track
from rollwise.config import Params
from rollwise.envs.runtime import load_suite
from tasks.common import (
    atomic_dir,
    envs_dir,
    log,
    metrics_path,
    model_dir,
    report_progress,
    require,
    stage_main,
    write_json,
)
from tasks.rollout import stage_of_model


def run(params: Params, root: Path) -> dict:
    from rollwise.evaluate.full import evaluate_policy, evaluation_tasks, summarize
    from rollwise.evaluate.halving import HalvingKnobs, select
    from rollwise.evaluate.report import (
        COST_LABEL,
        markdown,
        plot_rounds,
        plot_spend,
        write_samples,
    )
    from rollwise.policy.build import load_policy
    from rollwise.policy.hf import HFBackend
    from rollwise.rollout.engine import Limits

    cfg = params.evaluate
    suite = load_suite(require(envs_dir(root), "generate"))
    tasks = evaluation_tasks(suite, cfg.split, cfg.max_tasks)
    limits = Limits(
        max_turns=cfg.max_turns,
        max_new_tokens=cfg.max_new_tokens,
        max_context=params.policy.max_context,
        greedy=True,
    )
    names = [f"round_{r}" for r in ["00", *params.rounds]]
    by_id = {t.task_id: t for t in tasks}
    ran: dict[str, list[pd.DataFrame]] = {n: [] for n in names}
    loaded: dict = {}  # the checkpoint in memory: cells run candidate by candidate
    full_cells = len(names) * len(tasks)

    def run_cells(name: str, task_ids: list[str]) -> list[float]:
        if loaded.get("name") != name:
            r = name.removeprefix("round_")
            model, tokenizer = load_policy(require(model_dir(root, r), stage_of_model(r)))
            loaded.update(name=name, backend=HFBackend(model, tokenizer), tokenizer=tokenizer)
        picked = [by_id[t] for t in task_ids]
        episodes = evaluate_policy(loaded["backend"], loaded["tokenizer"], suite, picked, limits)
        ran[name].append(episodes.assign(candidate=name))
        done = sum(len(e) for v in ran.values() for e in v)
        report_progress("evaluate", done, full_cells, f"{name}: {len(task_ids)} cells")
        success = dict(zip(episodes["task_id"], episodes["success"].astype(float), strict=True))
        return [success[t] for t in task_ids]

    budget = math.ceil(cfg.budget_frac * full_cells)
    knobs = HalvingKnobs(**cfg.halving.model_dump())
    chosen = select(cfg.method, names, list(by_id), run_cells, budget, knobs)
    episodes_of = {n: pd.concat(ran[n], ignore_index=True) for n in names if ran[n]}
    summary = pd.DataFrame(
        [{"round": int(n[-2:]), "candidate": n, **summarize(e)} for n, e in episodes_of.items()]
    )
    episodes, tokenizer = episodes_of[chosen.winner], loaded["tokenizer"]  # samples: the winner
    spend = rollout_spend(root, list(params.rounds))
    curve = None if spend is None else summary.merge(spend, on="round")
    out_dir = root / "data" / "eval"
    with atomic_dir(out_dir) as out:
        cell_matrix(chosen, episodes_of, names, list(by_id)).to_parquet(out / "matrix.parquet")
        summary.to_parquet(out / "summary.parquet")
        write_json(out / "selection.json", selection(chosen, summary))
        plot_rounds(summary, out / "per_round.png")
        if curve is not None:
            plot_spend(curve, "rollouts", "rollouts spent (episodes)", out / SPEND_PLOTS[0])
            plot_spend(curve, "rollout_tokens", COST_LABEL, out / SPEND_PLOTS[1])
        else:
            log("evaluate", "no rollout metrics (data/metrics/rollout@NN.json): no spend plots")
        samples = write_samples(episodes, tokenizer, out / "trajectories")  # the final candidate
        (out / "report.md").write_text(markdown(summary, len(tasks), curve, samples))
    run_id = track.open_run(root, params.model_dump())
    for row in summary.itertuples():  # the per-round curve `rollwise compare` plots
        per_round = {f"evaluate/round_{k}": getattr(row, k) for k in ROUND_METRICS}
        track.log_metrics(run_id, per_round, step=int(row.round), root=root)
    artifacts = ["report.md", "per_round.png", *SPEND_PLOTS, "trajectories"]
    present = [out_dir / a for a in artifacts if (out_dir / a).exists()]
    track.log_artifacts(run_id, present, "eval", root=root)
    first, last = summary.iloc[0], summary.iloc[-1]
    return {
        "tasks": len(tasks),
        "cells": chosen.cells_used,
        "cells_full": full_cells,
        "cells_fraction": chosen.cells_used / full_cells,
        "chosen_round": int(chosen.winner[-2:]),
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


SPEND_PLOTS = ("success_vs_rollouts.png", "success_vs_cost.png")
ROUND_METRICS = ("success", "success_lo", "success_hi")


def rollout_spend(root: Path, rounds: list[str]) -> pd.DataFrame | None:
    """What had been spent on rollouts when each candidate was made (round 0, the warm start:
    nothing): cumulative episodes, rollout tokens (report.COST_LABEL) and tool calls, from the
    rollout stages' metrics files. None when one is missing (checkpoints made some other way)."""
    rows = [{"round": 0, "rollouts": 0, "rollout_tokens": 0, "tool_calls": 0}]
    for r in rounds:
        path = metrics_path(root, f"rollout@{r}")
        if not path.exists():
            return None
        m, prev = json.loads(path.read_text()), rows[-1]
        rows.append(
            {
                "round": int(r),
                "rollouts": prev["rollouts"] + int(m["episodes"]),
                "rollout_tokens": prev["rollout_tokens"]
                + int(m["prompt_tokens"])
                + int(m["generated_tokens"]),
                "tool_calls": prev["tool_calls"] + int(m["tool_calls"]),
            }
        )
    return pd.DataFrame(rows)


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


def cell_matrix(chosen, episodes_of: dict, names: list[str], task_ids: list[str]) -> pd.DataFrame:
    """Every candidate x task cell; `ran` marks the cells executed, `order`/`rung` when and in
    which rung (0 = warm-up core); cells that did not run have no outcome."""
    log = pd.DataFrame([(c.candidate, c.item, c.order, c.rung) for c in chosen.cells],
                       columns=["candidate", "task_id", "order", "rung"])  # fmt: skip
    grid = pd.MultiIndex.from_product([names, task_ids], names=["candidate", "task_id"])
    rows = pd.concat(episodes_of.values(), ignore_index=True)[MATRIX_COLUMNS].merge(log)
    out = grid.to_frame(index=False).merge(rows, how="left", on=["candidate", "task_id"])
    return out.assign(ran=out["order"].notna())


def selection(chosen, summary: pd.DataFrame) -> dict:
    """The winner with its held-out success and interval (on the cells it ran), the cells spent
    against full evaluation, and how the choice was made."""
    best = summary.set_index("candidate").loc[chosen.winner]
    return {
        **chosen.summary(),
        "success": float(best["success"]),
        "interval": [float(best["success_lo"]), float(best["success_hi"])],
        "winner_cells": int(best["n"]),
    }


def main() -> None:
    stage_main("evaluate", run)


if __name__ == "__main__":
    main()
