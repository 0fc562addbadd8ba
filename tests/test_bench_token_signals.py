"""bench/token_signals.py's pure helpers: arms, pairing with grpo, the issue's keys."""

from __future__ import annotations

import pytest

from bench.common import arm_params, bench_params
from bench.token_signals import ARMS, arm_overrides, headline, summarize


def test_every_arm_is_a_valid_override_set_differing_only_in_credit():
    base = bench_params({})
    for arm in ARMS:
        p = arm_params(base, arm_overrides(arm, "teacher_dir", 0.1, seed=3))
        assert p.rollout == arm_params(base, arm_overrides("grpo", None, 0.1, 3)).rollout
        assert p.schedule.seed == 3 and p.train.seed == 3
    farca = arm_params(base, arm_overrides("farca_unweighted", None, 0.2, 0)).credit
    assert farca.method == "farca" and not farca.facts.weighted and farca.facts.flip_rate == 0.2
    opdvr = arm_params(base, arm_overrides("opdvr", "t", 0.2, 0)).credit
    assert opdvr.opd.teacher == "t" and opdvr.facts.flip_rate == 0.0  # not a fact arm


def test_a_teacher_arm_without_a_teacher_is_refused():
    with pytest.raises(ValueError, match="--teacher"):
        arm_overrides("opd", None, 0.0, 0)


def test_summary_pairs_each_seed_with_grpo():
    runs = [
        {"arm": "grpo", "seed": 0, "heldout_success": 0.5, "rollouts": 64},
        {"arm": "grpo", "seed": 1, "heldout_success": 0.4, "rollouts": 64},
        {"arm": "opdvr", "seed": 0, "heldout_success": 0.6, "rollouts": 64},
        {"arm": "opdvr", "seed": 1, "heldout_success": 0.7, "rollouts": 64},
    ]
    s = summarize(runs)
    assert s["opdvr"]["gain_vs_grpo_median"] == pytest.approx(0.2)
    assert s["grpo"]["gain_vs_grpo_median"] == 0.0 and s["opdvr"]["rollouts_median"] == 64


def test_headline_keys_are_point_differences_of_the_arm_medians():
    runs = [
        {"arm": a, "seed": 0, "heldout_success": s, "rollouts": 64, "factual_error_rate": f}
        for a, s, f in [("grpo", 0.50, 0.2), ("opd", 0.52, None), ("opdvr", 0.56, 0.1),
                        ("farca", 0.40, 0.3), ("farca_unweighted", 0.45, 0.4)]
    ]  # fmt: skip
    h = headline(summarize(runs))
    assert h["opdvr_minus_opd_pts"] == pytest.approx(4.0)
    assert h["opdvr_minus_grpo_pts"] == pytest.approx(6.0)
    assert h["farca_minus_unweighted_pts"] == pytest.approx(-5.0)
    assert h["factual_error_rate"] == {"grpo": 0.2, "opd": None, "opdvr": 0.1, "farca": 0.3,
                                       "farca_unweighted": 0.4}  # fmt: skip
    assert headline(summarize(runs[:1]))["opdvr_minus_opd_pts"] is None  # arm not run
