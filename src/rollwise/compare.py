"""`rollwise compare`: pipeline runs side by side, from what the stages logged to MLflow.

One MLflow run is one pipeline run (track.open_run). The numbers come from the stages' own
metrics (tasks/common.finish_stage logs `<stage>/<key>`, step = round):
- `evaluate/final_success`, `_lo`, `_hi`: the final policy's held-out success, 95% interval
- `evaluate/cells` (runs logged before it existed: `evaluate/tasks` x candidates)
- `rollout/episodes`, `rollout/tool_calls`, `rollout/verifier_calls`: per round, summed here
- `evaluate/round_success`, step = round: each checkpoint's held-out success (the plot's curves)

A stage rerun inside the same MLflow run logs its round again; the latest value per round counts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import requests
from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from rollwise import track

FIXED_PARAMS = ("train.lr", "credit.method", "rounds")  # always shown, differing or not
SUMMED = {
    "rollouts": "rollout/episodes",
    "tool_calls": "rollout/tool_calls",
    "verifier_calls": "rollout/verifier_calls",
}
MAX_RUNS = 20


class CompareError(Exception):
    """A store, run or experiment that is not there; the message says which and where."""


@dataclass
class RunSummary:
    """One pipeline run, reduced to what the table and the plot show."""

    run_id: str
    name: str
    status: str
    params: dict[str, str]  # flattened as logged; `rounds` is the number of rounds
    success: float | None = None
    success_lo: float | None = None
    success_hi: float | None = None
    totals: dict[str, int | None] = field(default_factory=dict)  # SUMMED keys + eval_cells
    curve: list[tuple[int, int, float]] = field(default_factory=list)  # round, rollouts, success

    @property
    def label(self) -> str:
        return self.name or self.run_id[:8]


# ---------------------------------------------------------------------------- reading MLflow


def open_client(root: Path) -> MlflowClient:
    """A client on the project's store; a missing store or a server that is down fails at once
    (MLflow's own retries would stall for minutes, and a sqlite URI would create an empty db)."""
    uri = track.tracking_uri(root)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        raise CompareError(
            f"no MLflow store at {uri}: run the pipeline first (make run) or set "
            "MLFLOW_TRACKING_URI"
        )
    if uri.startswith(("http://", "https://")):
        try:
            requests.get(uri.rstrip("/") + "/health", timeout=5)
        except requests.RequestException as exc:
            raise CompareError(f"MLflow server {uri} unreachable: {exc}") from exc
    return MlflowClient(tracking_uri=uri)


def fetch_runs(
    client: MlflowClient, run_ids: Sequence[str], experiment: str, max_runs: int = MAX_RUNS
) -> list[Run]:
    """The named runs, in the order given; else the latest `max_runs` runs of `experiment`,
    oldest first."""
    if run_ids:
        runs = []
        for run_id in run_ids:
            try:
                runs.append(client.get_run(run_id))
            except MlflowException as exc:
                raise CompareError(
                    f"no MLflow run {run_id!r} at {client.tracking_uri} ({exc.error_code})"
                ) from exc
        return runs
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise CompareError(
            f"no MLflow experiment {experiment!r} at {client.tracking_uri}; "
            f"there are: {', '.join(names) or 'none'}"
        )
    runs = client.search_runs(
        [exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=max_runs
    )
    if not runs:
        raise CompareError(f"MLflow experiment {experiment!r} has no runs")
    return list(reversed(runs))


def per_round(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    """A metric's value per step (= round); the latest one where a stage was rerun."""
    history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)
    return {m.step: m.value for m in history}


def summarize(client: MlflowClient, run: Run) -> RunSummary:
    """Params, final success, spend totals and the success-vs-rollouts curve of one run."""
    params = {k: v for k, v in run.data.params.items() if not k.startswith("rounds.")}
    # rounds.01.start, rounds.01.policy (older runs: rounds.01): one round each
    n_rounds = len({k.split(".")[1] for k in run.data.params if k.startswith("rounds.")})
    if n_rounds:
        params["rounds"] = str(n_rounds)
    metrics, run_id = run.data.metrics, run.info.run_id
    rounds = {name: per_round(client, run_id, key) for name, key in SUMMED.items()}
    totals: dict[str, int | None] = {
        name: int(sum(v.values())) if v else None for name, v in rounds.items()
    }
    cells = metrics.get("evaluate/cells")
    if cells is None and "evaluate/tasks" in metrics and n_rounds:
        cells = metrics["evaluate/tasks"] * (n_rounds + 1)  # every candidate on every task
    totals["eval_cells"] = None if cells is None else int(cells)
    curve = [
        (r, int(sum(v for step, v in rounds["rollouts"].items() if step <= r)), success)
        for r, success in sorted(per_round(client, run_id, "evaluate/round_success").items())
    ]
    return RunSummary(
        run_id=run_id,
        name=run.info.run_name or "",
        status=run.info.status,
        params=params,
        success=metrics.get("evaluate/final_success"),
        success_lo=metrics.get("evaluate/final_success_lo"),
        success_hi=metrics.get("evaluate/final_success_hi"),
        totals=totals,
        curve=curve,
    )


# ---------------------------------------------------------------------------- table and plot


def key_params(runs: Sequence[RunSummary]) -> list[str]:
    """FIXED_PARAMS, then every param whose value differs between the runs (override.* repeat
    what the params already show, so they are left out)."""
    keys = sorted({k for r in runs for k in r.params if not k.startswith("override.")})
    differing = [k for k in keys if len({r.params.get(k) for r in runs}) > 1]
    return [*FIXED_PARAMS, *(k for k in differing if k not in FIXED_PARAMS)]


def table(runs: Sequence[RunSummary]) -> str:
    """One line per run: id, name, status, key params, final success (95% CI), spend, cells."""
    params = key_params(runs)
    head = ["run", "name", "status", *params, "final success (95% CI)", "rollouts"]
    head += ["tool calls", "verifier calls", "eval cells"]
    rows = [head]
    for r in runs:
        rows.append(
            [
                r.run_id[:8],
                r.name or "-",
                r.status,
                *(r.params.get(k, "-") for k in params),
                _success(r),
                *(_count(r.totals.get(k)) for k in (*SUMMED, "eval_cells")),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def _success(r: RunSummary) -> str:
    if r.success is None:
        return "-"
    if r.success_lo is None or r.success_hi is None:
        return f"{100 * r.success:.1f}%"
    return f"{100 * r.success:.1f}% ({100 * r.success_lo:.1f}–{100 * r.success_hi:.1f}%)"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def plot(runs: Sequence[RunSummary], path: Path) -> None:
    """Final held-out success per run with its 95% interval; beside it, where runs logged
    per-round evaluation, held-out success against the rollouts spent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [r for r in runs if r.curve]
    fig, axes = plt.subplots(1, 2 if curves else 1, figsize=(11 if curves else 6, 4), squeeze=False)
    ax = axes[0][0]
    done = [r for r in runs if r.success is not None]
    for i, r in enumerate(done):
        lo = r.success if r.success_lo is None else r.success_lo
        hi = r.success if r.success_hi is None else r.success_hi
        yerr = [[100 * (r.success - lo)], [100 * (hi - r.success)]]
        ax.errorbar([i], [100 * r.success], yerr=yerr, fmt="o", capsize=4)
    ax.set_xticks(range(len(done)), [r.label for r in done], rotation=20, ha="right")
    ax.set_ylabel("final held-out success (%), 95% CI")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3, axis="y")
    ax.set_title("Final held-out success per run")
    if curves:
        ax = axes[0][1]
        for r in curves:
            xs, ys = [c[1] for c in r.curve], [100 * c[2] for c in r.curve]
            ax.plot(xs, ys, marker="o", label=r.label)
        ax.set_xlabel("rollouts spent (episodes, cumulative)")
        ax.set_ylabel("held-out success (%)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("Held-out success against rollouts spent")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="MLflow run ids to compare")
    parser.add_argument(
        "--experiment",
        default=None,
        help=f"compare the latest runs of this experiment (default: {track.EXPERIMENT})",
    )
    parser.add_argument("--out", type=Path, default=Path("compare.png"), help="the plot to write")
    parser.add_argument("--max-runs", type=int, default=MAX_RUNS, help="runs of an experiment")
    parser.add_argument(
        "--root", type=Path, default=Path("."), help="project whose mlflow.db is the default store"
    )


def run(args: argparse.Namespace) -> int:
    """Print the table and write the plot; 2 with a one-line error when something is missing."""
    if args.run_ids and args.experiment:
        print("error: give run ids or --experiment, not both", file=sys.stderr)
        return 2
    try:
        client = open_client(args.root)
        found = fetch_runs(client, args.run_ids, args.experiment or track.EXPERIMENT, args.max_runs)
        runs = [summarize(client, r) for r in found]
    except CompareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(table(runs))
    plot(runs, args.out)
    print(f"\nplot: {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rollwise compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
