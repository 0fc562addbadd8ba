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
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from rollwise import track
from rollwise.config import EvaluateConfig, Params, ParamsError, load_params
from rollwise.evaluate.candidates import (
    PLOTS,
    ROUND_METRICS,
    SPEND_PLOTS,
    Candidate,
    choose,
    round_rows,
    stage_metrics,
)
from tasks.common import (
    CorruptArtifact,
    MissingUpstream,
    envs_dir,
    load_checkpoint,
    log,
    metrics_path,
    model_dir,
    read_json,
    read_suite,
    report_progress,
    stage_main,
    stage_of_model,
)

CANDIDATES_OUT = Path("data") / "eval_candidates"  # the standalone CLI's default --out


def pipeline_candidates(params: Params, root: Path) -> list[Candidate]:
    """round_00 .. round_R, then params' own candidates."""
    rounds = ["00", *params.rounds]
    own = [Candidate(f"round_{r}", model_dir(root, r), stage_of_model(r)) for r in rounds]
    return own + user_candidates(params.evaluate.candidates, root)


def user_candidates(named: Mapping[str, str], root: Path) -> list[Candidate]:
    """A relative folder is relative to the project root."""
    return [Candidate(n, root / Path(f).expanduser()) for n, f in named.items()]


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
    matrix = pd.read_parquet(out_dir / "matrix.parquet")
    return stage_metrics(chosen, candidates, summary, n_tasks, matrix)


def evaluate_candidates(
    params: Params, root: Path, candidates: list[Candidate], out_dir: Path
) -> tuple:
    """rollwise.evaluate.candidates.choose on the run's suite, pipeline checkpoints loaded
    through the stage cache, the rollout spend read from the rollout stages' metrics."""
    suite = read_suite(envs_dir(root))
    spend = rollout_spend(root, list(params.rounds))

    def progress(done: int, total: int, note: str) -> None:
        report_progress("evaluate", done, total, note)

    return choose(params, suite, candidates, out_dir, load_candidate, spend, progress)


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
