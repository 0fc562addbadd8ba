"""bench/progagent.py at toy size on the tiny model: the scripted part's break scale, and the
trained part's direct- and code-trained policies, each evaluated at every scale under both
interfaces on the same held-out tasks, before and after a round in their own mode."""

from __future__ import annotations

import json
import sys

from bench import progagent


def test_scripted_and_trained_parts_at_toy_size(tmp_path, monkeypatch):
    out = tmp_path / "progagent.json"
    argv = ["progagent.py", "--trained", "warmstart.steps=2", "warmstart.augment_suites=0",
            "schedule.tasks_per_round=2", "rollout.samples_per_task=2", "--recipe", "tiny",
            "--rounds", "1", "--eval-tasks", "3", "--cache", str(tmp_path / "cache"),
            "--out", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    progagent.main()
    result = json.loads(out.read_text())
    assert all(v == 1.0 for v in result["scripted_success"]["code"].values())
    assert result["direct_breaks_at_scale"] in progagent.SCALES
    runs = result["trained_runs"]
    assert [r["trained"] for r in runs] == ["direct", "code"]
    cells = {f"{i}@{n}" for i in progagent.MODES for n in progagent.SCALES}
    for run in runs:
        assert set(run["sft"]) == set(run["rl"]) == cells
        assert all(c["episodes"] == 3 for stage in ("sft", "rl") for c in run[stage].values())
        sft = run["sft"]  # the same policy under both interfaces: different transcripts
        assert sft["direct@8"]["context_tokens_mean"] != sft["code@8"]["context_tokens_mean"]
    top = progagent.SCALES[-1]
    gap = 100 * (
        runs[1]["rl"][f"code@{top}"]["success"] - runs[0]["rl"][f"direct@{top}"]["success"]
    )
    assert result["code_minus_direct_pts_at_largest_scale"] == gap
    assert result["command"].startswith("python bench/progagent.py --trained")
