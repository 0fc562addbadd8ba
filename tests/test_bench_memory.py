"""bench/memory.py's RL half at toy size on the tiny model: every arm trains its rounds with its
memory in the round and is evaluated with it on the same held-out tasks; the targets' figures
come from the arms' own numbers."""

from __future__ import annotations

import json
import sys

from bench import memory


def test_rl_half_at_toy_size(tmp_path, monkeypatch):
    out = tmp_path / "memory.json"
    argv = ["memory.py", "--rl", "warmstart.steps=2", "warmstart.augment_suites=0",
            "schedule.tasks_per_round=2", "rollout.samples_per_task=2", "--recipe", "tiny",
            "--horizons", "2", "--rounds", "1", "--eval-tasks", "3",
            "--cache", str(tmp_path / "cache"), "--out", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    memory.main()
    result = json.loads(out.read_text())
    runs = result["rl_runs"]
    assert [r["arm"] for r in runs] == list(memory.RL_ARMS)
    assert all(len(r["rounds"]) == 1 for r in runs)
    assert all(0 <= r["skill_call_share"] <= 1 for r in runs)
    assert all(r["skill_call_share"] == 0 for r in runs if r["arm"] in ("none", "working"))
    assert all("skills" in r["rounds"][0] for r in runs if r["arm"] in ("skills", "both", "append"))
    assert all("skills" not in r["rounds"][0] for r in runs if r["arm"] in ("none", "working"))
    assert all(("meta_tried" in r["rounds"][0]) == (r["arm"] == "meta") for r in runs)
    assert set(result["after_rl"]) == set(memory.RL_ARMS)
    by = {r["arm"]: r for r in runs}
    assert result["skillforge_minus_append_only_pts"] == round(
        by["skills"]["success"] - by["append"]["success"], 1
    )
    longest, best = result["longest_horizon"], result["memory_arm_longest"]
    gap = by[best]["by_horizon"][longest] - by["none"]["by_horizon"][longest]
    assert result["memory_minus_none_pts_longest"] == round(gap, 1)
