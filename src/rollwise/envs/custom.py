"""A user's own environment, named by dotted path: `envs.custom: "package.module:factory"`.

The factory takes no arguments and returns an object that implements the Environment protocol
and lists its tasks (envs/protocol.py). The generate stage replays every task's oracle through
it and keeps the tasks whose oracle passes, as for synthetic suites, and writes one folder per
env_id whose env.json names the factory; later stages (and Ray workers) rebuild the environment
from that path, so the module must be importable wherever they run. An environment whose user
speaks more than once adds `next_turn` and `oracle_turns` (protocol.MultiTurn): generation then
replays the oracle turn by turn, and the rollout engine feeds the user turns.
"""

from __future__ import annotations

import copy
import importlib
import json
import re
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from rollwise.config import ParamsError
from rollwise.envs.protocol import Environment, TaskSource
from rollwise.types import Task

KEY = "params.yaml: envs.custom"
METHODS = ("tools", "reset", "step", "fingerprint", "verify", "tasks")


def load_factory(path: str) -> Callable[[], Environment]:
    """The factory named by "package.module:factory"; any failure names the params key."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # not found, or the module itself raised while importing
        raise ParamsError(f"{KEY}: cannot import {module_name!r} ({type(e).__name__}: {e})") from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ParamsError(f"{KEY}: module {module_name!r} has no callable {attr!r}")
    return factory


def build_env(path: str) -> Environment:
    """A prototype environment (episodes run on copies of it)."""
    env = load_factory(path)()
    if not (isinstance(env, Environment) and isinstance(env, TaskSource)):
        missing = [m for m in METHODS if not callable(getattr(env, m, None))]
        raise ParamsError(
            f"{KEY}: {path} returned a {type(env).__name__} without {', '.join(missing)} "
            "(see envs/protocol.py)"
        )
    return env


def generate_custom(cfg, out: Path) -> dict:
    """Write a suite over the user's environment; returns the same counts as generate_suite."""
    from rollwise.envs.generate import oracle_passes, task_table

    if cfg.faults.active:
        raise ParamsError("params.yaml: envs.faults: injects into synthetic suites only")
    env = build_env(cfg.custom)
    kept: dict[str, list[Task]] = {}
    rejected = 0
    for task in env.tasks():
        if not re.fullmatch(r"[\w.-]+", task.env_id):
            raise ParamsError(f"{KEY}: env_id {task.env_id!r} is not a plain folder name")
        if oracle_passes(copy.copy(env), task):
            kept.setdefault(task.env_id, []).append(task)
        else:
            rejected += 1
    rows = []
    for env_id, tasks in kept.items():
        env_dir = out / env_id
        env_dir.mkdir(parents=True, exist_ok=True)
        (env_dir / "env.json").write_text(json.dumps({"env_id": env_id, "custom": cfg.custom}))
        probe = copy.copy(env)
        probe.reset(tasks[0], seed=0)
        tools = [t.__dict__ for t in probe.tools()]
        (env_dir / "tools.json").write_text(json.dumps(tools, indent=1))
        task_table(tasks).to_parquet(env_dir / "tasks.parquet")
        rows += [catalog_row(t, cfg.custom) for t in tasks]
    pd.DataFrame(rows).to_parquet(out / "catalog.parquet")
    return {"envs": len(kept), "tasks": len(rows), "oracle_rejected": rejected}


def catalog_row(t: Task, path: str) -> dict:
    """The synthetic catalog's columns; state tables are unknown to us, the verifier is theirs."""
    return {
        "env_id": t.env_id,
        "task_id": t.task_id,
        "domain": path,
        "kind": t.kind,
        "split": t.split,
        "heldout_env": False,
        "n_calls": len(t.oracle),
        "tools": sorted({c.name for c in t.oracle}),
        "tables": [],
        "verifier": "custom",
        "writes": t.writes,
    }
