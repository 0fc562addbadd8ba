"""The evaluation report: a table per candidate and a plot of held-out success per round."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def plot_rounds(summary: pd.DataFrame, path: Path) -> None:
    """Held-out success (with 95% band) and mean reward against the training round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = summary["round"]
    ax.plot(x, 100 * summary["success"], marker="o", label="held-out success (%)")
    ax.fill_between(x, 100 * summary["success_lo"], 100 * summary["success_hi"], alpha=0.2)
    ax.plot(x, 100 * summary["reward"], marker="s", linestyle="--", label="mean reward (x100)")
    ax.set_xlabel("round (0 = warm start)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("Held-out evaluation per round")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(summary: pd.DataFrame, n_tasks: int) -> str:
    criteria = [c for c in summary.columns if c.startswith("criterion_")]
    head = "| round | success | 95% CI | reward | " + " | ".join(c[10:] for c in criteria) + " |"
    lines = [
        "# Held-out evaluation",
        "",
        f"{n_tasks} held-out tasks, greedy, one episode each.",
        "",
        head,
        "|" + "---|" * (4 + len(criteria)),
    ]
    for row in summary.itertuples():
        crit = " | ".join(f"{getattr(row, c):.2f}" for c in criteria)
        lines.append(
            f"| {row.round} | {100 * row.success:.1f}% | {100 * row.success_lo:.1f}–"
            f"{100 * row.success_hi:.1f}% | {row.reward:.3f} | {crit} |"
        )
    first, last = summary.iloc[0], summary.iloc[-1]
    gain = 100 * (last["success"] - first["success"])
    lines += ["", f"Final minus warm start: {gain:+.1f} points.", "", "![per round](per_round.png)"]
    return "\n".join(lines) + "\n"
