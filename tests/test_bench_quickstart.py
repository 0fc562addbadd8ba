"""bench/quickstart.py measures `make run`'s job on another substrate through params overrides:
each seed's project copy carries them, and a bad key fails by name before any seed runs."""

from __future__ import annotations

import sys

import pytest
import yaml

from bench import quickstart
from rollwise.config import ParamsError


def test_overrides_reach_each_seeds_params(tmp_path):
    over = {"rounds": 2, "policy.model": "SmolLM2-135M-Instruct", "evaluate.max_tasks": 64}
    dest = quickstart.project_copy(tmp_path / "seed_3", 3, over)
    params = yaml.safe_load((dest / "params.yaml").read_text())
    assert params["seed"] == 3 and params["rounds"] == 2
    assert params["policy"]["model"] == "SmolLM2-135M-Instruct"
    assert params["evaluate"]["max_tasks"] == 64
    own = yaml.safe_load((quickstart.ROOT / "params.yaml").read_text())
    assert params["train"] == own["train"]  # untouched keys keep params.yaml's value


def test_a_bad_override_fails_before_any_seed(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(quickstart, "run_seed", lambda *a, **k: ran.append(a))
    argv = ["quickstart.py", "--seeds", "0", "--work", str(tmp_path), "train.no_such_key=1"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(ParamsError, match="no_such_key"):
        quickstart.main()
    assert not ran


def test_a_recipe_run_records_its_overrides_and_each_seeds_interval(tmp_path, monkeypatch):
    """The results file says what ran (recipe, every override, the command to rerun it) and
    whether every seed's gain interval lies above 0; a seed with its interval touching 0 fails."""
    import json

    seen = []

    def fake_seed(seed, work, overrides):  # the pipeline itself is tests/e2e's; this is the file
        seen.append(overrides)
        lo = 4.0 if seed == 0 else -1.0
        return {"seed": seed, "wall_s": 100.0 + seed, "stage_wall_s": {"train": 1.0},
                "warmstart_success": 0.4, "final_success": 0.5, "heldout_gain_pts": 10.0,
                "heldout_gain_interval": [lo, 16.0]}  # fmt: skip

    monkeypatch.setattr(quickstart, "run_seed", fake_seed)
    out = tmp_path / "q.json"
    argv = ["quickstart.py", "--seeds", "0", "1", "--work", str(tmp_path), "--recipe", "smollm2",
            "rounds=2", "--out", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    quickstart.main()
    result = json.loads(out.read_text())
    assert seen[0]["policy.model"] == "SmolLM2-135M-Instruct" and seen[0]["rounds"] == 2
    assert result["recipe"] == "smollm2" and result["overrides"]["rounds"] == 2
    assert result["command"] == (".venv/bin/python bench/quickstart.py --seeds 0 1 --recipe "
                                 f"smollm2 rounds=2 --out {out}")  # fmt: skip
    assert result["heldout_gain_pts_median"] == 10.0 and result["wall_s_median"] == 100.5
    assert result["every_seed_interval_excludes_0"] is False
