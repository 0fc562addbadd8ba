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


def _seed_file(path, seed: int, gain: float, commit: str = "abc123") -> str:
    run = {"seed": seed, "partial": False, "warmstart_success": 0.3 + seed / 10,
           "heldout": {"gain_pts": gain, "lo": gain - 5, "hi": gain + 5, "tasks": 64},
           "unseen": {"gain_pts": gain / 2, "lo": -1.0, "hi": 9.0, "tasks": 21},
           "curve": [{"round": 0, "success": 0.3, "unseen_success": 0.2},
                     {"round": 2, "success": 0.3 + gain / 100, "unseen_success": 0.25}],
           "rounds": [], "worst_round_drop_pts": seed, "wall_s": 100.0 * (seed + 1)}  # fmt: skip
    part = {"command": f"python bench/learning.py --seeds {seed}", "git_commit": commit,
            "recipe": "smollm2", "overrides": {"train.lr": 1e-5}, "eval_tasks": 64, "rounds": 2,
            "warmstart_success_by_seed": {str(seed): run["warmstart_success"]},
            "runs": [run]}  # fmt: skip
    path.write_text(json.dumps(part))
    return str(path)


def test_merge_summarizes_per_seed_files_and_refuses_a_mixed_plan(tmp_path, monkeypatch):
    """Seeds run as separate processes merge into one file with the medians over all of them;
    files from different commits (or the same seed twice) are refused by name."""
    files = [_seed_file(tmp_path / f"s{s}.json", s, g) for s, g in [(0, 10.0), (1, 30.0), (2, 4.0)]]
    out = tmp_path / "merged.json"
    monkeypatch.setattr(sys, "argv", ["learning.py", "--merge", *files, "--out", str(out)])
    learning.main()
    result = json.loads(out.read_text())
    assert [r["seed"] for r in result["runs"]] == [0, 1, 2]
    assert result["heldout_gain_pts_median"] == 10.0 and result["unseen_gain_pts_median"] == 5.0
    assert result["worst_round_drop_pts"] == 2 and result["wall_s_per_seed"] == 200.0
    assert result["git_commit"] == "abc123" and len(result["seed_commands"]) == 3
    assert result["every_seed_interval_excludes_0"] is False  # seed 2's lo is -1
    assert result["warmstart_spread_pts"] == pytest.approx(20.0)
    assert out.with_suffix(".png").exists()

    other = _seed_file(tmp_path / "other.json", 3, 8.0, commit="def456")
    monkeypatch.setattr(sys, "argv", ["learning.py", "--merge", files[0], other, "--out", str(out)])
    with pytest.raises(SystemExit, match="git_commit"):
        learning.main()
    monkeypatch.setattr(sys, "argv", ["learning.py", "--merge", files[0], files[0]])
    with pytest.raises(SystemExit, match="seed appears twice"):
        learning.main()


def test_each_control_kind_is_compared_on_the_seeds_that_ran_it():
    """RL's gain over a control is taken on the control's own seeds (same warm starts), kind by
    kind, and the file's ratio is the strongest control's; a control that lost has no ratio."""

    def run(seed, gain, control=None):
        out = {"seed": seed, "heldout": {"gain_pts": gain}}
        if control:
            out["control"] = {"kind": control[0], "heldout": {"gain_pts": control[1]}}
        return out

    runs = [run(0, 9.0), run(1, 20.0, ("trainer", -3.0)), run(2, 30.0, ("sft", 25.0)),
            run(3, 10.0, ("sft", 15.0))]  # fmt: skip
    kinds = learning.controls_by_kind(runs)
    assert kinds["trainer"] == {"seeds": [1], "gain_pts_median": -3.0, "rl_gain_pts_median": 20.0,
                                "rl_vs_control_ratio": None}  # fmt: skip
    assert kinds["sft"]["seeds"] == [2, 3] and kinds["sft"]["rl_vs_control_ratio"] == 1.0
    assert learning.controls_by_kind([run(0, 9.0)]) == {}
