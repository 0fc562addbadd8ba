"""The pure helpers of bench/peer_trl.py (the bench itself needs the TRL venv: not run here)."""

import pytest

from bench.peer_trl import plan_steps, side_order, step_ratio, summarize


def test_plan_steps_same_for_both_sides_and_distinct_within_a_step():
    pool = [f"t{i:02d}" for i in range(40)]
    plan = plan_steps(pool, n_steps=3, n_tasks=8, seed=0)
    assert plan == plan_steps(pool, n_steps=3, n_tasks=8, seed=0)
    assert [len(set(step)) for step in plan] == [8, 8, 8]
    assert all(set(step) <= set(pool) for step in plan)
    assert plan[0] != plan[1]
    assert plan != plan_steps(pool, n_steps=3, n_tasks=8, seed=1)


def test_side_order_alternates_who_goes_first():
    assert side_order(0) == ("rollwise", "trl")
    assert side_order(1) == ("trl", "rollwise")
    assert side_order(2) == side_order(0)


def test_summarize_skips_warmup_and_takes_the_median():
    steps = [
        {"step": 0, "seconds": 100.0, "generated_tokens": 1},
        {"step": 1, "seconds": 2.0, "generated_tokens": 200},
        {"step": 2, "seconds": 4.0, "generated_tokens": 400},
        {"step": 3, "seconds": 3.0, "generated_tokens": 300},
    ]
    s = summarize(steps, warmup=1, peak_rss_bytes=1_500_000_000)
    assert s["seconds_per_step"] == 3.0
    assert s["generated_tokens_per_s"] == pytest.approx(900 / 9)
    assert s["generated_tokens_per_step"] == 300
    assert s["peak_rss_gb"] == 1.5
    assert s["step_seconds"] == [2.0, 4.0, 3.0]


def test_summarize_refuses_a_run_with_no_timed_step():
    with pytest.raises(ValueError, match="no timed steps"):
        summarize([{"step": 0, "seconds": 1.0, "generated_tokens": 1}], 1, 0)


def test_step_ratio_is_rollwise_over_trl():
    assert step_ratio({"seconds_per_step": 1.0}, {"seconds_per_step": 4.0}) == 0.25
