"""Rubric verifiers: several criteria in [0, 1] read from the final state, and a weighted reward.

`grounded`: a read-only task's answer counts only if the episode read the record the task asks
about. Without it a matching value read from another record (or a constant answer) passed: of
142 successful `status` episodes, 22 never read the record asked about and answered a status
that the right record happened to share (statuses are skewed per environment).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence

from rollwise.types import Observation, Rubric, Task, ToolCall

# The criteria every environment may score (custom environments and BFCL use these weights).
WEIGHTS = {
    "answer_correct": 0.4,
    "state_correct": 0.3,
    "no_side_effects": 0.1,
    "calls_valid": 0.1,
    "efficiency": 0.1,
}
# The synthetic suites' weights: a tenth of the answer's weight moves to grounding, so a guess
# earns less than a read answer and a fully right episode still scores 1.0.
GROUNDED_WEIGHTS = {**WEIGHTS, "answer_correct": 0.3, "grounded": 0.1}


def normalize(text: str | None) -> str:
    return (text or "").strip().strip(".").strip().lower()


def score(
    task: Task,
    answer: str | None,
    rows_before: dict[tuple, tuple],
    rows_after: dict[tuple, tuple],
    call_kinds: list[str],
    grounded: float = 1.0,
) -> Rubric:
    """Rows are keyed by (table, id). The target row of a write task must hold the target value;
    no other row may change. `grounded`: `grounding`'s verdict on the episode's calls."""
    changed = {
        k for k in rows_before.keys() | rows_after.keys() if rows_before.get(k) != rows_after.get(k)
    }
    target = (task.target["table"], task.target["id"]) if task.writes else None
    state_ok = target is None or task.target["status"] in (rows_after.get(target) or ())
    n_calls = len(call_kinds)
    scores = {
        "answer_correct": float(normalize(answer) == normalize(task.answer)),
        "grounded": grounded,
        "state_correct": float(state_ok),
        "no_side_effects": float(changed <= {target}),
        "calls_valid": sum(k == "ok" for k in call_kinds) / n_calls if n_calls else 1.0,
        # No call at all is not efficient: every task needs at least one.
        "efficiency": min(1.0, len(task.oracle) / n_calls) if n_calls else 0.0,
    }
    return Rubric(scores=scores, weights=GROUNDED_WEIGHTS)


def grounding(
    task: Task,
    made: Sequence[tuple[ToolCall, Observation]],
    read: Callable[[ToolCall], object | None],
    keys: Collection[str],
) -> float:
    """1.0 when the episode read the record a read-only task asks about: it made the oracle's
    last call (every read-only kind's answer comes from it: envs/generate.py), or an equivalent
    call, one whose result names the same record and holds the answer (`covers`). `read(call)`
    runs a call on the episode's start state, without faults (None: it fails); `keys` are the
    environment's key fields. Tasks that change state: 1.0, state_correct checks their record."""
    if task.writes or not task.oracle:
        return 1.0
    final = task.oracle[-1]
    ok = [(call, obs.content) for call, obs in made if obs.kind == "ok"]
    if any(call == final for call, _ in ok):  # a faulty result still read the right record
        return 1.0
    if not ok:
        return 0.0
    reference = read(final)
    results = (parse(content) for _, content in ok)
    return float(any(covers(r, reference, task.answer, keys) for r in results))


def covers(result: object, reference: object, answer: str, keys: Collection[str]) -> bool:
    """`result` says what `reference` (the oracle's last read) says about the task's record: both
    are objects, `result` holds the reference's first key field (the record read) with its value
    and every field whose value is the answer. A reference without a key (a list, an aggregate)
    names no record: only the oracle's own call reads it (another owner's equal total does not)."""
    if not (isinstance(result, dict) and isinstance(reference, dict)):
        return False
    key = next(((k, v) for k, v in reference.items() if k in keys), None)
    if key is None:
        return False
    fields = [(k, v) for k, v in reference.items() if normalize(str(v)) == normalize(answer)]
    return all(k in result and result[k] == v for k, v in [key, *fields])


def parse(content: str) -> object:
    """An observation's JSON (observations are data: json.loads only), or the raw text."""
    try:
        return json.loads(content)
    except (ValueError, RecursionError):
        return content
