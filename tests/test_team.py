"""TeamGym (envs/team.py, envs/teamplay.py) and CoSIR's reward (credit/cosir.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from rollwise.credit import ESTIMATORS
from rollwise.credit.cosir import message_credit, participant_credit, surprisal_drops, team_tables
from rollwise.envs.team import (
    CONDITIONS,
    NONE,
    Brief,
    Condition,
    Fact,
    TeamTask,
    check_pivotal,
    determined,
    make_tasks,
    posterior,
    setup,
    surprisal,
)
from rollwise.envs.teamplay import Scripted, parse_facts, play, round_metrics

# A three-fact example worked by hand: order 1 qualifies (delivered, amount >= 100), order 2 is
# ruled out by its status. Priors: delivered 1/3, amount >= 100 1/2, so each order qualifies
# with 1/6 before any fact and P(order 1 is the decision) = 1/6 * 5/6 = 5/36.
RULE = (Condition("status", "delivered", 1 / 3), Condition("amount", 100, 0.5))
F1, F2, F3 = (Fact("order", 1, "status", "delivered"), Fact("order", 1, "amount", 150),
              Fact("order", 2, "status", "pending"))  # fmt: skip
HAND = TeamTask(
    "hand", Brief("refund", ("customer", "order"), "customer_id", (1, 2), RULE), 1,
    (F1, F2, F3, Fact("order", 2, "amount", 40)), (F1, F2, F3), {},
)  # fmt: skip


@pytest.fixture(scope="module")
def tasks() -> list[TeamTask]:
    return make_tasks("shop", 0, 12) + make_tasks("clinic", 1, 8, n_candidates=4)


def test_pivotal_sets_are_minimal_and_sufficient_by_ablation(tasks):
    assert {t.kind for t in tasks} == {"refund", "qualify"}
    for t in tasks:
        assert determined(t.candidates, t.rule, t.pivotal) == t.decision  # sufficient
        for f in t.pivotal:  # each fact necessary: without it the decision is open
            rest = [g for g in t.pivotal if g != f]
            assert determined(t.candidates, t.rule, rest) is None
            assert posterior(t.candidates, t.rule, rest)[t.decision] < 1
        assert len(t.pivotal) >= len(t.candidates)  # the winner's facts and one per rival
        assert set(t.pivotal) <= set(t.facts)


def test_the_ablation_check_rejects_a_redundant_or_insufficient_set():
    check_pivotal(HAND)
    extra = Fact("order", 2, "amount", 40)  # order 2 is already out by its status
    with pytest.raises(ValueError, match="not necessary"):
        check_pivotal(TeamTask(**{**HAND.__dict__, "pivotal": (F1, F2, F3, extra)}))
    with pytest.raises(ValueError, match="does not determine"):
        check_pivotal(TeamTask(**{**HAND.__dict__, "pivotal": (F1, F2)}))


def test_surprisal_reward_by_hand_on_three_facts():
    assert surprisal(HAND, []) == pytest.approx(math.log2(36 / 5))
    drops = surprisal_drops(HAND, [frozenset({F1}), frozenset({F2}), frozenset({F3})])
    # P(order 1): 5/36 -> 1/2 * 5/6 = 5/12 -> 1 * 5/6 -> 1 * 1
    assert drops == pytest.approx([math.log2(3), 1.0, math.log2(6 / 5)])
    assert sum(drops) == pytest.approx(math.log2(36 / 5))
    assert posterior((1, 2), RULE, [F1, F2])[NONE] == pytest.approx(1 / 6)  # order 2 too


def test_a_message_that_repeats_a_known_fact_earns_nothing():
    drops = surprisal_drops(HAND, [frozenset({F1}), frozenset({F1}), frozenset()])
    assert drops[0] > 0 and drops[1] == 0.0 and drops[2] == 0.0


def test_conditions_share_their_decisions(tasks):
    for t in tasks[:6]:
        setups = [setup(t, c, 2, seed=3) for c in CONDITIONS]
        pivotal = set(t.pivotal)
        assert set().union(*setups[0].holdings) == pivotal  # single: one holds them all
        assert set().union(*setups[1].holdings) == pivotal  # split: dealt, nothing lost
        assert all(h for h in setups[1].holdings) and len(setups[1].holdings) == 2
        read = set().union(*setups[2].holdings)  # retrieval: readable from the rows
        assert pivotal <= read and all(f in set(t.facts) for f in read)
        for share, raw in zip(setups[1].holdings, setups[2].holdings, strict=True):
            assert share <= raw  # the same deal; the rows state more
        eps = [play(t, s, Scripted("all"), budget=40, seed=0) for s in setups]
        assert {e.task.decision for e in eps} == {t.decision}
        assert all(e.success for e in eps)  # enough budget: everyone shares everything


def test_the_protocol_records_who_disclosed_which_pivotal_fact(tasks):
    t = tasks[0]
    s = setup(t, "split", 2, seed=0)
    ep = play(t, s, Scripted("all"), budget=len(t.pivotal), seed=0)
    assert len(ep.messages) == len(t.pivotal)
    for m in ep.messages:
        (fact,) = m.pivotal
        assert fact in s.holdings[m.speaker] and m.text == fact.phrase
    assert [m.speaker for m in ep.messages][:2] == [1, 0]  # the decider speaks last in a round
    assert parse_facts("I see ORDER 12 amount is 3.5 and x") == {Fact("order", 12, "amount", 3.5)}
    quiet = play(t, s, Scripted("none"), budget=10, seed=0)
    assert quiet.messages == [] and quiet.decision in t.candidates
    cut = play(t, setup(t, "retrieval", 2, seed=0), Scripted("all"), budget=3, seed=0)
    assert len(cut.messages) == 3  # the budget binds


def test_round_metrics_measure_both_gaps_and_the_rates():
    """Five candidates over three participants: the decider's own share rarely decides."""
    wide = make_tasks("shop", 0, 40, n_candidates=5)

    def run(policy, budget):
        return [play(t, setup(t, c, 3, seed=0), policy, budget, seed=0)
                for t in wide for c in CONDITIONS]  # fmt: skip

    silent = round_metrics(run(Scripted("none"), 8))
    assert silent["success_pct"]["single"] == 100.0
    assert silent["communication_gap_pts"] > 0 and silent["disclosure_rate"] == 0.0
    chatty = round_metrics(run(Scripted("all"), 8))
    assert chatty["communication_gap_pts"] == 0.0 and chatty["retrieval_gap_pts"] > 0
    assert chatty["failure_to_use_rate"] == 0.0 and chatty["use_rate"] == 1.0
    deaf = round_metrics(run(Scripted("all", ignore_channel=True), 200))
    assert deaf["disclosure_rate"] == 1.0 and deaf["failure_to_use_rate"] > 0


def test_cosir_credit_per_participant_and_as_an_estimator(tasks):
    t = tasks[0]
    ep = play(t, setup(t, "split", 2, seed=0), Scripted("all"), budget=20, seed=0)
    rows = message_credit(ep, weight=0.5)
    assert sum(r["surprisal_drop"] for r in rows) == pytest.approx(surprisal(t, []))
    assert all(r["credit"] == pytest.approx(1.0 + 0.5 * r["surprisal_drop"]) for r in rows)
    credit = participant_credit(ep, weight=0.5)
    assert sum(credit.values()) == pytest.approx(sum(r["credit"] for r in rows))
    lost = play(t, setup(t, "split", 2, seed=0), Scripted("none"), budget=20, seed=0)
    episodes, steps = team_tables([ep, lost], ["a", "b"])
    cfg = SimpleNamespace(std_norm=False, eps=1e-6, cosir=SimpleNamespace(weight=2.0))
    adv = ESTIMATORS["cosir"](episodes, steps, cfg)
    outcome = (1.0 - lost.success) / 2  # Dr.GRPO-style centred outcome of the winning team
    expected = [outcome + 2.0 * r["surprisal_drop"] for r in rows]
    mine = adv[adv["episode_id"].str.startswith("a/")].sort_values("span_start")
    assert mine["advantage"].tolist() == pytest.approx(expected)
