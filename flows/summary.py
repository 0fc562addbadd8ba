"""The end-of-run summary: what was learned, what it cost, where to look next."""

from __future__ import annotations

import json
from pathlib import Path

from rollwise.config import Params


def read_metrics(root: Path) -> dict[str, dict]:
    folder = root / "data" / "metrics"
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def stage_walls(metrics: dict[str, dict]) -> dict[str, float]:
    """Wall seconds per stage, rounds summed (`rollout@01` + `rollout@02` -> `rollout`)."""
    walls: dict[str, float] = {}
    for name, m in metrics.items():
        stage = name.split("@")[0]
        walls[stage] = walls.get(stage, 0.0) + m.get("wall_s", 0.0)
    return walls


def evaluation_lines(root: Path, params: Params) -> list[str] | None:
    """The evaluate stage's outputs, summarized (evaluate/report.py run_summary); None when
    they are missing (an older run: the metrics file's lines instead)."""
    import pandas as pd

    from rollwise.evaluate.report import run_summary

    out = root / "data" / "eval"
    files = [out / n for n in ("selection.json", "summary.parquet", "matrix.parquet")]
    if not all(f.exists() for f in files):
        return None
    sel = json.loads(files[0].read_text())
    winner = sel["winner"]
    folder = params.evaluate.candidates.get(winner, f"models/{winner}")
    return run_summary(sel, pd.read_parquet(files[1]), pd.read_parquet(files[2]), folder)


def summary_table(root: Path, params: Params, wall_s: float | None = None) -> str:
    m = read_metrics(root)
    ev = m.get("evaluate")
    lines = ["", "rollwise summary", "=" * 60]
    if ev and (found := evaluation_lines(root, params)):
        lines += found
    elif ev:
        for label, key in (("warm start", "warmstart"), ("final", "final")):
            lines.append(
                f"held-out success, {label:<10} {100 * ev[f'{key}_success']:5.1f}%  "
                f"(95% CI {100 * ev[f'{key}_success_lo']:.1f}–{100 * ev[f'{key}_success_hi']:.1f}%)"
            )
        lines.append(
            f"gain                          {ev['gain_pts']:+5.1f} points "
            f"on {ev['tasks']} held-out tasks"
        )
    rollouts = [v for k, v in m.items() if k.startswith("rollout@")]
    totals = {
        k: sum(r.get(k, 0) for r in rollouts)
        for k in ("episodes", "tool_calls", "verifier_calls", "generated_tokens")
    }
    lines += [
        f"rollouts spent                {totals['episodes']} episodes over {len(rollouts)} rounds",
        f"tool calls                    {totals['tool_calls']}",
        f"verifier calls                {totals['verifier_calls']}",
        f"generated tokens              {totals['generated_tokens']}",
        "",
        "wall time per stage (s)",
    ]
    by_stage = stage_walls(m)
    for stage in ("generate", "warmstart", "rollout", "curate", "credit", "train", "evaluate"):
        if stage in by_stage:
            lines.append(f"  {stage:<12} {by_stage[stage]:8.1f}")
    lines.append(f"  {'stages':<12} {sum(by_stage.values()):8.1f}")
    if wall_s is not None:  # stages plus process start-up and DVC's own bookkeeping
        lines.append(f"  {'pipeline':<12} {wall_s:8.1f}  (this dvc repro, end to end)")
    return "\n".join(lines)


NEXT_STEPS = """
Where to look next:
  data/eval/report.md, data/eval/*.png           the held-out report and plots
  data/eval/trajectories/                        sample episodes, readable
  dvc metrics show                               every stage's numbers
  make ui                                        Prefect UI (trigger runs), MLflow UI (compare)
  .venv/bin/rollwise compare                     every run's params, success and spend, side by side
  mlflow ui --backend-store-uri sqlite:///mlflow.db   MLflow alone, on this run's store
"""
