"""bench/real_model.py: each model's side runs zero-shot, warm start and RL through the
pipeline's own pieces and reports figures that agree with each other; a second run reuses the
cached warm start and says so (its SFT wall is then not a measurement)."""

from __future__ import annotations

import json
import sys

from bench import real_model

SMALL = ["envs.n_envs=3", "envs.heldout_envs=1", "envs.tasks_per_env=8", "warmstart.steps=3",
         "warmstart.augment_suites=0", "schedule.tasks_per_round=2",
         "rollout.samples_per_task=2"]  # fmt: skip


def run(tmp_path, monkeypatch) -> dict:
    out = tmp_path / "real_model.json"
    argv = ["real_model.py", *SMALL, "--models", "tiny", "--eval-tasks", "3", "--rounds", "2",
            "--threads", "1", "--cache", str(tmp_path / "cache"), "--out", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    real_model.main()
    return json.loads(out.read_text())


def test_tiny_side_figures_agree_and_the_warm_start_is_cached(tmp_path, monkeypatch):
    first = run(tmp_path, monkeypatch)
    tiny = first["models"]["tiny"]
    assert first["rounds"] == 2 and "smollm2_vs_tiny_tokens_per_s_ratio" not in first
    for phase in (tiny["zero_shot"], tiny["sft"], tiny["rl"]):
        assert phase["tasks"] == 3 and phase["successes"] == round(3 * phase["success"])
        assert phase["generated_tokens"] > 0
        assert abs(phase["tokens_per_s"] - phase["generated_tokens"] / phase["eval_wall_s"]) < 1e-6
    assert [r["round"] for r in tiny["rl"]["rounds"]] == [1, 2]
    assert all(r["episodes"] == 4 for r in tiny["rl"]["rounds"])
    assert tiny["sft"]["cached"] is False and tiny["sft"]["wall_s"] > 0
    assert tiny["peak_rss_gb"] > 0.1 and first["command"].startswith("python bench/real_model.py")

    again = run(tmp_path, monkeypatch)["models"]["tiny"]
    assert again["sft"]["cached"] is True and again["sft"]["wall_s"] is None
    assert again["sft"]["folder"] == tiny["sft"]["folder"]
