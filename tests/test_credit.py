"""Every credit estimator on hand-computed batches, the tracker the stage carries across rounds,
and the value diagnostics on a chain whose Q is known exactly."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rollwise.config import CreditConfig, ParamsError, rounds_dict, validate
from rollwise.credit import ESTIMATORS
from rollwise.credit.concal import calibrated_returns, concal, pool
from rollwise.credit.diagnostics import ToyChain, reference_q, value_report
from rollwise.credit.gigpo import gigpo
from rollwise.credit.grpo import grpo
from rollwise.credit.iapo import iapo
from rollwise.credit.raft import raft
from rollwise.credit.rloo import rloo
from rollwise.credit.spo import spo
from rollwise.credit.tracker import TRACKER_COLUMNS, attach, decay, from_json, to_json, walk
from rollwise.credit.turns import turn_table
from rollwise.types import ADVANTAGE_COLUMNS
from tasks.common import MissingUpstream

# Group "a": rewards 1, 0, 0, 1 -> mean 0.5, population std 0.5 (sample std would be 0.577).
# Group "b": 0.5, 0.5, 0.5 -> all equal. Rows interleave the groups on purpose.
EPISODES = pd.DataFrame(
    {
        "episode_id": ["a0", "b0", "a1", "b1", "a2", "a3", "b2"],
        "group": ["a", "b", "a", "b", "a", "a", "b"],
        "reward": [1.0, 0.5, 0.0, 0.5, 0.0, 1.0, 0.5],
        "turn_spans": [
            [[10, 14], [20, 25]],
            [[8, 9]],
            [[10, 12]],
            [[8, 10], [15, 16], [30, 31]],
            [[11, 13], [19, 20], [25, 27]],
            [[9, 15]],
            [[8, 12], [14, 18]],
        ],
    }
)
STEPS = pd.DataFrame(columns=["episode_id", "step"])


def per_episode(adv: pd.DataFrame) -> dict[str, float]:
    """The one advantage of each episode (asserting every turn carries the same value)."""
    out = {}
    for ep, g in adv.groupby("episode_id"):
        assert g["advantage"].nunique() == 1, ep
        out[ep] = g["advantage"].iloc[0]
    return out


def test_grpo_by_hand():
    adv = grpo(EPISODES, STEPS, CreditConfig(std_norm=True, eps=1e-6))
    values = per_episode(adv)
    # (1 - 0.5) / (0.5 + 1e-6) = 0.999998000004
    assert values["a0"] == pytest.approx(0.999998000004, rel=1e-12)
    assert values["a3"] == pytest.approx(0.999998000004, rel=1e-12)
    assert values["a1"] == pytest.approx(-0.999998000004, rel=1e-12)
    assert values["a2"] == pytest.approx(-0.999998000004, rel=1e-12)
    assert values["b0"] == values["b1"] == values["b2"] == 0.0  # exactly zero


def test_eps_is_added_to_the_std():
    values = per_episode(grpo(EPISODES, STEPS, CreditConfig(std_norm=True, eps=0.5)))
    assert values["a0"] == pytest.approx(0.5)  # 0.5 / (0.5 + 0.5)
    assert values["a1"] == pytest.approx(-0.5)


def test_dr_grpo_is_centred_only():
    values = per_episode(grpo(EPISODES, STEPS, CreditConfig(std_norm=False)))
    assert values == {"a0": 0.5, "a1": -0.5, "a2": -0.5, "a3": 0.5, "b0": 0, "b1": 0, "b2": 0}


def test_one_row_per_turn_span():
    adv = grpo(EPISODES, STEPS, CreditConfig())
    assert list(adv.columns) == ADVANTAGE_COLUMNS
    assert len(adv) == sum(len(s) for s in EPISODES["turn_spans"]) == 13
    for ep, spans in zip(EPISODES["episode_id"], EPISODES["turn_spans"], strict=True):
        rows = adv[adv["episode_id"] == ep]
        assert rows["step"].tolist() == list(range(len(spans)))
        assert rows[["span_start", "span_end"]].to_numpy().tolist() == spans


def test_singleton_group_and_no_turns():
    episodes = pd.DataFrame(
        {
            "episode_id": ["x", "y", "z"],
            "group": ["solo", "pair", "pair"],
            "reward": [0.7, 0.2, 0.6],
            "turn_spans": [[[3, 5]], [], [[4, 9]]],
        }
    )
    adv = grpo(episodes, STEPS, CreditConfig())
    assert adv.set_index("episode_id")["advantage"].to_dict() == {
        "x": 0.0,
        "z": pytest.approx(0.2 / (0.2 + 1e-6)),
    }


def test_dispatch_is_the_registry():
    assert ESTIMATORS["grpo"] is grpo


# ---------------------------------------------------------------------------- shared helpers
def cfg(**kw) -> CreditConfig:
    return CreditConfig(eps=1e-12, **kw)


def by_turn(adv: pd.DataFrame) -> dict[tuple[str, int], float]:
    return {(e, int(k)): a for e, k, a in adv[["episode_id", "step", "advantage"]].to_numpy()}


def call(ep: str, k: int, span: int, before: str, after: str, tool: str, args: dict, obs: dict,
         kind: str = "ok") -> dict:  # fmt: skip
    return {"episode_id": ep, "step": k, "fingerprint_before": before, "fingerprint_after": after,
            "tool": tool, "arguments": json.dumps(args), "observation": json.dumps(obs),
            "observation_kind": kind, "span_start": span, "span_end": span + 4}  # fmt: skip


def episode(ep: str, group: str, reward: float, spans: list, answer: str | None = "x", **kw):
    return {"episode_id": ep, "group": group, "task_id": group, "reward": reward,
            "turn_spans": spans, "termination": "answer" if answer else "max_turns",
            "answer": answer, "policy_version": 0, **kw}  # fmt: skip


# ---------------------------------------------------------------------------- RLOO
def test_raft_by_hand_fine_tunes_on_successes_only():
    # success, not the trained reward: b's 0.5 rubric scores are no demos; an all-success group
    # (GRPO's zero) still gets 1, and the trainer drops every failure's all-zero turns
    from rollwise.train.trainer import training_batch

    episodes = EPISODES.assign(success=[True, False, False, False, False, True, False])
    adv = raft(episodes, STEPS, CreditConfig())
    assert per_episode(adv) == {"a0": 1.0, "a1": 0.0, "a2": 0.0, "a3": 1.0, "b0": 0.0,
                                "b1": 0.0, "b2": 0.0}  # fmt: skip
    all_won = EPISODES.assign(success=True)
    assert set(per_episode(raft(all_won, STEPS, CreditConfig())).values()) == {1.0}
    n = [32] * len(episodes)
    batch = training_batch(
        episodes.assign(token_ids=[list(range(k)) for k in n], loss_mask=[[1] * k for k in n],
                        logprobs=[[-1.0] * k for k in n]),
        adv,
    )  # fmt: skip
    assert len(batch) == 2 and {tuple(i for i, a in enumerate(it["adv"]) if a) for it in batch} \
        == {(10, 11, 12, 13, 20, 21, 22, 23, 24), (9, 10, 11, 12, 13, 14)}  # fmt: skip


def test_rloo_by_hand():
    values = per_episode(rloo(EPISODES, STEPS, cfg()))
    # group a (1, 0, 0, 1): 1 - mean(0, 0, 1) = 2/3; 0 - mean(1, 0, 1) = -2/3; group b all equal
    assert values["a0"] == values["a3"] == pytest.approx(2 / 3)
    assert values["a1"] == values["a2"] == pytest.approx(-2 / 3)
    assert values["b0"] == values["b1"] == values["b2"] == 0.0


def test_rloo_singleton_group_is_zero():
    episodes = pd.DataFrame(
        {
            "episode_id": ["x", "y", "z"],
            "group": ["solo", "p", "p"],
            "reward": [0.7, 0.2, 0.6],
            "turn_spans": [[[3, 5]], [[1, 2]], [[4, 9]]],
        }  # fmt: skip
    )
    values = per_episode(rloo(episodes, STEPS, cfg()))
    assert values == {"x": 0.0, "y": pytest.approx(-0.4), "z": pytest.approx(0.4)}


# ---------------------------------------------------------------------------- GiGPO / ConCal
# One task, three episodes of two turns. e0 and e1 call X from the start (reaching s1: a shared
# transition), then answer right (e0) and wrong (e1); e2 calls Y (reaching s2) and answers right.
# Anchor clusters: start {e0, e1, e2} turn 0; s1 {e0, e1} turn 1; s2 {e2} turn 1 (a singleton).
G_EPISODES = pd.DataFrame(
    [
        episode("e0", "g", 1.0, [[10, 14], [20, 22]], answer="paris"),
        episode("e1", "g", 0.0, [[10, 14], [20, 22]], answer="rome"),
        episode("e2", "g", 1.0, [[10, 14], [20, 22]], answer="paris"),
    ]  # fmt: skip
)
G_STEPS = pd.DataFrame(
    [
        call("e0", 0, 10, "f0", "s1", "X", {"q": 1}, {"v": "paris"}),
        call("e1", 0, 10, "f0", "s1", "X", {"q": 1}, {"v": "paris"}),
        call("e2", 0, 10, "f0", "s2", "Y", {"q": 2}, {"v": "paris"}),
    ]  # fmt: skip
)


def gigpo_cfg(norm: str = "mean_norm", **kw) -> CreditConfig:
    return cfg(gigpo={"gamma": 0.5, "omega": 1.0, "norm": norm}, **kw)


def test_turn_table_states_and_actions():
    turns = turn_table(G_EPISODES, G_STEPS)
    assert turns["state"].tolist() == ["start", "s1", "start", "s1", "start", "s2"]
    assert turns["action"].iloc[1] == "answer:paris" and turns["action"].iloc[3] == "answer:rome"
    assert turns["action"].iloc[0] == turns["action"].iloc[2] != turns["action"].iloc[4]
    assert turns["reward"].tolist() == [0, 1, 0, 0, 0, 1]


def test_gigpo_by_hand():
    # returns (gamma 0.5): e0 (0.5, 1), e1 (0, 0), e2 (0.5, 1). A^E (mean_norm): 1/3, -2/3, 1/3.
    # A^S: start (0.5, 0, 0.5) - 1/3 = (1/6, -1/3, 1/6); s1 (1, 0) - 1/2; s2 singleton -> 0.
    adv = by_turn(gigpo(G_EPISODES, G_STEPS, gigpo_cfg()))
    want = {("e0", 0): 0.5, ("e0", 1): 5 / 6, ("e1", 0): -1.0, ("e1", 1): -7 / 6,
            ("e2", 0): 0.5, ("e2", 1): 1 / 3}  # fmt: skip
    assert adv == pytest.approx(want)


def test_gigpo_mean_std_norm_and_omega():
    adv = by_turn(gigpo(G_EPISODES, G_STEPS, gigpo_cfg("mean_std_norm")))
    # A^E: (1/3, -2/3, 1/3) / std 0.4714 = (0.7071, -1.4142, 0.7071); A^S at s1: (1, -1)
    assert adv[("e0", 1)] == pytest.approx(0.5**0.5 + 1.0)
    assert adv[("e1", 1)] == pytest.approx(-(2**0.5) - 1.0)
    assert adv[("e2", 1)] == pytest.approx(0.5**0.5)  # singleton anchor: episode term only
    flat = cfg(gigpo={"omega": 0.0, "norm": "mean_std_norm"})
    plain = by_turn(gigpo(G_EPISODES, G_STEPS, flat))
    assert plain == pytest.approx(by_turn(grpo(G_EPISODES, G_STEPS, cfg())))


def test_gigpo_all_equal_cluster_is_exactly_zero():
    episodes = G_EPISODES.assign(reward=1.0)  # every return in every cluster is equal
    adv = gigpo(episodes, G_STEPS, gigpo_cfg("mean_std_norm"))
    assert (adv["advantage"] == 0.0).all()


def test_concal_pools_the_shared_transition():
    turns = turn_table(G_EPISODES, G_STEPS)
    # depth 1: Q = 1, 0 (e0, e1 share (start, X, s1): n 2, w = min(0.75, 1/2) = 0.5 of the other
    # visit) -> C = 0.5, 0.5; e2 alone keeps C = 1. Depth 0: Q = 0.5 C.
    q = calibrated_returns(turns, gamma=0.5, cap=0.75)
    assert q.tolist() == pytest.approx([0.25, 1.0, 0.25, 0.0, 0.5, 1.0])
    capped = calibrated_returns(turns, gamma=0.5, cap=0.25)  # w = 0.25: C = 0.75, 0.25
    assert capped.tolist() == pytest.approx([0.375, 1.0, 0.125, 0.0, 0.5, 1.0])
    adv = by_turn(concal(G_EPISODES, G_STEPS, gigpo_cfg(concal={"episode_term": "outcome"})))
    # start cluster (0.25, 0.25, 0.5) - 1/3; plus A^E of the rewards (1/3, -2/3, 1/3)
    assert adv[("e0", 0)] == pytest.approx(1 / 3 + 0.25 - 1 / 3)
    assert adv[("e1", 0)] == pytest.approx(-2 / 3 + 0.25 - 1 / 3)
    assert adv[("e1", 1)] == pytest.approx(-7 / 6)  # last turns are exact: same as GiGPO
    raw = by_turn(gigpo(G_EPISODES, G_STEPS, gigpo_cfg()))
    assert adv[("e0", 0)] - adv[("e1", 0)] < raw[("e0", 0)] - raw[("e1", 0)]  # noise shrunk


def test_concal_calibrated_episode_term():
    # episode_term calibrated: A^E from each turn's calibrated outcome (gamma 1), not the episode's
    # reward. Depth 1: Q = 1, 0, 1; e0, e1 pool (w 0.5) -> C = 0.5, 0.5; e2 C = 1. Depth 0: Q =
    # 0.5, 0.5, 1. Minus the group mean 2/3: e0 (-1/6, 1/3), e1 (-1/6, -2/3), e2 (1/3, 1/3).
    # Step term as above (gamma 0.5): start (-1/12, -1/12, 1/6), s1 (1/2, -1/2), s2 0.
    adv = by_turn(concal(G_EPISODES, G_STEPS, gigpo_cfg()))  # calibrated: the default
    want = {("e0", 0): -0.25, ("e0", 1): 5 / 6, ("e1", 0): -0.25, ("e1", 1): -7 / 6,
            ("e2", 0): 0.5, ("e2", 1): 1 / 3}  # fmt: skip
    assert adv == pytest.approx(want)
    # e0 and e1 took one action from one state: their later luck no longer splits that turn
    outcome = by_turn(concal(G_EPISODES, G_STEPS, gigpo_cfg(concal={"episode_term": "outcome"})))
    assert outcome[("e0", 0)] - outcome[("e1", 0)] == pytest.approx(1.0)
    equal = G_EPISODES.assign(reward=1.0)
    std = gigpo_cfg("mean_std_norm", concal={"episode_term": "calibrated"})
    assert (concal(equal, G_STEPS, std)["advantage"] == 0.0).all()
    with pytest.raises(ValueError, match="episode_term"):
        cfg(concal={"episode_term": "reward"})


def test_concal_pool_shares_the_other_visits_under_the_cap():
    own = pd.Series([1.0, 0.0, 0.0], index=["k"] * 3)  # n 3: w = 2/3, the plain key mean
    assert pool(own, 0.75).tolist() == pytest.approx([1 / 3] * 3)
    five = pd.Series([1.0, 0.0, 0.0, 0.0, 0.0, 7.0], index=["k"] * 5 + ["lone"])
    # n 5: w = min(0.75, 0.8); own keeps 0.25 (plain mean would keep 0.2); a lone key keeps its own
    assert pool(five, 0.75).tolist() == pytest.approx([0.25] + [0.75 * 0.25] * 4 + [7.0])


def test_concal_tracks_exact_q_differences_better_than_gigpo():
    # The bench's toy chain (4-6 dependent calls, G 8): within-anchor advantage differences
    # against exact Q differences. The old pool (own value inside the pooled mean) gave 0.94.
    chain = ToyChain(toy_bench_policy(), max_turns=8)
    ratios = []
    for seed in (1, 2, 3):
        episodes, steps = chain.sample([(f"t{i}", 4 + i % 3) for i in range(12)], 8, seed)
        turns = turn_table(episodes, steps)
        q = chain.exact_q(turns, episodes)
        errors = [value_report(turns, fn(episodes, steps, cfg())["advantage"].to_numpy(), q)
                  ["value_error"] for fn in (concal, gigpo)]  # fmt: skip
        ratios.append(errors[0] / errors[1])
    assert max(ratios) < 0.93 and np.mean(ratios) < 0.92


def toy_bench_policy() -> np.ndarray:
    """bench/credit.py toy_start: P(call, wrong, answer) by (calls left, last was an error)."""
    p = np.zeros((7, 2, 3))
    p[1:, 0], p[1:, 1], p[0] = [0.6, 0.25, 0.15], [0.5, 0.3, 0.2], [0.0, 0.4, 0.6]
    return p


def test_concal_without_shared_transitions_is_gigpo():
    steps = G_STEPS.assign(fingerprint_after=["s1", "s3", "s2"])  # nobody shares a transition
    assert by_turn(concal(G_EPISODES, steps, gigpo_cfg())) == pytest.approx(
        by_turn(gigpo(G_EPISODES, steps, gigpo_cfg()))
    )


# ---------------------------------------------------------------------------- IAPO
# e0 (reward 1): find -> {"id": 7}; a failed call; get(id 7) -> {"city": "Paris"}; "Paris".
# e1 (reward 0): find -> {"id": 7}; get(id 7) -> an error; answers "Paris" anyway.
I_EPISODES = pd.DataFrame(
    [
        episode("e0", "g", 1.0, [[0, 10], [20, 40], [50, 60], [70, 75]], answer="Paris"),
        episode("e1", "g", 0.0, [[0, 10], [20, 30], [40, 45]], answer="Paris"),
    ]  # fmt: skip
)
I_STEPS = pd.DataFrame(
    [
        call("e0", 0, 0, "a", "b", "find", {"name": "Ann"}, {"id": 7}),
        call("e0", 1, 20, "b", "c", "get", {"id": "x"}, {"error": "no such id"}, "tool_error"),
        call("e0", 2, 50, "c", "d", "get", {"id": 7}, {"id": 7, "city": "Paris"}),
        call("e1", 0, 0, "a", "b", "find", {"name": "Ann"}, {"id": 7}),
        call("e1", 1, 20, "b", "e", "get", {"id": 7}, {"error": "timeout"}, "env_error"),
    ]  # fmt: skip
)


def test_iapo_routes_along_support_and_failure():
    adv = by_turn(iapo(I_EPISODES, I_STEPS, cfg(std_norm=False)))  # A = +0.5, -0.5
    # e0: route = find, get, answer (weight 1); the failed call 0.25. tokens 10, 20, 10, 5:
    # sum n w = 30, so route turns get 0.5 * 45/30 = 0.75 and the failed call 0.1875.
    assert [adv[("e0", k)] for k in range(4)] == pytest.approx([0.75, 0.1875, 0.75, 0.75])
    # e1: blamed = the failed get and the answer that consumed it; tokens 10, 10, 5:
    # sum n w = 17.5, so blamed turns get -0.5 * 25/17.5 and find 0.25 of that.
    big = -0.5 * 25 / 17.5
    assert [adv[("e1", k)] for k in range(3)] == pytest.approx([0.25 * big, big, big])


def test_iapo_keeps_the_token_weighted_total():
    adv = iapo(I_EPISODES, I_STEPS, cfg())
    grpo_adv = grpo(I_EPISODES, I_STEPS, cfg())
    for a in (adv, grpo_adv):
        a["weighted"] = (a["span_end"] - a["span_start"]) * a["advantage"]
    totals = adv.groupby("episode_id")["weighted"].sum()
    want = grpo_adv.groupby("episode_id")["weighted"].sum()
    assert totals.to_dict() == pytest.approx(want.to_dict())
    assert adv["advantage"].nunique() > grpo_adv["advantage"].nunique()  # it did redistribute


def test_iapo_without_structure_is_grpo():
    steps = pd.DataFrame(columns=I_STEPS.columns)  # answers only: no graph edges
    episodes = I_EPISODES.assign(turn_spans=[[[0, 10]], [[0, 10]]])
    assert by_turn(iapo(episodes, steps, cfg())) == pytest.approx(
        by_turn(grpo(episodes, steps, cfg()))
    )


# ---------------------------------------------------------------------------- SPO / SPO++
SPO_CFG = {"prior_p": 0.5, "prior_n": 2.0, "rho_min": 0.875, "rho_max": 0.96, "d_half": 0.02}


def spo_batch() -> pd.DataFrame:
    """Task x: tracker (3, 1) at version 0; its episode of version 1 (KL 0.01 since) fails.
    Task y: never seen (prior 1, 1); its episode succeeds."""
    episodes = pd.DataFrame(
        [
            episode("x0", "x", 0.0, [[0, 10]], policy_version=1),
            episode("y0", "y", 1.0, [[0, 30]], policy_version=1),
        ]  # fmt: skip
    )
    tracker = pd.DataFrame([["x", 3.0, 1.0, 0.0, 0.0]], columns=TRACKER_COLUMNS)
    return attach(episodes, tracker, {0: 0.0, 1: 0.01})


def test_spo_tracker_baseline_and_update():
    episodes = spo_batch()
    c = cfg(method="spo", spo=SPO_CFG)
    baseline, post = walk(episodes, c.spo, by_version=False)
    assert baseline.tolist() == pytest.approx([0.75, 0.5])  # p before the update
    # x: rho = clip(2^(-0.01/0.02) = 0.707, 0.875, 0.96) = 0.875: (2.625, 0.875 + 1)
    rows = post.set_index("task_id")
    assert rows.loc["x", ["alpha", "beta", "version"]].tolist() == pytest.approx([2.625, 1.875, 1])
    assert rows.loc["y", ["alpha", "beta"]].tolist() == pytest.approx([2.0, 1.0])  # no decay
    # A = r - p = (-0.75, 0.5) -> standardized over the batch: (-1, 1)
    assert per_episode(spo(episodes, STEPS, c)) == pytest.approx({"x0": -1.0, "y0": 1.0})


def test_spo_decay_follows_policy_kl():
    c = cfg(spo=SPO_CFG).spo
    assert decay(0.0, c) == 0.96 and decay(1.0, c) == 0.875  # clipped at both ends
    assert decay(0.003, c) == pytest.approx(2 ** (-0.15))  # inside the clip


def test_spo_arrival_order_vs_spo_pp_version_order():
    """Two samples of x from version 1 and a late one from version 0, rows in arrival order."""
    episodes = pd.DataFrame(
        [
            episode("x1", "x", 1.0, [[0, 10]], policy_version=1),
            episode("x2", "x", 0.0, [[0, 10]], policy_version=1),
            episode("x0", "x", 1.0, [[0, 10]], policy_version=0),
        ]  # fmt: skip
    )
    tracker = pd.DataFrame([["x", 3.0, 1.0, 0.0, 0.0]], columns=TRACKER_COLUMNS)
    episodes = attach(episodes, tracker, {0: 0.0, 1: 0.01})
    c = cfg(spo=SPO_CFG).spo
    arrival, _ = walk(episodes, c, by_version=False)
    # arrival: x1 sees 0.75; then (0.875*3 + 1, 0.875*1) = (3.625, 0.875): x2 sees 3.625/4.5
    assert arrival[:2].tolist() == pytest.approx([0.75, 3.625 / 4.5])
    by_version, post = walk(episodes, c, by_version=True)
    # version order: x0 (version 0, same as the tracker: rho 0.96) first, then x1 and x2 as one
    # event: both see (0.96*3 + 1) / (0.96*3 + 1 + 0.96) = 3.88 / 4.84
    assert by_version.tolist() == pytest.approx([3.88 / 4.84, 3.88 / 4.84, 0.75])
    shuffled = episodes.iloc[[2, 1, 0]]
    again, post2 = walk(shuffled, c, by_version=True)
    assert again[::-1].tolist() == pytest.approx(by_version.tolist())  # arrival does not matter
    assert post2[["alpha", "beta"]].to_numpy() == pytest.approx(post[["alpha", "beta"]].to_numpy())


def test_spo_pp_centres_under_the_token_measure():
    """Failures run longer than successes (as they do: retries): SPO's per-trajectory whitening
    leaves the token-weighted mean negative; SPO++ centres it and gives it unit variance."""
    rng = np.random.default_rng(0)
    rewards = (np.arange(40) % 3 == 0).astype(float)
    lengths = np.where(rewards == 1, 10, 40) + rng.integers(0, 8, 40)
    episodes = pd.DataFrame(
        [episode(f"e{i}", f"t{i % 7}", rewards[i], [[0, int(lengths[i]) // 2],
                 [int(lengths[i]) // 2 + 5, int(lengths[i]) + 5]]) for i in range(40)]
    )  # fmt: skip
    for method in ("spo_pp", "spo"):
        adv = ESTIMATORS[method](episodes, STEPS, cfg(method=method))
        tokens = (adv["span_end"] - adv["span_start"]).to_numpy(float)
        a = adv["advantage"].to_numpy()
        mean = (tokens * a).sum() / tokens.sum()
        var = (tokens * (a - mean) ** 2).sum() / tokens.sum()
        if method == "spo_pp":
            assert mean == pytest.approx(0.0, abs=1e-12) and var == pytest.approx(1.0, rel=1e-9)
        else:  # zero mean per trajectory, not per token
            assert per_episode_mean(adv) == pytest.approx(0.0, abs=1e-12) and mean < -0.2


def per_episode_mean(adv: pd.DataFrame) -> float:
    return float(adv.groupby("episode_id")["advantage"].first().mean())


def test_tracker_round_trips_through_json():
    _, post = walk(spo_batch(), cfg(spo=SPO_CFG).spo, by_version=True)
    tracker, drift = from_json(json.loads(json.dumps(to_json(post, {0: 0.0, 1: 0.01}, 2))))
    assert drift == {0: 0.0, 1: 0.01}
    assert tracker.to_numpy().tolist() == post.to_numpy().tolist()
    assert from_json({"round": 0, "drift": {"0": 0.0}, "tracker": {}})[0].empty


# ---------------------------------------------------------------------------- every estimator
def toy_batch(seed: int = 0, group_size: int = 4):
    chain = ToyChain(toy_policy(), max_turns=6)
    return chain, *chain.sample([("t0", 3), ("t1", 4), ("t2", 3)], group_size, seed)


def toy_policy() -> np.ndarray:
    p = np.zeros((5, 2, 3))
    p[1:, 0] = [0.7, 0.2, 0.1]  # calls left, last ok: call, wrong call, answer
    p[1:, 1] = [0.5, 0.3, 0.2]  # calls left, last was an error
    p[0] = [0.0, 0.2, 0.8]  # chain done: answer (or a wrong call)
    return p


TOKEN_METHODS = {"opd", "opdvr", "farca"}  # read the columns credit/signals.py attaches


def with_token_inputs(episodes: pd.DataFrame) -> pd.DataFrame:
    """Token ids, the rollout's and a teacher's log-probs, and one fact per episode on its first
    turn's first token: what credit/signals.py would attach."""
    n = [int(spans[-1][1]) for spans in episodes["turn_spans"]]
    first = [int(spans[0][0]) for spans in episodes["turn_spans"]]
    facts = [[{"span_start": s, "span_end": s + 1, "supported": True, "reliability": 1.0}]
             for s in first]  # fmt: skip
    return episodes.assign(
        token_ids=[list(range(k)) for k in n], loss_mask=[[1] * k for k in n],
        logprobs=[[-1.0] * k for k in n], teacher_logprobs=[[-0.5] * k for k in n], facts=facts,
    )  # fmt: skip


@pytest.mark.parametrize("method", sorted(ESTIMATORS))
def test_every_estimator_has_the_one_signature(method: str):
    fn = ESTIMATORS[method]
    assert list(inspect.signature(fn).parameters) == ["episodes", "steps", "cfg"]
    _, episodes, steps = toy_batch()
    if method in TOKEN_METHODS:
        episodes = with_token_inputs(episodes)
    adv = fn(episodes, steps, cfg(method=method))
    extra = ["token_advantage"] if method in TOKEN_METHODS else []
    assert list(adv.columns) == ADVANTAGE_COLUMNS + extra
    spans = [(e, k, s, t) for e, sp in zip(episodes["episode_id"], episodes["turn_spans"],
                                           strict=True) for k, (s, t) in enumerate(sp)]  # fmt: skip
    assert [tuple(r) for r in adv[["episode_id", "step", "span_start", "span_end"]].to_numpy()] \
        == spans  # fmt: skip
    assert np.isfinite(adv["advantage"]).all() and (adv["advantage"] != 0).any()


def test_dispatch_covers_every_configurable_method():
    assert set(ESTIMATORS) == set(CreditConfig.model_fields["method"].annotation.__args__)
    for method, fn in ESTIMATORS.items():
        assert fn.__module__ == f"rollwise.credit.{method}"  # one file each


def test_credit_knobs_are_validated_by_path():
    with pytest.raises(ParamsError, match=r"credit\.gigpo\.bogus"):
        validate({"credit": {"gigpo": {"bogus": 1}}})
    with pytest.raises(ParamsError, match=r"credit\.spo\.rho_max"):
        validate({"credit": {"spo": {"rho_min": 0.95, "rho_max": 0.9}}})
    with pytest.raises(ParamsError, match=r"credit\.method"):
        validate({"credit": {"method": "ppo"}})


# ---------------------------------------------------------------------------- the stage
def write_round(root: Path, r: str, episodes: pd.DataFrame, steps: pd.DataFrame) -> None:
    for kind in ("rollouts", "curated"):
        (root / "data" / kind / f"round_{r}").mkdir(parents=True)
    episodes.to_parquet(root / "data" / "rollouts" / f"round_{r}" / "episodes.parquet")
    steps.to_parquet(root / "data" / "rollouts" / f"round_{r}" / "steps.parquet")
    decisions = pd.DataFrame({"episode_id": episodes["episode_id"], "kept": True,
                              "reason": "", "evidence": "", "weight": 1.0})  # fmt: skip
    decisions.to_parquet(root / "data" / "curated" / f"round_{r}" / "decisions.parquet")


def test_stage_carries_the_tracker_across_rounds(tmp_path: Path):
    from tasks import credit
    from tasks.warmstart import initial_states

    params = validate({"credit": {"method": "spo_pp", "spo": SPO_CFG},
                       "rounds": rounds_dict(2)})  # fmt: skip
    chain = ToyChain(toy_policy(), max_turns=6)
    for r, version in (("01", 0), ("02", 1)):
        episodes, steps = chain.sample([("t0", 3), ("t1", 4)], 4, seed=version, version=version)
        write_round(tmp_path, r, episodes.drop(columns="length"), steps)
    initial_states(tmp_path)
    credit.run(params, tmp_path, "01")
    state1 = json.loads((tmp_path / "data/advantages/round_01/credit_state.json").read_text())
    assert set(state1["tracker"]) == {"t0", "t1"} and state1["drift"] == {"0": 0.0}
    with pytest.raises(MissingUpstream, match=r"train@01"):
        credit.run(params, tmp_path, "02")  # the KL of the update that made policy 01
    (tmp_path / "data/metrics").mkdir()
    (tmp_path / "data/metrics/train@01.json").write_text(json.dumps({"approx_kl": 0.002}))
    credit.run(params, tmp_path, "02")
    state2 = json.loads((tmp_path / "data/advantages/round_02/credit_state.json").read_text())
    assert state2["drift"] == {"0": 0.0, "1": 0.002}
    # t0 in round 02 decays by rho = 2^(-0.002/0.02) (inside the clip) before its evidence
    eps2 = pd.read_parquet(tmp_path / "data/rollouts/round_02/episodes.parquet")
    r = eps2.loc[eps2["task_id"] == "t0", "reward"]
    a1, b1, _, _ = state1["tracker"]["t0"]
    rho = 2 ** (-0.1)
    assert state2["tracker"]["t0"][:2] == pytest.approx(
        [rho * a1 + r.sum(), rho * b1 + (1 - r).sum()]
    )
    adv = pd.read_parquet(tmp_path / "data/advantages/round_02/advantages.parquet")
    assert list(adv.columns) == ADVANTAGE_COLUMNS and len(adv) == sum(map(len, eps2["turn_spans"]))
    # an update the collapse guard undid moved the policy nowhere: version 1 drifted 0
    undone = {"approx_kl": 0.002, "guard_reverted": 1.0}
    (tmp_path / "data/metrics/train@01.json").write_text(json.dumps(undone))
    credit.run(params, tmp_path, "02")
    state2 = json.loads((tmp_path / "data/advantages/round_02/credit_state.json").read_text())
    assert state2["drift"] == {"0": 0.0, "1": 0.0}


def curated_round(tmp_path: Path) -> pd.DataFrame:
    """Round 01 of task "a": rewards 1, 0, 0, 1, one turn each, every episode kept at weight 1."""
    from tasks.warmstart import initial_states

    episodes = pd.DataFrame(
        [episode(f"a{i}", "a", r, [[3, 6]], token_ids=list(range(8)), loss_mask=[0, 0, 0] + [1] * 3
                 + [0, 0], logprobs=[-0.5] * 8) for i, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    )  # fmt: skip
    steps = pd.DataFrame([call(f"a{i}", 0, 3, "s0", "s1", "get", {"id": 1}, {}) for i in range(4)])
    write_round(tmp_path, "01", episodes, steps)
    initial_states(tmp_path)
    return episodes


def stage_advantages(tmp_path: Path, params) -> tuple[dict[str, float], dict]:
    from tasks import credit

    credit.run(params, tmp_path, "01")
    out = tmp_path / "data/advantages/round_01"
    adv = pd.read_parquet(out / "advantages.parquet")
    return per_episode(adv), json.loads((out / "credit_state.json").read_text())


def test_stage_scales_advantages_by_the_decision_weight(tmp_path: Path):
    curated_round(tmp_path)
    params = validate({"rounds": rounds_dict(1)})
    full, _ = stage_advantages(tmp_path, params)
    decisions_path = tmp_path / "data/curated/round_01/decisions.parquet"
    decisions = pd.read_parquet(decisions_path)
    decisions.loc[decisions["episode_id"] == "a1", "weight"] = 0.5  # `curate.action: weight`
    decisions.to_parquet(decisions_path)
    half, _ = stage_advantages(tmp_path, params)
    assert full["a1"] == pytest.approx(-1.0, abs=1e-5)  # (0 - 0.5) / 0.5
    assert half["a1"] == pytest.approx(0.5 * full["a1"])
    assert {k: v for k, v in half.items() if k != "a1"} == {
        k: v for k, v in full.items() if k != "a1"
    }


def test_stage_trains_on_success_when_asked(tmp_path: Path):
    """Rubric partial credit (0.6 for a failed episode) separates a group that success does
    not: with `credit.reward: success` the all-failed group gives zeros, the rubric does not."""
    from tasks.warmstart import initial_states

    rows = [episode(f"a{i}", "a", r, [[3, 6]], success=False) for i, r in enumerate([0.6, 0.0])]
    write_round(tmp_path, "01", pd.DataFrame(rows),
                pd.DataFrame([call(f"a{i}", 0, 3, "s0", "s1", "get", {"id": 1}, {})
                              for i in range(2)]))  # fmt: skip
    initial_states(tmp_path)
    rubric, _ = stage_advantages(tmp_path, validate({"rounds": rounds_dict(1)}))
    success, state = stage_advantages(
        tmp_path, validate({"credit": {"reward": "success"}, "rounds": rounds_dict(1)})
    )
    assert rubric["a0"] == pytest.approx(1.0, abs=1e-4) == -rubric["a1"]  # (0.6 - 0.3) / 0.3
    assert success == {"a0": 0.0, "a1": 0.0}
    assert state["tracker"]["a"][:2] == pytest.approx([1.0, 3.0])  # prior (1, 1) + two failures
    with pytest.raises(ParamsError, match=r"credit\.reward"):
        validate({"credit": {"reward": "progress"}})


def test_stage_replays_positives_into_credit_and_the_training_batch(tmp_path: Path):
    from rollwise.curate import success_bank
    from rollwise.train.trainer import training_batch

    curated_round(tmp_path)
    params = validate({"rounds": rounds_dict(1)})
    _, state_without = stage_advantages(tmp_path, params)
    turn = [{"name": "get", "arguments": {"id": 1}, "observation": "{}", "step": 0,
             "fingerprint_before": "s0", "fingerprint_after": "s1", "observation_kind": "ok",
             "span_start": 3, "span_end": 7}]  # fmt: skip
    bank = pd.DataFrame([{
        "task_id": "a", "env_id": "e", "episode_id": "r00/a/s0", "round": 0, "policy_version": 0,
        "reward": 1.0, "answer": "x", "trajectory": json.dumps([turn]), "key": "k",
        "tool_calls": 1, "token_ids": [9] * 10, "loss_mask": [0] * 3 + [1] * 7,
        "logprobs": [-2.0] * 10, "turn_spans": [[3, 7], [8, 10]], "prompt_len": 3}])  # fmt: skip
    positives = success_bank.positives(bank, ["a"], per_task=1, r=1)
    positives.to_parquet(tmp_path / "data/curated/round_01/positives.parquet")
    from tasks.common import round_batch

    values, state = stage_advantages(tmp_path, params)
    # group a is now 1, 0, 0, 1 and the positive 1: mean 0.6, population std sqrt(0.24)
    std = 0.24**0.5
    assert values["bank/r00/a/s0"] == pytest.approx(0.4 / std, abs=1e-5)
    assert values["a1"] == pytest.approx(-0.6 / std, abs=1e-5)
    kept, steps, _ = round_batch(tmp_path, "01")  # what train@01 reads
    replayed = steps[steps["episode_id"] == "bank/r00/a/s0"]
    assert replayed[["step", "fingerprint_after", "tool", "span_start"]].values.tolist() == [
        [0, "s1", "get", 3]
    ]
    adv = pd.read_parquet(tmp_path / "data/advantages/round_01/advantages.parquet")
    items = training_batch(kept, adv)
    assert len(items) == 5
    item = next(it for it in items if it["ids"] == [9] * 10)  # the positive
    assert item["logprobs"] == [-2.0] * 10  # the older policy's, for PPO's ratio
    a = values["bank/r00/a/s0"]
    assert item["adv"] == pytest.approx([0.0] * 3 + [a] * 4 + [0.0] + [a] * 2, abs=1e-5)
    assert state["tracker"] == state_without["tracker"]  # a replay is not new evidence


# ---------------------------------------------------------------------------- diagnostics
def tiny_chain() -> ToyChain:
    """One call then the answer, 3 turns. From the start: calling reaches the end (answer w.p.
    1: Q = 1); a wrong call leaves 2 turns at (0, error): call w.p. 0.6 then answer: Q = 0.6;
    answering at once: Q = 0."""
    p = np.zeros((2, 2, 3))
    p[1, 0] = [0.5, 0.3, 0.2]
    p[1, 1] = [0.6, 0.3, 0.1]
    p[0] = [0.0, 0.0, 1.0]
    return ToyChain(p, max_turns=3)


def test_exact_q_matches_the_hand_computed_values():
    chain = tiny_chain()
    episodes, steps = chain.sample([("t", 1)], 40, seed=1)
    turns = turn_table(episodes, steps)
    q = chain.exact_q(turns, episodes)
    first = turns["step"] == 0
    kinds = turns.loc[first, "action"].map(ToyChain.kind)
    want = kinds.map({0: 1.0, 1: 0.6, 2: 0.0})
    assert q[first.to_numpy()].tolist() == pytest.approx(want.tolist())
    assert set(kinds) == {0, 1, 2}  # every first action was sampled


def test_monte_carlo_reference_converges_to_the_exact_q():
    chain, episodes, steps = toy_batch(seed=3)
    turns = turn_table(episodes, steps)
    keys = (
        turns["group"] + "|" + turns["depth"].astype(str) + "|" + turns["state"] + turns["action"]
    )
    lengths = dict(zip(episodes["episode_id"], episodes["length"], strict=True))
    mean, se = reference_q(
        turns, keys, lambda rows, n: chain.continuation_returns(rows, lengths, n, 0), 400
    )
    exact = chain.exact_q(turns, episodes)
    z = np.abs(mean - exact) / np.maximum(se, 1e-9)
    assert z.max() < 4.5 and np.abs(mean - exact).mean() < 0.03


def test_value_report_on_exact_and_reversed_estimates():
    chain, episodes, steps = toy_batch(seed=2, group_size=8)
    turns = turn_table(episodes, steps)
    q = chain.exact_q(turns, episodes)
    exact = value_report(turns, 2.0 * q - 1.0, q)  # any positive affine map of Q is exact
    assert exact["value_error"] == pytest.approx(0.0, abs=1e-9) and exact["kendall_tau"] == 1.0
    assert exact["same_action_sd"] == pytest.approx(0.0, abs=1e-9)
    reversed_ = value_report(turns, -q, q)
    assert reversed_["value_error"] == pytest.approx(1.0) and reversed_["kendall_tau"] == -1.0
    flat = value_report(turns, np.zeros(len(q)), q)
    assert flat["value_error"] == pytest.approx(1.0) and flat["kendall_tau"] == 0.0
    assert flat["pairs"] > 0
    noisy = value_report(turns, gigpo(episodes, steps, cfg())["advantage"].to_numpy(), q)
    assert 0.0 < noisy["value_error"] < 1.0 and noisy["kendall_tau"] > 0.0


def test_the_credit_stage_hands_farca_the_policy_tokenizer(tmp_path: Path, monkeypatch):
    """credit.method farca localizes values to tokens: the stage loads round_00's tokenizer
    for it (and only for it), and a missing checkpoint names the stage that writes it."""
    from rollwise import loop
    from rollwise.policy.build import train_tokenizer
    from tasks import credit
    from tasks.warmstart import initial_states

    chain = ToyChain(toy_policy(), max_turns=6)
    episodes, steps = chain.sample([("t0", 3)], 2, seed=0, version=0)
    write_round(tmp_path, "01", episodes.drop(columns="length"), steps)
    initial_states(tmp_path)
    seen = []
    real = loop.credit

    def spy(params, episodes, steps, decisions, state, tokenizer=None):
        seen.append(tokenizer)
        return real(params.model_copy(update={"credit": params.credit.model_copy(
            update={"method": "grpo"})}), episodes, steps, decisions, state)  # fmt: skip

    monkeypatch.setattr(loop, "credit", spy)
    params = validate({"credit": {"method": "farca"}, "rounds": 1})
    with pytest.raises(MissingUpstream, match="round_00.*`warmstart`"):
        credit.run(params, tmp_path, "01")
    train_tokenizer(["a call"]).save_pretrained(tmp_path / "models" / "round_00")
    credit.run(params, tmp_path, "01")
    credit.run(validate({"rounds": 1}), tmp_path, "01")
    assert seen[0] is not None and seen[1] is None


def test_the_credit_benchs_value_panel_runs_every_episode_estimator():
    """bench/credit.py's toy value panel: every estimator that scores an episode's turns, and
    none of the token-term ones (a teacher or fact checks they would need is not there)."""
    import argparse

    from bench import credit as bench

    panel = bench.toy_value_panel(argparse.Namespace(toy_seeds=1, toy_tasks=6), validate({}).credit)
    assert {"grpo", "rloo", "gigpo", "concal", "iapo", "spo", "spo_pp"} <= set(panel["methods"])
    assert not {"opd", "opdvr", "farca", "cosir"} & set(panel["methods"])
    assert all(np.isfinite(m["value_error"]) for m in panel["methods"].values())
