"""bench/learning.py on a toy suite: the RL rounds, the SFT control from the same warm start,
and the warm start's headroom (pass@k minus greedy on the same tasks) agree with each other."""

from __future__ import annotations

import json
import sys

import pytest

from bench import learning

SMALL = ["envs.n_envs=3", "envs.heldout_envs=1", "envs.tasks_per_env=8", "warmstart.steps=3",
         "warmstart.augment_suites=1", "schedule.tasks_per_round=2",
         "rollout.samples_per_task=2"]  # fmt: skip


def test_rounds_sft_control_and_headroom(tmp_path, monkeypatch):
    out = tmp_path / "learning.json"
    argv = ["learning.py", *SMALL, "--recipe", "tiny", "--seeds", "0", "--rounds", "2",
            "--eval-every", "1", "--eval-tasks", "4", "--control", "sft", "--headroom", "3",
            "--threads", "1", "--cache", str(tmp_path / "cache"), "--out", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    learning.main()
    result = json.loads(out.read_text())
    run = result["runs"][0]
    assert [c["round"] for c in run["curve"]] == [0, 1, 2] and len(run["rounds"]) == 2
    assert run["control"]["kind"] == "sft" and run["control"]["demos_a_round"] == 4
    assert [c["round"] for c in run["control"]["curve"]] == [0, 1, 2]
    room = run["headroom"]
    assert room["k"] == 3 and room["temperature"] == 0.7
    assert room["gap_pts"] == pytest.approx(100 * (room["pass_at_k"] - run["warmstart_success"]))
    assert result["warmstart_headroom_pts_median"] == pytest.approx(room["gap_pts"])
    assert out.with_suffix(".png").exists() and not result["partial"]


def test_warm_starts_alone_with_no_rl_seed(tmp_path, monkeypatch):
    """`--seeds` with no seed: only the spread seeds' warm starts, built and evaluated; no RL
    figure is invented for them."""
    out = tmp_path / "spread.json"
    argv = ["learning.py", *SMALL, "warmstart.balance_kinds=true", "--recipe", "tiny", "--seeds",
            "--spread-seeds", "0", "1", "--eval-tasks", "4", "--threads", "1",
            "--cache", str(tmp_path / "cache"), "--out", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    learning.main()
    result = json.loads(out.read_text())
    assert result["runs"] == [] and set(result["warmstart_success_by_seed"]) == {"0", "1"}
    assert result["heldout_gain_pts_median"] is None and result["worst_round_drop_pts"] is None
    assert not result["every_seed_interval_excludes_0"]
    assert result["overrides"]["warmstart.balance_kinds"] in (True, "true")
