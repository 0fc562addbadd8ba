"""Choosing the checkpoint to ship: `select(candidates, items, run_cells, budget, knobs)`.

SELECTORS holds the two ways: `full` (every candidate on every item) and `halving`, paired
successive halving (design.md §4): all candidates run a warm-up core of items; a 2PL model is fit
on every cell run so far; each rung keeps the top 1/eta by ability plus any candidate a paired
sign test cannot separate from the leader, then every survivor runs the same most informative
unused items (sum over survivors of a^2 p (1 - p)); it stops when no other survivor can beat the
leader by more than `tolerance` on full evaluation, when the items or the budget run out.

Two tests, two levels: keeping a candidate (`alpha`) only costs cells, stopping (`stop_alpha`,
Bonferroni over the survivors) is final, so the stop needs the stronger evidence. The stop is an
indifference zone (Bechhofer's): a strict win cannot be shown between checkpoints that tie, and
real checkpoint series end on a plateau of near-ties (bench/results/halving_pools/: the last 3-4
within a point or two), so a stop that waits for a win ran them on every item. Its target is full
evaluation's matrix, so the standard error carries the finite-population correction (0 once every
item ran). With one level (0.2 for both) and a cap of 0.4, bench/halving.py traced the misses
to: the true best dropped in an early rung by a sign test on 30-75 items; the cap ending the
search while near-tied finalists had shared only half the items; and false early stops. The
budget is a cap per selection (params `evaluate.budget_frac`, 0.6): clear pools stop long before
it, close ones can finish their finalists (bench/results/halving.json, `ablation`).

Departures from design.md §3/§4, on purpose:
- `run_cells(candidate, items) -> outcomes` runs one candidate on a list of items (one episode
  per cell), so a real backend batches them; every cell still runs at most once (CellLog).
- The item parameters are refit from all cells at each rung (joint MAP), not frozen after the
  warm-up: items first run in a rung have no parameters until then. Unrun items sit at the prior
  (a 1, b 0), ranked among themselves in a seeded random order.
- Pairing across seeds: an item names one (task, seed) episode; greedy evaluation has no seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy.stats import binom, norm

from rollwise.evaluate.irt import fit_2pl, fit_theta, information

RunCells = Callable[[str, list[str]], Sequence[float]]


@dataclass(frozen=True)
class HalvingKnobs:
    """The halving schedule (params `evaluate.halving` holds the same fields)."""

    warmup_frac: float = 0.1  # share of the items every candidate runs first (the core)
    round_frac: float = 0.05  # share of the items rung 1 adds; each later rung adds eta times more
    eta: int = 2  # keep the top 1/eta each rung
    alpha: float = 0.1  # one-sided paired sign test vs the leader: at or above it, kept
    stop_alpha: float = 0.02  # stop once "c beats the leader by tolerance" is rejected for every
    #                           survivor c below stop_alpha / survivors
    tolerance: float = 0.01  # a success difference not worth more cells (0.01: one point)
    seed: int = 0  # order of the core and of ties among items with equal information


@dataclass(frozen=True)
class Cell:
    candidate: str
    item: str
    outcome: float
    rung: int  # 0 = warm-up core
    order: int  # position in the execution log


@dataclass
class Selection:
    """The choice and how it was made: every executed cell in order, the survivors of each rung,
    and each candidate's ability (2PL, items fixed) with its standard error."""

    method: str
    winner: str
    cells: list[Cell]
    cells_full: int
    rungs: list[list[str]]
    theta: dict[str, float] = field(default_factory=dict)
    theta_se: dict[str, float] = field(default_factory=dict)
    stopped: str = ""

    @property
    def cells_used(self) -> int:
        return len(self.cells)

    def summary(self) -> dict:
        """The JSON-able part (no cell log): what selection.json carries."""
        out = {k: v for k, v in asdict(self).items() if k != "cells"}
        fraction = self.cells_used / max(self.cells_full, 1)
        new = [len({c.item for c in self.cells if c.rung == r}) for r in range(len(self.rungs))]
        return {**out, "rung_items": new, "cells_used": self.cells_used, "cells_fraction": fraction}


class CellLog:
    """Every executed cell, in order; asking for a cell already run reuses it, never reruns."""

    def __init__(self, run_cells: RunCells):
        self._run_cells = run_cells
        self.outcome: dict[tuple[str, str], float] = {}
        self.cells: list[Cell] = []

    def run(self, candidate: str, items: list[str], rung: int) -> None:
        todo = [it for it in items if (candidate, it) not in self.outcome]
        if not todo:
            return
        outcomes = list(self._run_cells(candidate, todo))
        assert len(outcomes) == len(todo), "run_cells must return one outcome per item"
        for it, y in zip(todo, outcomes, strict=True):
            self.outcome[candidate, it] = float(y)
            self.cells.append(Cell(candidate, it, float(y), rung, len(self.cells)))

    def matrix(self, candidates: list[str], items: list[str]) -> np.ndarray:
        """(C, I) outcomes, NaN where a cell has not run."""
        return np.array([[self.outcome.get((c, it), np.nan) for it in items] for c in candidates])


def paired_p(log: CellLog, leader: str, other: str, items: list[str]) -> float:
    """One-sided exact sign test that `leader` beats `other` on the items both ran (McNemar's
    exact test for binary outcomes): only discordant items carry evidence."""
    d = np.array([log.outcome[leader, it] - log.outcome[other, it] for it in items])  # (I,)
    wins, losses = int((d > 0).sum()), int((d < 0).sum())
    return float(binom.sf(wins - 1, wins + losses, 0.5)) if wins + losses else 1.0


def beats_leader_p(
    log: CellLog, leader: str, other: str, items: list[str], n_items: int, tolerance: float
) -> float:
    """One-sided p-value of "`other`'s full-evaluation success beats `leader`'s by `tolerance` or
    more", from the paired differences on the items both ran: a normal test whose standard error
    carries the finite-population correction, since the target is the mean over all `n_items`
    (at least one discordant item's worth of variance, so a short run of ties proves nothing)."""
    d = np.array([log.outcome[other, it] - log.outcome[leader, it] for it in items])  # (I,)
    n = len(d)
    var = max(float(d.var(ddof=1)) if n > 1 else 1.0, 1.0 / n)
    se = math.sqrt(var / n * (n_items - n) / max(n_items - 1, 1))
    if se == 0.0:  # every item ran: the difference is known
        return 0.0 if d.mean() < tolerance else 1.0
    return float(norm.cdf((d.mean() - tolerance) / se))


def full(
    candidates: list[str], items: list[str], run_cells: RunCells, budget: int | None,
    knobs: HalvingKnobs,
) -> Selection:  # fmt: skip
    """Every candidate on every item; the winner has the highest mean (ties: earliest)."""
    log = CellLog(run_cells)
    for c in candidates:
        log.run(c, items, rung=0)
    y = log.matrix(candidates, items)  # (C, I)
    mean = y.mean(1)  # (C,)
    return Selection("full", candidates[int(np.argmax(mean))], log.cells,
                     len(candidates) * len(items), [list(candidates)],
                     theta={c: float(m) for c, m in zip(candidates, mean, strict=True)},
                     stopped="every cell ran")  # fmt: skip


def halving(
    candidates: list[str], items: list[str], run_cells: RunCells, budget: int | None,
    knobs: HalvingKnobs,
) -> Selection:  # fmt: skip
    """Paired successive halving (module docstring). `budget` caps the cells executed."""
    n_c, n_i = len(candidates), len(items)
    budget = n_c * n_i if budget is None else budget
    log = CellLog(run_cells)
    col = {it: j for j, it in enumerate(items)}
    rank_of = {it: r for r, it in enumerate(np.random.default_rng(knobs.seed).permutation(items))}
    shuffled = sorted(items, key=rank_of.__getitem__)
    n_core = max(1, min(n_i, math.ceil(knobs.warmup_frac * n_i), budget // n_c))
    used = shuffled[:n_core]
    for c in candidates:
        log.run(c, used, rung=0)
    survivors, rungs, stopped = list(candidates), [list(candidates)], ""
    n_new = max(1, math.ceil(knobs.round_frac * n_i))
    while True:
        fit = fit_2pl(log.matrix(candidates, items))
        theta = dict(zip(candidates, fit.theta, strict=True))
        survivors.sort(key=lambda c: -theta[c])  # stable: ties keep candidate order
        leader = survivors[0]
        q = {c: beats_leader_p(log, leader, c, used, n_i, knobs.tolerance) for c in survivors[1:]}
        if all(v < knobs.stop_alpha / len(q) for v in q.values()):  # Bonferroni over survivors
            stopped = "no survivor beats the leader" if len(survivors) > 1 else "one survivor"
            break
        p = {c: paired_p(log, leader, c, used) for c in survivors[1:]}
        top = math.ceil(len(survivors) / knobs.eta)
        survivors = survivors[:top] + [c for c in survivors[top:] if p[c] >= knobs.alpha]
        seen = set(used)
        unused = [it for it in shuffled if it not in seen]
        room = (budget - len(log.cells)) // len(survivors)
        k = min(n_new, len(unused), room)
        if k <= 0:
            stopped = "items exhausted" if not unused else "budget spent"
            break
        idx = [col[it] for it in unused]
        at = np.array([theta[c] for c in survivors])  # (S,)
        info = information(at, fit.a[idx], fit.b[idx]).sum(0)  # (U,)
        pick = [unused[j] for j in np.argsort(-info, kind="stable")[:k]]
        rungs.append(list(survivors))
        for c in survivors:
            log.run(c, pick, rung=len(rungs) - 1)
        used, n_new = used + pick, n_new * knobs.eta
    th, se = fit_theta(log.matrix(candidates, items), fit.a, fit.b)
    return Selection("halving", leader, log.cells, n_c * n_i, rungs,
                     theta=dict(zip(candidates, th.tolist(), strict=True)),
                     theta_se=dict(zip(candidates, se.tolist(), strict=True)),
                     stopped=stopped)  # fmt: skip


SELECTORS: dict[str, Callable[..., Selection]] = {"full": full, "halving": halving}


def select(
    method: str, candidates: list[str], items: list[str], run_cells: RunCells,
    budget: int | None = None, knobs: HalvingKnobs = HalvingKnobs(),
) -> Selection:  # fmt: skip
    """The one entry point: dispatch through SELECTORS. One candidate leaves nothing to choose:
    it is measured on every item (halving would stop after its first)."""
    method = "full" if len(candidates) == 1 else method
    return SELECTORS[method](candidates, items, run_cells, budget, knobs)
