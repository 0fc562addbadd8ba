"""Rubric verifiers: several criteria in [0, 1] read from the final state, and a weighted reward."""

from __future__ import annotations

from rollwise.types import Rubric, Task

WEIGHTS = {
    "answer_correct": 0.4,
    "state_correct": 0.3,
    "no_side_effects": 0.1,
    "calls_valid": 0.1,
    "efficiency": 0.1,
}


def normalize(text: str | None) -> str:
    return (text or "").strip().strip(".").strip().lower()


def score(
    task: Task,
    answer: str | None,
    rows_before: dict[tuple, tuple],
    rows_after: dict[tuple, tuple],
    call_kinds: list[str],
) -> Rubric:
    """Rows are keyed by (table, id). The target row of a write task must hold the target value;
    no other row may change."""
    changed = {
        k for k in rows_before.keys() | rows_after.keys() if rows_before.get(k) != rows_after.get(k)
    }
    target = (task.target["table"], task.target["id"]) if task.writes else None
    state_ok = target is None or task.target["status"] in (rows_after.get(target) or ())
    n_calls = len(call_kinds)
    scores = {
        "answer_correct": float(normalize(answer) == normalize(task.answer)),
        "state_correct": float(state_ok),
        "no_side_effects": float(changed <= {target}),
        "calls_valid": sum(k == "ok" for k in call_kinds) / n_calls if n_calls else 1.0,
        # No call at all is not efficient: every task needs at least one.
        "efficiency": min(1.0, len(task.oracle) / n_calls) if n_calls else 0.0,
    }
    return Rubric(scores=scores, weights=WEIGHTS)
