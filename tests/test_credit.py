"""GRPO advantages on a hand-computed batch."""

from __future__ import annotations

import pandas as pd
import pytest

from rollwise.config import CreditConfig
from rollwise.credit import ESTIMATORS
from rollwise.credit.grpo import grpo
from rollwise.types import ADVANTAGE_COLUMNS

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
    assert set(ESTIMATORS) >= set(CreditConfig.model_fields["method"].annotation.__args__)
