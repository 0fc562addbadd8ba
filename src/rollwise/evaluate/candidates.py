"""Choosing the checkpoint to ship: every candidate folder checked before any cell runs, cells
run through the selection method (full or paired successive halving), and the outputs the
evaluate stage writes (cell matrix, summary, selection.json, report.md, plots, the winner's
sample trajectories). The stage (tasks/evaluate.py) reads the suite and the rollout spend and
writes nothing itself."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rollwise.artifacts import (
    CorruptArtifact,
    MissingUpstream,
    atomic_dir,
    corrupt,
    require,
    write_json,
)
from rollwise.config import Params

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    name: str
    folder: Path
    stage: str | None = None  # the stage that writes it; None: a user's own folder

    @property
    def round(self) -> int | None:
        return int(self.name.removeprefix("round_")) if self.stage else None


def check_candidates(candidates: list[Candidate]) -> None:
    """Every folder exists and looks loadable, before any cell runs; else the error names it."""
    from rollwise.evaluate.folders import NotAModel, check_hf_folder

    for c in candidates:
        if c.stage:
            require(c.folder, c.stage)
        try:
            check_hf_folder(c.folder)
        except FileNotFoundError as e:
            raise MissingUpstream(f"candidate {c.name}: {e} (evaluate.candidates)") from e
        except NotAModel as e:
            if c.stage:
                raise corrupt(c.folder, c.stage, e) from e
            raise CorruptArtifact(
                f"candidate {c.name}: {c.folder} is not a loadable Hugging Face model ({e})"
            ) from e


def choose(
    params: Params, suite, candidates: list[Candidate], out_dir: Path,
    load: Callable[[Candidate], tuple], spend: pd.DataFrame | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> tuple:  # fmt: skip
    """Select among `candidates` on the suite's `evaluate.split` (params `evaluate.method`) and
    write matrix, summary, selection.json, report.md, plots and the winner's sample trajectories
    to `out_dir` (atomically). `load(candidate)` gives its (model, tokenizer); `spend` is what
    rollouts had cost when each round's checkpoint was made (None: no spend plots). Returns
    (Selection, summary frame, number of tasks)."""
    from rollwise.evaluate.full import evaluate_policy, evaluation_tasks, summarize
    from rollwise.evaluate.halving import HalvingKnobs, select
    from rollwise.loop import greedy_limits
    from rollwise.policy.build import load_tokenizer
    from rollwise.policy.hf import HFBackend

    cfg = params.evaluate
    check_candidates(candidates)  # before any cell runs
    tasks = evaluation_tasks(suite, cfg.split, cfg.max_tasks)
    limits = greedy_limits(params, max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens)
    by_name = {c.name: c for c in candidates}
    by_id = {t.task_id: t for t in tasks}
    ran: dict[str, list[pd.DataFrame]] = {n: [] for n in by_name}
    loaded: dict = {}  # the checkpoint in memory: cells run candidate by candidate
    full_cells = len(by_name) * len(tasks)

    def run_cells(name: str, task_ids: list[str]) -> list[float]:
        if loaded.get("name") != name:
            model, tokenizer = load(by_name[name])
            loaded.update(name=name, backend=HFBackend(model, tokenizer), tokenizer=tokenizer)
        picked = [by_id[t] for t in task_ids]
        episodes = evaluate_policy(loaded["backend"], loaded["tokenizer"], suite, picked, limits)
        ran[name].append(episodes.assign(candidate=name))
        done = sum(len(e) for v in ran.values() for e in v)
        if progress is not None:
            progress(done, full_cells, f"{name}: {len(task_ids)} cells")
        success = dict(zip(episodes["task_id"], episodes["success"].astype(float), strict=True))
        return [success[t] for t in task_ids]

    budget = math.ceil(cfg.budget_frac * full_cells)
    knobs = HalvingKnobs(**cfg.halving.model_dump())
    chosen = select(cfg.method, list(by_name), list(by_id), run_cells, budget, knobs)
    episodes_of = {n: pd.concat(ran[n], ignore_index=True) for n in by_name if ran[n]}
    summary = pd.DataFrame(
        [
            {"candidate": n, "round": by_name[n].round, **summarize(e)}
            for n, e in episodes_of.items()
        ]
    ).astype({"round": "Int64"})
    tokenizer = loaded["tokenizer"]  # the winner's, for its sample trajectories
    if loaded["name"] != chosen.winner:
        tokenizer = load_tokenizer(by_name[chosen.winner].folder)
    write_outputs(out_dir, chosen, summary, episodes_of, list(by_id), spend, tokenizer)
    return chosen, summary, len(tasks)


def write_outputs(out_dir, chosen, summary, episodes_of, task_ids, spend, tokenizer) -> None:
    from rollwise.evaluate.report import (
        COST_LABEL,
        markdown,
        plot_candidates,
        plot_rounds,
        plot_spend,
        write_samples,
    )

    rounds = round_rows(summary)
    curve = None if spend is None or not len(rounds) else rounds.merge(spend, on="round")
    chosen_json = selection(chosen, summary)
    with atomic_dir(out_dir) as out:
        cell_matrix(chosen, episodes_of, list(episodes_of), task_ids).to_parquet(
            out / "matrix.parquet"
        )
        summary.to_parquet(out / "summary.parquet")
        write_json(out / "selection.json", chosen_json)
        plot_candidates(summary, chosen.winner, out / PLOTS[0])
        if len(rounds):
            plot_rounds(rounds, out / PLOTS[1])
        if curve is not None:
            plot_spend(curve, "rollouts", "rollouts spent (episodes)", out / SPEND_PLOTS[0])
            plot_spend(curve, "rollout_tokens", COST_LABEL, out / SPEND_PLOTS[1])
        elif len(rounds):
            log.info("no rollout metrics (data/metrics/rollout@NN.json): no spend plots")
        samples = write_samples(episodes_of[chosen.winner], tokenizer, out / "trajectories")
        text = markdown(summary, len(task_ids), curve, samples, chosen_json)
        (out / "report.md").write_text(text)


PLOTS = ("candidates.png", "per_round.png")
SPEND_PLOTS = ("success_vs_rollouts.png", "success_vs_cost.png")
ROUND_METRICS = ("success", "success_lo", "success_hi")


def round_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """The pipeline's own checkpoints, by round (user candidates have none)."""
    return summary.dropna(subset=["round"]).astype({"round": int}).sort_values("round")


def stage_metrics(
    chosen, candidates: list[Candidate], summary: pd.DataFrame, n_tasks,
    matrix: pd.DataFrame | None = None,
) -> dict:  # fmt: skip
    """What the stage records (DVC metrics file, MLflow): cells spent, the choice, and the warm
    start's and final round's success when the rounds were evaluated. With the cell `matrix`,
    `gain_pts` is paired on the tasks both ran (halving runs a weaker one on fewer tasks), with
    its 95% interval (`gain_lo`, `gain_hi`)."""
    from rollwise.evaluate.report import paired_gain

    winner = {c.name: c for c in candidates}[chosen.winner]
    metrics = {
        "tasks": n_tasks,
        "cells": chosen.cells_used,
        "cells_full": chosen.cells_full,
        "cells_fraction": chosen.cells_used / max(chosen.cells_full, 1),
        "chosen": chosen.winner,
        "chosen_round": -1 if winner.round is None else winner.round,  # -1: a user's folder
    }
    rounds = round_rows(summary)
    if not len(rounds):
        return metrics
    first, last = rounds.iloc[0], rounds.iloc[-1]
    for key, row in (("warmstart", first), ("final", last)):
        metrics |= {f"{key}_success{s}": float(row[f"success{s}"]) for s in ("", "_lo", "_hi")}
        metrics[f"{key}_reward"] = float(row["reward"])
    if matrix is None:
        return metrics | {"gain_pts": 100 * (last["success"] - first["success"])}
    g = paired_gain(matrix, first["candidate"], last["candidate"])
    return metrics | {"gain_pts": g.gain_pts, "gain_tasks": g.tasks,
                      "gain_lo": g.lo, "gain_hi": g.hi}  # fmt: skip


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
