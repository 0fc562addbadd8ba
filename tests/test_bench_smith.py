"""bench/smith.py at toy size on the tiny model: the scripted axes come apart as the rubric
says, both arms run the same rounds and are evaluated on the same held-out use tasks, and the
joint arm writes its tool pool every round."""

from __future__ import annotations

import json
import sys

from bench import smith


def test_scripted_axes_and_both_arms_at_toy_size(tmp_path, monkeypatch):
    out = tmp_path / "smith.json"
    argv = ["smith.py", "warmstart.steps=2", "warmstart.augment_suites=0",
            "schedule.tasks_per_round=2", "rollout.samples_per_task=2", "--recipe", "tiny",
            "--seeds", "0", "--rounds", "2", "--eval-tasks", "4", "--threads", "1",
            "--work", str(tmp_path / "work"), "--cache", str(tmp_path / "cache"),
            "--out", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    smith.main()
    result = json.loads(out.read_text())
    axes = result["scripted_axes"]
    assert axes["oracle"] == {"schema_valid": 1.0, "examples_pass": 1.0, "answer_correct": 1.0}
    assert axes["memorized"]["examples_pass"] == 1.0 and axes["memorized"]["answer_correct"] == 0
    assert axes["hostile"]["examples_pass"] == 0.0
    assert axes["sibling"]["examples_pass"] < 1.0 and axes["sibling"]["answer_correct"] == 0.0
    assert result["scripted_admitted"] == {
        "oracle": 1.0, "memorized": 0.0, "sibling": 0.0, "hostile": 0.0
    }  # fmt: skip
    joint, use_only = result["runs"]
    assert (joint["arm"], use_only["arm"]) == ("joint", "use_only")
    assert joint["eval_tasks"] == use_only["eval_tasks"] == 4
    assert (
        [r["round"] for r in joint["rounds"]] == [1, 2] == [r["round"] for r in use_only["rounds"]]
    )
    assert (
        set(smith.AXES) <= set(joint["rounds"][0]) and "schema_valid" not in use_only["rounds"][0]
    )
    assert (tmp_path / "work" / "joint_seed0" / "pool_round_02.json").exists()
    gap = 100 * (joint["use_success"] - use_only["use_success"])
    assert (
        result["joint_minus_use_only_pts"] == result["joint_minus_use_only_pts_by_seed"][0] == gap
    )
