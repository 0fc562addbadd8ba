"""Stage `evaluate`: pick the checkpoint to ship on the held-out split -> data/eval/ (matrix,
summary, selection.json, report.md, plots, sample trajectories), logged to MLflow.

Candidates: every round's checkpoint (round_00 .. round_R) plus params `evaluate.candidates`
({name: Hugging Face model folder}). Every candidate folder is checked before any cell runs: a
missing or unloadable one fails at once, naming the folder.

Standalone, over your own folders only (params.yaml's `evaluate` section and suite; outputs in
--out; nothing is recorded for DVC or MLflow):

    python -m tasks.evaluate --candidate mine=/path/to/hf_folder --candidate base=/other/folder
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rollwise import track
from rollwise.config import EvaluateConfig, Params, ParamsError, load_params
from tasks.common import (
    CorruptArtifact,
    MissingUpstream,
    atomic_dir,
    corrupt,
    envs_dir,
    load_checkpoint,
    log,
    metrics_path,
    model_dir,
    read_json,
    read_suite,
    report_progress,
    require,
    stage_main,
    stage_of_model,
    write_json,
)

CANDIDATES_OUT = Path("data") / "eval_candidates"  # the standalone CLI's default --out


@dataclass(frozen=True)
class Candidate:
    name: str
    folder: Path
    stage: str | None = None  # the stage that writes it; None: a user's own folder

    @property
    def round(self) -> int | None:
        return int(self.name.removeprefix("round_")) if self.stage else None


def pipeline_candidates(params: Params, root: Path) -> list[Candidate]:
    """round_00 .. round_R, then params' own candidates."""
    rounds = ["00", *params.rounds]
    own = [Candidate(f"round_{r}", model_dir(root, r), stage_of_model(r)) for r in rounds]
    return own + user_candidates(params.evaluate.candidates, root)


def user_candidates(named: Mapping[str, str], root: Path) -> list[Candidate]:
    """A relative folder is relative to the project root."""
    return [Candidate(n, root / Path(f).expanduser()) for n, f in named.items()]


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


def load_candidate(c: Candidate):
    """(model, tokenizer); a folder that fails to load is named."""
    from rollwise.policy.build import load_policy

    if c.stage:
        return load_checkpoint(c.folder, c.stage)
    try:
        return load_policy(c.folder)
    except Exception as e:  # safetensors/json/tokenizer errors of a damaged folder
        raise CorruptArtifact(
            f"candidate {c.name}: {c.folder} failed to load ({type(e).__name__}: {e})"
        ) from e


def run(params: Params, root: Path) -> dict:
    """The DVC stage: every round's checkpoint plus params' candidates -> data/eval/."""
    candidates = pipeline_candidates(params, root)
    out_dir = root / "data" / "eval"
    chosen, summary, n_tasks = evaluate_candidates(params, root, candidates, out_dir)
    run_id = track.open_run(root, params.model_dump())
    rounds = round_rows(summary)
    for row in rounds.itertuples():  # the per-round curve `rollwise compare` plots
        per_round = {f"evaluate/round_{k}": getattr(row, k) for k in ROUND_METRICS}
        track.log_metrics(run_id, per_round, step=int(row.round), root=root)
    artifacts = ["report.md", "selection.json", *PLOTS, *SPEND_PLOTS, "trajectories"]
    present = [out_dir / a for a in artifacts if (out_dir / a).exists()]
    track.log_artifacts(run_id, present, "eval", root=root)
    return stage_metrics(chosen, candidates, summary, n_tasks)


def evaluate_candidates(
    params: Params, root: Path, candidates: list[Candidate], out_dir: Path
) -> tuple:
    """Select among `candidates` on the suite's `evaluate.split` (params `evaluate.method`) and
    write matrix, summary, selection.json, report.md, plots and the winner's sample trajectories
    to `out_dir` (atomically). Returns (Selection, summary frame, number of tasks)."""
    from rollwise.evaluate.full import evaluate_policy, evaluation_tasks, summarize
    from rollwise.evaluate.halving import HalvingKnobs, select
    from rollwise.policy.build import load_tokenizer
    from rollwise.policy.hf import HFBackend
    from rollwise.rollout.engine import Limits

    cfg = params.evaluate
    check_candidates(candidates)  # before any cell runs
    suite = read_suite(envs_dir(root))
    tasks = evaluation_tasks(suite, cfg.split, cfg.max_tasks)
    limits = Limits(
        max_turns=cfg.max_turns,
        max_new_tokens=cfg.max_new_tokens,
        max_context=params.policy.max_context,
        greedy=True,
    )
    by_name = {c.name: c for c in candidates}
    by_id = {t.task_id: t for t in tasks}
    ran: dict[str, list[pd.DataFrame]] = {n: [] for n in by_name}
    loaded: dict = {}  # the checkpoint in memory: cells run candidate by candidate
    full_cells = len(by_name) * len(tasks)

    def run_cells(name: str, task_ids: list[str]) -> list[float]:
        if loaded.get("name") != name:
            model, tokenizer = load_candidate(by_name[name])
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
    write_outputs(out_dir, chosen, summary, episodes_of, list(by_id), root, params, tokenizer)
    return chosen, summary, len(tasks)


def write_outputs(out_dir, chosen, summary, episodes_of, task_ids, root, params, tokenizer):
    from rollwise.evaluate.report import (
        COST_LABEL,
        markdown,
        plot_candidates,
        plot_rounds,
        plot_spend,
        write_samples,
    )

    rounds = round_rows(summary)
    spend = rollout_spend(root, list(params.rounds)) if len(rounds) else None
    curve = None if spend is None else rounds.merge(spend, on="round")
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
            log("evaluate", "no rollout metrics (data/metrics/rollout@NN.json): no spend plots")
        samples = write_samples(episodes_of[chosen.winner], tokenizer, out / "trajectories")
        text = markdown(summary, len(task_ids), curve, samples, chosen_json)
        (out / "report.md").write_text(text)


PLOTS = ("candidates.png", "per_round.png")
SPEND_PLOTS = ("success_vs_rollouts.png", "success_vs_cost.png")
ROUND_METRICS = ("success", "success_lo", "success_hi")


def round_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """The pipeline's own checkpoints, by round (user candidates have none)."""
    return summary.dropna(subset=["round"]).astype({"round": int}).sort_values("round")


def stage_metrics(chosen, candidates: list[Candidate], summary: pd.DataFrame, n_tasks) -> dict:
    """What the stage records (DVC metrics file, MLflow): cells spent, the choice, and the warm
    start's and final round's success when the rounds were evaluated."""
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
    return metrics | {"gain_pts": 100 * (last["success"] - first["success"])}


def rollout_spend(root: Path, rounds: list[str]) -> pd.DataFrame | None:
    """What had been spent on rollouts when each candidate was made (round 0, the warm start:
    nothing): cumulative episodes, rollout tokens (report.COST_LABEL) and tool calls, from the
    rollout stages' metrics files. None when one is missing (checkpoints made some other way)."""
    rows = [{"round": 0, "rollouts": 0, "rollout_tokens": 0, "tool_calls": 0}]
    for r in rounds:
        path = metrics_path(root, f"rollout@{r}")
        if not path.exists():
            return None
        m = read_json(path, f"rollout@{r}")
        prev = rows[-1]
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


def parse_candidates(items: list[str]) -> dict[str, str]:
    """`name=/path` pairs -> {name: path}; a malformed or repeated name is an error."""
    named: dict[str, str] = {}
    for item in items:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            raise ParamsError(f"--candidate {item!r}: expected NAME=/path/to/hf_folder")
        if name in named:
            raise ParamsError(f"--candidate {name}: given twice")
        named[name] = folder
    try:
        return EvaluateConfig(candidates=named).candidates  # the params' name rules
    except ValueError as e:
        raise ParamsError(f"--candidate: {e}") from e


def main(argv: list[str] | None = None) -> None:
    """No --candidate: the DVC stage. With --candidate: just those folders, into --out."""
    args = sys.argv[1:] if argv is None else argv
    if not any(a.startswith("--candidate") for a in args):
        stage_main("evaluate", run)
        return
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser("python -m tasks.evaluate", description=__doc__,
                                     formatter_class=raw)  # fmt: skip
    parser.add_argument("--candidate", action="append", required=True, metavar="NAME=FOLDER")
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--out", type=Path, help=f"default: ROOT/{CANDIDATES_OUT}")
    ns = parser.parse_args(args)
    out = ns.out or ns.root / CANDIDATES_OUT
    os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("ROLLWISE_TORCH_THREADS", "1"))
    try:
        params = load_params(ns.root / "params.yaml")
        candidates = user_candidates(parse_candidates(ns.candidate), Path.cwd())
        chosen, _, _ = evaluate_candidates(params, ns.root, candidates, out)
    except (ParamsError, MissingUpstream, CorruptArtifact) as e:
        sys.exit(f"error: {e}")
    log("evaluate", f"winner {chosen.winner}; {chosen.cells_used} cells; report {out}/report.md")


if __name__ == "__main__":
    main()
