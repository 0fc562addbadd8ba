"""The evaluation report: a table per candidate, plots of held-out success per round and against
what the rollouts cost, and sample trajectories as text a person can read."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import pandas as pd

# The cost measure of `plot_spend`/`markdown`: every token of every rollout episode, i.e. the
# prompt, the observations and the generated tokens (the episode's `prompt_tokens` counts all
# non-policy tokens). Rollout compute grows with it; tool and verifier calls are reported apart.
COST_LABEL = "rollout tokens (prompt + observations + generated)"


def _pyplot():
    """pyplot on the Agg backend: stages run headless."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_rounds(summary: pd.DataFrame, path: Path) -> None:
    """Held-out success (with 95% band) and mean reward against the training round."""
    plt = _pyplot()
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


def plot_candidates(summary: pd.DataFrame, winner: str, path: Path) -> None:
    """Held-out success of every candidate with its 95% interval (on the cells it ran), the
    chosen one marked: the picture of the choice, whatever the candidates are."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 0.9 + 0.35 * len(summary)))
    y = range(len(summary))
    mid, lo, hi = (100 * summary[k].to_numpy() for k in ("success", "success_lo", "success_hi"))
    colors = ["tab:orange" if c == winner else "tab:blue" for c in summary["candidate"]]
    ax.errorbar(mid, y, xerr=[mid - lo, hi - mid], fmt="none", ecolor="gray", capsize=3)
    ax.scatter(mid, y, c=colors, zorder=3)
    names = [f"{c} ({n} cells)" for c, n in zip(summary["candidate"], summary["n"], strict=True)]
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("held-out success (%), 95% interval")
    ax.grid(alpha=0.3, axis="x")
    ax.set_title(f"Candidates (chosen: {winner})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_spend(curve: pd.DataFrame, x: str, xlabel: str, path: Path) -> None:
    """Held-out success (95% band) of each candidate against the cumulative rollout spend `x`
    that produced it: what a round of RL bought, in the unit the budget is spent in."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(curve[x], 100 * curve["success"], marker="o", label="held-out success (%)")
    ax.fill_between(curve[x], 100 * curve["success_lo"], 100 * curve["success_hi"], alpha=0.2)
    for row in curve.itertuples():
        ax.annotate(f"r{row.round}", (getattr(row, x), 100 * row.success), fontsize=7,
                    xytext=(3, 4), textcoords="offset points")  # fmt: skip
    ax.set_xlabel(xlabel)
    ax.set_ylabel("held-out success (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(f"Held-out success against {xlabel.split(' (')[0]}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render_trajectory(row: Mapping, tokenizer) -> str:
    """One episode as readable text, decoded from its own token ids (exactly what the policy saw
    and wrote): the prompt, then each policy turn (tool calls or the answer) and each
    observation, split where the loss mask flips."""
    ids, mask = list(row["token_ids"]), [int(m) for m in row["loss_mask"]]
    prompt_len = int(row["prompt_len"])
    lines = [
        f"episode {row['episode_id']}  task {row['task_id']}  env {row['env_id']}",
        f"success {bool(row['success'])}  reward {float(row['reward']):.3f}  "
        f"termination {row['termination']}  turns {row['turns']}  tool calls {row['tool_calls']}",
        f"rubric {row['rubric']}",
        "",
        f"--- prompt ({prompt_len} tokens) ---",
        _decode(tokenizer, ids[:prompt_len]),
    ]
    turn, start = 0, prompt_len
    for policy, run in itertools.groupby(range(prompt_len, len(ids)), key=lambda i: mask[i]):
        end = start + len(list(run))
        if policy:
            turn += 1
            title = f"policy, turn {turn} ({end - start} tokens)"
        else:
            title = f"observation ({end - start} tokens)"
        lines += [f"--- {title} ---", _decode(tokenizer, ids[start:end])]
        start = end
    answer = row["answer"]
    if not isinstance(answer, str) or not answer:  # None (or NaN from parquet): no answer given
        answer = f"(none; ended by {row['termination']})"
    lines += ["--- answer ---", answer]
    return "\n".join(lines) + "\n"


def _decode(tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False).strip("\n")


def pick_samples(episodes: pd.DataFrame, k: int = 3) -> pd.DataFrame:
    """Up to `k` episodes, successes and failures alternating (each in row order), so the
    samples show both what the policy gets right and what it gets wrong."""
    episodes = episodes.reset_index(drop=True)
    won = episodes["success"].astype(bool)
    wins, losses = episodes.index[won].tolist(), episodes.index[~won].tolist()
    order = [i for pair in itertools.zip_longest(wins, losses) for i in pair if i is not None]
    return episodes.loc[order[:k]]


def write_samples(episodes: pd.DataFrame, tokenizer, folder: Path, k: int = 3) -> list[str]:
    """`pick_samples` rendered one .txt file each under `folder`; returns the file names."""
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i, row in enumerate(pick_samples(episodes, k).to_dict("records"), start=1):
        name = f"{i:02d}_{re.sub(r'[^A-Za-z0-9._-]+', '_', str(row['task_id']))}.txt"
        (folder / name).write_text(render_trajectory(row, tokenizer))
        names.append(name)
    return names


def markdown(
    summary: pd.DataFrame,
    n_tasks: int,
    curve: pd.DataFrame | None = None,
    samples: Sequence[str] = (),
    selection: Mapping | None = None,
) -> str:
    """report.md: a row per candidate (success on the cells it ran), the per-round gain when the
    rounds were evaluated, how the checkpoint was chosen (`selection`: selection.json), spend."""
    criteria = [c for c in summary.columns if c.startswith("criterion_")]
    head = "| candidate | cells | success | 95% CI | reward | " + " | ".join(
        c[10:] for c in criteria
    ) + " |"  # fmt: skip
    lines = ["# Held-out evaluation", "", f"{n_tasks} held-out tasks, greedy, one episode each."]
    if selection is not None:
        lines += ["", shipped_line(selection)]
    lines += [
        "",
        head,
        "|" + "---|" * (5 + len(criteria)),
    ]
    for row in summary.itertuples():
        crit = " | ".join(f"{getattr(row, c):.2f}" for c in criteria)
        lines.append(
            f"| {row.candidate} | {row.n} | {100 * row.success:.1f}% | {100 * row.success_lo:.1f}–"
            f"{100 * row.success_hi:.1f}% | {row.reward:.3f} | {crit} |"
        )
    rounds = summary.dropna(subset=["round"]).sort_values("round")
    if len(rounds) > 1:
        first, last = rounds.iloc[0], rounds.iloc[-1]
        gain = 100 * (last["success"] - first["success"])
        note = "" if first["n"] == last["n"] == n_tasks else (
            f" (each on the tasks it ran: {first['n']} and {last['n']}; the run summary pairs "
            "them on the tasks both ran)"
        )  # fmt: skip
        lines += ["", f"Final round minus warm start: {gain:+.1f} points{note}.", "",
                  "![per round](per_round.png)"]  # fmt: skip
    if selection is not None:
        lines += ["", *selection_section(selection)]
    if curve is not None:
        lines += [
            "",
            "## What the rollouts cost",
            "",
            f"Cumulative over the rounds that trained each candidate; cost = {COST_LABEL}.",
            "",
            "| round | rollouts | rollout tokens | tool calls | success |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {row.round} | {row.rollouts} | {row.rollout_tokens} | {row.tool_calls} | "
            f"{100 * row.success:.1f}% |"
            for row in curve.itertuples()
        ]
        lines += [
            "",
            "![success vs rollouts](success_vs_rollouts.png)",
            "![success vs cost](success_vs_cost.png)",
        ]
    if samples:
        lines += ["", "## Sample trajectories (the chosen candidate)", ""]
        lines += [f"- [{name}](trajectories/{name})" for name in samples]
    return "\n".join(lines) + "\n"


def shipped_line(sel: Mapping) -> str:
    """One sentence: the shipped policy (the selection's winner), its held-out success with its
    interval on the tasks it ran, and what choosing it cost against full evaluation."""
    lo, hi = sel["interval"]
    return (
        f"Shipped policy: **{sel['winner']}**, held-out success {100 * sel['success']:.1f}% "
        f"(95% CI {100 * lo:.1f}–{100 * hi:.1f}%) on the {sel['winner_cells']} tasks it ran; "
        f"chosen by {METHODS.get(sel['method'], sel['method'])} in {sel['cells_used']} of the "
        f"{sel['cells_full']} cells of full evaluation ({100 * sel['cells_fraction']:.1f}%)."
    )


class PairedGain(NamedTuple):
    """Final minus warm start in points on the tasks both ran, with a 95% normal interval of
    the paired mean (each task's difference is -1, 0 or +1)."""

    gain_pts: float
    tasks: int
    lo: float
    hi: float


def paired_gain(matrix: pd.DataFrame, first: str, last: str) -> PairedGain:
    """`last`'s success minus `first`'s on the tasks both ran (matrix.parquet): halving runs a
    weaker candidate on fewer tasks, so unpaired means differ in tasks; pairing also narrows the
    interval, since both ran the same tasks."""
    ran = matrix[matrix["ran"]].pivot(index="task_id", columns="candidate", values="success")
    both = ran.reindex(columns=[first, last]).dropna().astype(float)
    if both.empty:
        return PairedGain(float("nan"), 0, float("nan"), float("nan"))
    return paired_difference(both[last] - both[first])


def paired_difference(d: pd.Series) -> PairedGain:
    """The mean of per-task differences in success (non-empty), in points, with its 95% normal
    interval: what every paired gain in the project reports (the evaluate stage, the benches)."""
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else 0.0
    mean = float(d.mean())
    return PairedGain(100 * mean, len(d), 100 * (mean - 1.96 * se), 100 * (mean + 1.96 * se))


def run_summary(sel: Mapping, summary: pd.DataFrame, matrix: pd.DataFrame, folder: str) -> list:
    """The evaluation lines of `make run`'s summary (flows/summary.py): the shipped policy (the
    selection's winner, in `folder`) with its held-out success, what choosing it cost against
    full evaluation, the warm start's and final round's success on the tasks each ran, and the
    gain paired on the tasks both ran."""
    lo, hi = sel["interval"]
    method = "paired successive halving" if sel["method"] == "halving" else sel["method"]
    lines = [
        f"shipped policy                {sel['winner']} ({folder})",
        f"held-out success, shipped     {100 * sel['success']:5.1f}%  (95% CI {100 * lo:.1f}–"
        f"{100 * hi:.1f}%) on {sel['winner_cells']} tasks",
        f"checkpoint selection          {method}: {sel['cells_used']} of {sel['cells_full']} "
        f"cells ({100 * sel['cells_fraction']:.1f}% of full evaluation)",
    ]
    rounds = summary.dropna(subset=["round"]).sort_values("round")
    if len(rounds) < 2:
        return lines
    first, last = rounds.iloc[0], rounds.iloc[-1]
    for label, row in (("warm start", first), ("final", last)):
        lines.append(
            f"held-out success, {label:<10} {100 * row['success']:5.1f}%  (95% CI "
            f"{100 * row['success_lo']:.1f}–{100 * row['success_hi']:.1f}%) on {row['n']} tasks"
        )
    g = paired_gain(matrix, first["candidate"], last["candidate"])
    lines.append(f"gain                          {g.gain_pts:+5.1f} points (95% CI {g.lo:+.1f} to "
                 f"{g.hi:+.1f}) on the {g.tasks} held-out tasks both ran "
                 "(final minus warm start)")  # fmt: skip
    return lines


METHODS = {
    "full": "full evaluation (every candidate on every task)",
    "halving": "paired successive halving (evaluate/halving.py)",
}


def selection_section(sel: Mapping) -> list[str]:
    """ "Checkpoint selection": method, the winner with its interval, cells used against full
    evaluation, and each rung (who ran it, how many new tasks, who was dropped after it)."""
    w = sel["winner"]
    lo, hi = sel["interval"]
    lines = [
        "## Checkpoint selection",
        "",
        f"Method: {METHODS.get(sel['method'], sel['method'])}; stopped: {sel['stopped']}.",
        "",
        f"Winner: **{w}**, held-out success {100 * sel['success']:.1f}% (95% CI "
        f"{100 * lo:.1f}–{100 * hi:.1f}%) on the {sel['winner_cells']} tasks it ran.",
    ]
    if sel.get("theta_se"):
        theta, se = sel["theta"][w], sel["theta_se"][w]
        lines[-1] += f" Ability (2PL, items fixed): {theta:.2f} ± {1.96 * se:.2f}."
    lines += [
        "",
        f"Cells: {sel['cells_used']} of the {sel['cells_full']} of full evaluation "
        f"({100 * sel['cells_fraction']:.1f}%).",
        "",
        "| rung | survivors | new tasks | dropped after the rung |",
        "|---|---|---|---|",
    ]
    rungs = sel["rungs"]
    for r, survivors in enumerate(rungs):
        nxt = rungs[r + 1] if r + 1 < len(rungs) else [w]
        dropped = [c for c in survivors if c not in nxt]
        name = "0 (warm-up)" if r == 0 and sel["method"] == "halving" else str(r)
        lines.append(f"| {name} | {len(survivors)}: {', '.join(survivors)} | "
                     f"{sel['rung_items'][r]} | {', '.join(dropped) or '-'} |")  # fmt: skip
    return [*lines, "", "![candidates](candidates.png)"]
