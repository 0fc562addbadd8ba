"""Injected faults, so the curator can be tested against known ground truth.

Four kinds (params `envs.faults`, all off by default):
- flaky tools: a valid call fails (an environment error; the call does not run) or returns a
  wrong value (the call runs, the policy sees a corrupted result), with probability `flaky_p`;
- verifier noise: a verification's verdict flips with probability `verifier_flip_q`;
- unsolvable tasks: a tool the oracle needs is withheld from the policy's tool list;
- stochastic execution: a list result comes back in another (equally correct) order.

Every draw hashes (faults seed, task, episode seed, step), so a suite and its episodes are
deterministic from their seeds, and a retry of the same call (a later step) draws afresh: the
faults are transient. What was injected is written only to the audit table
(`data/envs/audit.parquet`, one row per task) and to each episode's audit rows (`env.audit`);
the catalog, the tasks and the observations' kinds never tell.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from rollwise.types import OPTIONAL_CRITERIA, SUCCESS_CRITERIA, Rubric, Task

AUDIT_FILE = "audit.parquet"
KNOBS_FILE = "faults.json"
AUDIT_COLUMNS = ["env_id", "task_id", "unsolvable", "withheld_tool"]
EPISODE_AUDIT_COLUMNS = ["env_id", "task_id", "seed", "step", "fault", "detail"]


class TransientFault(Exception):
    """An injected transient failure: shown to the policy as an environment error."""


def draw(*key: object) -> float:
    """A uniform in [0, 1) from the key alone: stable across processes (no hash())."""
    digest = hashlib.blake2b("/".join(map(str, key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


@dataclass(frozen=True)
class FaultPlan:
    """What the runtime needs: the rates, and the tool withheld per unsolvable task."""

    seed: int = 0
    flaky_p: float = 0.0
    flaky_wrong: float = 0.5
    verifier_flip_q: float = 0.0
    stochastic_p: float = 0.0
    withheld: dict[str, str] = field(default_factory=dict)


def assign(tasks: list[Task], cfg) -> list[dict]:
    """Audit rows, one per task: which tasks are unsolvable and which oracle tool they lose."""
    rows = []
    for task in tasks:
        tool = ""
        if draw(cfg.seed, task.task_id, "unsolvable") < cfg.unsolvable_frac:
            tools = sorted({c.name for c in task.oracle})
            tool = tools[int(draw(cfg.seed, task.task_id, "withheld") * len(tools))]
        values = (task.env_id, task.task_id, bool(tool), tool)
        rows.append(dict(zip(AUDIT_COLUMNS, values, strict=True)))
    return rows


def write(out: Path, cfg, rows: list[dict]) -> None:
    """The audit table and the knobs the runtime reads (only when some fault is on)."""
    pd.DataFrame(rows, columns=AUDIT_COLUMNS).to_parquet(out / AUDIT_FILE)
    knobs = cfg.model_dump(exclude={"unsolvable_frac"})
    (out / KNOBS_FILE).write_text(json.dumps(knobs, sort_keys=True))


def load(suite_dir: Path) -> FaultPlan | None:
    """The suite's fault plan, or None for a suite generated with every fault off."""
    knobs_path = Path(suite_dir) / KNOBS_FILE
    if not knobs_path.exists():
        return None
    audit = pd.read_parquet(Path(suite_dir) / AUDIT_FILE)
    hit = audit[audit["unsolvable"]]
    withheld = dict(zip(hit["task_id"], hit["withheld_tool"], strict=True))
    return FaultPlan(**json.loads(knobs_path.read_text()), withheld=withheld)


def corrupt(value, rng: random.Random, vocab: list[tuple[str, ...]]):
    """A plausible wrong value of the same shape: one number or word changed somewhere inside
    (a word is swapped for another of its vocabulary, e.g. a city for a city)."""
    if isinstance(value, list) and value:
        i = rng.randrange(len(value))
        return [*value[:i], corrupt(value[i], rng, vocab), *value[i + 1 :]]
    if isinstance(value, dict) and value:
        key = rng.choice(sorted(value))
        return {**value, key: corrupt(value[key], rng, vocab)}
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + rng.randint(1, 9)
    if isinstance(value, str):
        pool = next((p for p in vocab if value in p and len(p) > 1), None)
        return rng.choice([w for w in pool if w != value]) if pool else value + "x"
    return None if value is not None else 0  # an empty list or object, or null: still differs


def rotate(items: list, rng: random.Random) -> list:
    """The same items in another order (a non-identity rotation)."""
    k = rng.randrange(1, len(items))
    return items[k:] + items[:k]


def flip(scored: Rubric) -> Rubric:
    """The opposite verdict: a success loses its answer, a failure gets every success criterion."""
    scores = dict(scored.scores)
    if scored.success:
        scores["answer_correct"] = 0.0
    else:
        scores.update({k: 1.0 for k in SUCCESS_CRITERIA})
        scores.update({k: 1.0 for k in OPTIONAL_CRITERIA if k in scores})
    return Rubric(scores=scores, weights=scored.weights)
