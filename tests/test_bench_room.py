"""bench/room.py and bench/forgetting.py: their figures, on hand-counted tables."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.room import room_figures


def test_room_counts_tasks_only_a_sample_solves():
    greedy = pd.DataFrame({"task_id": ["a", "b", "c", "d"], "success": [True, False, False, True]})
    drawn = pd.DataFrame({
        "task_id": ["a", "a", "b", "b", "c", "c", "d", "d"],
        "success": [True, False, False, True, False, False, False, False],
    })  # fmt: skip
    fig = room_figures(greedy, drawn)
    assert fig["tasks"] == 4 and fig["greedy"] == 50.0
    assert fig["sampled"] == 25.0  # rates 0.5, 0.5, 0, 0
    assert fig["pass_at_g"] == 50.0  # a and b
    assert fig["room_pts"] == 0.0  # b gained, d (greedy only) lost
    assert fig["greedy_missed_sample_solved_pct"] == 25.0  # b alone
    assert fig["sample_rate_on_those"] == pytest.approx(0.5)
    drawn.loc[drawn["task_id"] == "d", "success"] = True  # d's samples solve it too
    assert room_figures(greedy, drawn)["room_pts"] == 25.0


def test_forgetting_names_the_untrained_kind_that_fell_most():
    from bench.forgetting import worst_untrained

    before = {"count": 95.0, "city_by_name": 88.9, "status": 43.5}
    after = {"count": 90.0, "city_by_name": 0.0, "status": 0.0}
    assert worst_untrained(before, after, {"status"}) == ("city_by_name", 88.9)
    assert worst_untrained(before, {**after, "city_by_name": 88.9}, {"status"}) == ("count", 5.0)
