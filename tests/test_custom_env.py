"""Bring your own environment: `envs.custom` names a factory by dotted path; the worked example
(examples/notes_env.py) generates, loads and runs episodes through the rollout engine."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from examples.notes_env import NotesEnv
from rollwise.config import EnvsConfig, FaultsConfig, ParamsError, validate
from rollwise.envs.custom import build_env, load_factory
from rollwise.envs.generate import catalog_row
from rollwise.envs.protocol import Environment, MultiTurn, TaskSource
from rollwise.envs.rubric import WEIGHTS
from rollwise.envs.runtime import load_suite
from rollwise.policy.chat import user_text
from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes
from rollwise.types import Task
from tests.helpers import TINY_POLICY, make_suite

NOTES = "examples.notes_env:make_env"


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("notes")
    assert make_suite(out, EnvsConfig(custom=NOTES)) == {
        "envs": 1,
        "tasks": 8,
        "oracle_rejected": 0,
    }
    return out


@pytest.fixture(scope="module")
def suite(suite_dir: Path):
    return load_suite(suite_dir)


def test_bad_paths_name_the_key(monkeypatch):
    with pytest.raises(ParamsError, match=r"envs\.custom"):
        validate({"envs": {"custom": "examples.notes_env.make_env"}})  # no ":factory"
    with pytest.raises(ParamsError, match=r"envs\.custom: cannot import 'no_such_pkg\.envs'"):
        load_factory("no_such_pkg.envs:make")
    with pytest.raises(ParamsError, match=r"envs\.custom: module 'examples\.notes_env' has no"):
        load_factory("examples.notes_env:nope")
    broken = types.ModuleType("broken_env")
    broken.make = lambda: object()  # not an Environment
    monkeypatch.setitem(sys.modules, "broken_env", broken)
    with pytest.raises(ParamsError, match=r"envs\.custom: .* without tools, reset, step"):
        build_env("broken_env:make")
    with pytest.raises(ParamsError, match=r"envs\.faults"):
        make_suite(Path("/nonexistent"), EnvsConfig(custom=NOTES, faults=FaultsConfig(flaky_p=0.1)))


def test_generated_suite_loads_the_users_environment(suite_dir: Path, suite):
    env = suite.envs["notes"]
    assert isinstance(env, Environment) and isinstance(env, TaskSource)
    assert type(env).__module__ == "examples.notes_env"
    catalog = pd.read_parquet(suite_dir / "catalog.parquet")  # the scheduler's input, as ever
    assert list(catalog.columns) == list(
        catalog_row(next(iter(suite.tasks.values())), "shop", False)
    )
    assert set(suite.catalog["verifier"]) == {"custom"} and len(suite.split("heldout")) == 2
    for task in suite.tasks.values():  # every kept oracle passes through a loaded copy
        copy_ = clone_env(env)
        copy_.reset(task, seed=0)
        assert all(copy_.step(c).kind == "ok" for c in task.oracle)
        assert copy_.verify(task.answer, list(task.oracle)).success, task.task_id


@pytest.fixture(scope="module")
def tokenizer(suite):
    from rollwise.train.warmstart import suite_tokenizer

    return suite_tokenizer(suite)


def specs_for(suite, prefix: str) -> list[EpisodeSpec]:
    return [
        EpisodeSpec(f"{prefix}{i}", t, clone_env(suite.envs[t.env_id]), group=t.task_id)
        for i, t in enumerate(suite.tasks.values())
    ]


def test_tiny_policy_episode_through_the_engine(suite, tokenizer):
    from rollwise.policy.build import build_model
    from rollwise.policy.hf import HFBackend

    backend = HFBackend(build_model(tokenizer, TINY_POLICY), tokenizer)
    limits = Limits(max_turns=2, max_new_tokens=16, max_context=384, seed=0)
    episodes, steps = run_episodes(specs_for(suite, "tiny")[:2], backend, tokenizer, limits)
    assert len(episodes) == 2
    for ep in episodes:
        assert ep["verifier_calls"] == 1 and ep["termination"] in (
            "answer",
            "max_turns",
            "max_tokens",
        )
        assert set(json.loads(ep["rubric"])) == set(WEIGHTS)
        assert 0.0 <= ep["reward"] <= 1.0 and sum(ep["loss_mask"]) == ep["generated_tokens"] > 0
    assert all(s["observation_kind"] in ("ok", "tool_error") for s in steps)


def test_oracle_policy_succeeds_through_the_engine(suite, tokenizer):
    from tests.test_chat import OracleBackend

    specs = specs_for(suite, "oracle")
    backend = OracleBackend(tokenizer, [s.task for s in specs])
    limits = Limits(max_turns=4, max_new_tokens=48, max_context=512)
    episodes, steps = run_episodes(specs, backend, tokenizer, limits)
    assert [ep["success"] for ep in episodes] == [True] * 8
    assert all(ep["reward"] == pytest.approx(1.0) for ep in episodes)
    writes = [s for s in steps if s["tool"] == "write_note"]
    assert len(writes) == 4 and all(
        s["fingerprint_before"] != s["fingerprint_after"] for s in writes
    )


class TwoTurnNotes(NotesEnv):
    """The notes example with a user who speaks twice (protocol.MultiTurn): first "what does
    the X note say?", then, after the reply, "change it to done and reply with its old text";
    the oracle is split by user turn."""

    def tasks(self) -> list[Task]:
        return [
            dataclasses.replace(
                t,
                task_id=t.task_id.replace("clear", "twice"),
                prompt=f"What does the {t.target['key']} note say?",
                target={**t.target, "then": t.prompt},
            )
            for t in super().tasks()
            if t.kind == "clear"
        ]

    def reset(self, task: Task, seed: int) -> list[dict]:
        self.heard = 1
        return super().reset(task, seed)

    def next_turn(self, answer: str | None) -> list[dict] | None:
        if self.heard == 2:
            return None
        self.heard = 2
        return [{"role": "user", "content": self.task.target["then"]}]

    def oracle_turns(self, task: Task) -> list[list]:
        return [[call] for call in task.oracle]


def test_a_users_multi_turn_environment_runs_turn_by_turn(tmp_path: Path, monkeypatch):
    from rollwise.policy.chat import action_text, encode
    from rollwise.train.sft import oracle_sequence
    from rollwise.train.warmstart import suite_tokenizer
    from tests.test_engine import ScriptBackend

    module = types.ModuleType("twice_env")
    module.make = TwoTurnNotes
    monkeypatch.setitem(sys.modules, "twice_env", module)
    counts = make_suite(tmp_path, EnvsConfig(custom="twice_env:make"))
    assert counts == {"envs": 1, "tasks": 4, "oracle_rejected": 0}  # oracles replayed per turn
    suite = load_suite(tmp_path)
    assert isinstance(suite.envs["notes"], MultiTurn)
    tok = suite_tokenizer(suite)
    turns = {  # per prompt: read, reply, (the second user turn), write, reply again
        t.prompt: [action_text([t.oracle[0]]), action_text(answer=t.answer),
                   action_text([t.oracle[1]]), action_text(answer=t.answer)]
        for t in suite.tasks.values()
    }  # fmt: skip

    def script(text: str) -> list[str]:
        return next(v for k, v in turns.items() if f"user\n{k}<|im_end|>" in text)

    specs = specs_for(suite, "twice")
    episodes, _ = run_episodes(specs, ScriptBackend(tok, script), tok, Limits(max_context=512))
    ends = [(e["termination"], e["turns"], e["success"]) for e in episodes]
    assert ends == [("answer", 4, True)] * 4
    for ep, spec in zip(episodes, specs, strict=True):
        (_, replied), (asked, _) = ep["turn_spans"][1], ep["turn_spans"][2]
        said = encode(tok, user_text(tok, [{"role": "user", "content": spec.task.target["then"]}]))
        assert ep["token_ids"][replied:asked] == said  # the second user turn, tokenized once
        assert tok.unk_token_id not in said  # its words are in the built vocabulary
        assert not any(ep["loss_mask"][replied:asked])
        # The warm start's demo of the task is this very episode: every user turn, same tokens,
        # same mask (SFT and RL see one format).
        ids, mask = oracle_sequence(spec.task, clone_env(suite.envs["notes"]), tok)
        assert ids == ep["token_ids"] and mask == ep["loss_mask"]
