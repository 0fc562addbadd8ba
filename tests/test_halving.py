"""The 2PL fit and paired successive halving, on simulated candidate x item matrices whose true
parameters are known."""

from __future__ import annotations

import numpy as np
import pytest

from rollwise.config import EvaluateConfig, ParamsError, load_params
from rollwise.evaluate.halving import SELECTORS, HalvingKnobs, Selection, select
from rollwise.evaluate.irt import fit_2pl, fit_theta, information, prob


def simulate(seed: int, thetas: np.ndarray, n_items: int) -> np.ndarray:
    """(C, I) outcomes drawn from a 2PL with items from the priors of design.md §4."""
    rng = np.random.default_rng(seed)
    a, b = np.exp(rng.normal(0, 0.5, n_items)), rng.normal(0, 1, n_items)
    return (rng.random((len(thetas), n_items)) < prob(thetas, a, b)).astype(float)


class Counting:
    """run_cells over a fixed matrix that records every cell it is asked to run."""

    def __init__(self, y: np.ndarray):
        self.y, self.calls = y, []

    def __call__(self, candidate: str, items: list[str]) -> list[float]:
        self.calls += [(candidate, it) for it in items]
        return [self.y[int(candidate[1:]), int(it[1:])] for it in items]


def run(y: np.ndarray, method: str = "halving", budget: int | None = None, **knobs):
    names = [f"c{i}" for i in range(y.shape[0])]
    items = [f"t{j}" for j in range(y.shape[1])]
    counting = Counting(y)
    return select(method, names, items, counting, budget, HalvingKnobs(**knobs)), counting


def test_irt_recovers_planted_item_parameters_and_abilities():
    rng = np.random.default_rng(0)
    n_c, n_i = 500, 40
    theta, a, b = rng.normal(size=n_c), np.exp(rng.normal(0, 0.5, n_i)), rng.normal(size=n_i)
    y = (rng.random((n_c, n_i)) < prob(theta, a, b)).astype(float)
    y[rng.random(y.shape) < 0.2] = np.nan  # missing cells carry no likelihood
    fit = fit_2pl(y)
    assert np.corrcoef(np.log(a), np.log(fit.a))[0, 1] >= 0.9
    assert np.corrcoef(b, fit.b)[0, 1] >= 0.95
    assert np.corrcoef(theta, fit.theta)[0, 1] >= 0.9
    # Items fixed: the Newton fit lands on the joint fit's abilities; errors shrink with cells.
    th, se = fit_theta(y, fit.a, fit.b)
    assert np.abs(th - fit.theta).max() < 0.05
    few = np.where(np.arange(n_i) < 5, y, np.nan)
    assert (fit_theta(few, fit.a, fit.b)[1] > se).all()
    # Information peaks where the ability meets the item's difficulty.
    info = information(np.array([0.0, 3.0]), np.array([1.0]), np.array([0.0]))
    assert info[0, 0] == pytest.approx(0.25) and info[1, 0] < 0.05


def test_halving_picks_the_true_best_with_far_fewer_cells_and_never_reruns_a_cell():
    thetas = np.array([-1.0, -0.6, -0.3, 0.0, 0.2, 0.4, 0.6, 1.4])  # c7 is best by far
    y = simulate(1, thetas, 300)
    sel, counting = run(y, budget=int(0.4 * y.size))
    full, _ = run(y, method="full")
    assert sel.winner == full.winner == "c7"
    assert sel.cells_used <= 0.3 * full.cells_used and full.cells_used == y.size
    assert len(counting.calls) == len(set(counting.calls)) == sel.cells_used
    assert [(c.candidate, c.item) for c in sel.cells] == counting.calls  # the log is the order


def test_survivors_ran_identical_items_and_the_budget_caps_cells():
    thetas = np.linspace(-0.3, 0.3, 8)  # closely matched: rungs run before any early stop
    y = simulate(2, thetas, 300)
    budget = int(0.3 * y.size)
    sel, counting = run(y, budget=budget)
    assert len(sel.rungs) >= 2 and sel.cells_used <= budget
    ran: dict[str, set[str]] = {}
    for cand, item in counting.calls:
        ran.setdefault(cand, set()).add(item)
    final = sel.rungs[-1]
    assert len({frozenset(ran[c]) for c in final}) == 1  # paired: the same items, all of them
    assert all(ran[c] < ran[final[0]] for c in sel.rungs[0] if c not in final)  # dropped early
    assert sel.winner in final
    assert all(len(r2) <= len(r1) for r1, r2 in zip(sel.rungs, sel.rungs[1:], strict=False))


def test_one_dominant_candidate_stops_after_the_warm_up():
    thetas = np.array([-1.0, -1.0, -1.0, -1.0, 3.0])
    y = simulate(3, thetas, 400)
    sel, _ = run(y, warmup_frac=0.1)
    assert sel.winner == "c4" and sel.stopped == "no survivor beats the leader"
    assert sel.cells_used == 5 * 40 and {c.rung for c in sel.cells} == {0}


def test_halving_is_deterministic_and_its_seed_matters():
    y = simulate(4, np.linspace(-0.5, 0.5, 6), 200)
    a, _ = run(y, budget=400, seed=0)
    b, _ = run(y, budget=400, seed=0)
    c, _ = run(y, budget=400, seed=1)
    assert a.cells == b.cells and a.winner == b.winner and a.theta == b.theta
    assert [x.item for x in a.cells] != [x.item for x in c.cells]


def test_selectors_and_params():
    assert set(SELECTORS) == {"full", "halving"}
    sel, _ = run(simulate(5, np.zeros(3), 20), method="full")
    assert isinstance(sel, Selection) and sel.summary()["cells_fraction"] == 1.0
    assert "cells" not in sel.summary() and sel.stopped == "every cell ran"
    assert EvaluateConfig(method="halving").halving.eta == 2
    with pytest.raises(ValueError, match="bogus"):
        EvaluateConfig.model_validate({"halving": {"bogus": 1}})


def test_params_yaml_names_a_bad_evaluate_key(tmp_path):
    (tmp_path / "params.yaml").write_text("evaluate: {method: random}\n")
    with pytest.raises(ParamsError, match="evaluate.method"):
        load_params(tmp_path / "params.yaml")


def test_tied_finalists_stop_inside_the_tolerance_instead_of_running_every_item():
    """Two identical checkpoints (a plateau's tie) and four far worse: no test can show a win
    between the two, so with tolerance 0 they run every item; with one point, the search stops
    once neither can beat the other by a point on full evaluation, and ships one of them."""
    y = simulate(6, np.array([-2.0, -2.0, -2.0, -2.0, 1.0, 1.0]), 400)
    y[5] = y[4]  # an exact tie
    strict, _ = run(y, tolerance=0.0)
    loose, _ = run(y)
    assert strict.stopped == "items exhausted" and strict.winner in {"c4", "c5"}
    assert loose.stopped == "no survivor beats the leader" and loose.winner in {"c4", "c5"}
    assert loose.cells_used < 0.75 * strict.cells_used


def test_the_stop_test_is_exact_once_every_item_ran_and_sharper_as_items_run_out():
    """Full evaluation's matrix is the target, so the paired test's standard error carries the
    finite-population correction: the same differences are stronger evidence on 90 of 100
    items than on 90 of 10,000, and on all items the difference is simply known."""
    from rollwise.evaluate.halving import CellLog, beats_leader_p

    y = np.array([[1.0] * 60 + [0.0] * 40, [1.0] * 55 + [0.0] * 45])  # c0 leads by 5 points
    log = CellLog(lambda c, its: [y[int(c[1:]), int(it[1:])] for it in its])
    items = [f"t{j}" for j in range(100)]
    for c in ("c0", "c1"):
        log.run(c, items, rung=0)
    part = items[:90]  # every item of c0's lead among them
    few_left = beats_leader_p(log, "c0", "c1", part, 100, 0.0)
    many_left = beats_leader_p(log, "c0", "c1", part, 10_000, 0.0)
    assert few_left < many_left < 0.5
    assert beats_leader_p(log, "c0", "c1", items, 100, 0.0) == 0.0  # known: c1 does not win
    assert beats_leader_p(log, "c1", "c0", items, 100, 0.01) == 1.0  # known: c0 wins by 5
    assert HalvingKnobs().stop_alpha < HalvingKnobs().alpha  # stopping is final: stronger evidence


def test_one_candidate_is_measured_on_every_item():
    """Nothing to choose: halving would stop after the warm-up core, so the one candidate runs
    every item and its success is on all of them."""
    sel, _ = run(simulate(5, np.zeros(1), 20), method="halving")
    assert sel.method == "full" and sel.cells_used == sel.cells_full == 20
