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
