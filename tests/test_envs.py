"""The synthetic suite: deterministic generation, oracle replay, errors as observations, rubric."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from rollwise.envs.generate import load_tasks
from rollwise.envs.runtime import SyntheticEnv, load_suite
from rollwise.rollout.engine import clone_env
from rollwise.types import ToolCall
from tests.helpers import SMALL_ENVS, make_suite


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("suite")
    counts = make_suite(out)
    assert counts == {"envs": 3, "tasks": 30, "oracle_rejected": 0}
    return out


@pytest.fixture(scope="module")
def suite(suite_dir: Path):
    return load_suite(suite_dir)


def tables(out: Path) -> dict[str, pd.DataFrame]:
    found = {"catalog": pd.read_parquet(out / "catalog.parquet")}
    for env_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        found[env_dir.name] = pd.read_parquet(env_dir / "tasks.parquet")
    return found


def test_generation_is_deterministic(suite_dir: Path, tmp_path: Path):
    make_suite(tmp_path / "again")
    first, second = tables(suite_dir), tables(tmp_path / "again")
    assert first.keys() == second.keys()
    for name in first:
        pd.testing.assert_frame_equal(first[name], second[name], obj=name)
    for env_id in (k for k in first if k != "catalog"):
        assert (suite_dir / env_id / "state.sqlite").read_bytes() == (
            tmp_path / "again" / env_id / "state.sqlite"
        ).read_bytes()
    make_suite(tmp_path / "other", SMALL_ENVS.model_copy(update={"seed": 1}))
    env_id = first["catalog"]["env_id"].iloc[0]
    other = (tmp_path / "other" / env_id / "state.sqlite").read_bytes()
    assert other != (suite_dir / env_id / "state.sqlite").read_bytes()  # the seed matters


def test_catalog_and_splits(suite):
    cat = suite.catalog
    assert len(cat) == 30 and cat["task_id"].is_unique
    assert cat["env_id"].nunique() == 3
    held = cat[cat["heldout_env"]]
    assert held["env_id"].nunique() == SMALL_ENVS.heldout_envs
    assert (held["split"] == "heldout").all()  # a held-out env holds out every task
    assert (cat.loc[~cat["heldout_env"], "split"] == "train").any()
    assert set(cat["verifier"]) <= {"rubric_state", "rubric_answer"}
    assert (cat["verifier"] == "rubric_state").eq(cat["writes"]).all()
    assert len(suite.split("train")) + len(suite.split("heldout")) == 30


def test_every_oracle_passes(suite):
    for task in suite.tasks.values():
        env = clone_env(suite.envs[task.env_id])
        env.reset(task, seed=0)
        kinds = [env.step(c).kind for c in task.oracle]
        assert kinds == ["ok"] * len(task.oracle), task.task_id
        rubric = env.verify(task.answer, list(task.oracle))
        assert rubric.success and rubric.reward == pytest.approx(1.0), task.task_id


def test_tasks_round_trip_through_parquet(suite_dir: Path, suite):
    env_id = suite.catalog["env_id"].iloc[0]
    tasks = load_tasks(suite_dir / env_id)
    assert tasks == [t for t in suite.tasks.values() if t.env_id == env_id]
    assert all(isinstance(c, ToolCall) for t in tasks for c in t.oracle)


# ------------------------------------------------------------------------------ runtime


@pytest.fixture
def env_task(suite):
    """A fresh copy of the first environment, reset on its first task."""
    task = next(iter(suite.tasks.values()))
    env = clone_env(suite.envs[task.env_id])
    env.reset(task, seed=0)
    return env, task, env.domain


def error_of(obs) -> str:
    return json.loads(obs.content)["error"]


def test_tool_errors_are_observations(env_task):
    env, _, d = env_task
    oid = f"{d.owner}_id"
    cases = {
        "unknown tool": ToolCall("launch_rocket", {}),
        "takes exactly one argument": ToolCall(f"get_{d.owner}", {"id": 1}),
        "takes exactly": ToolCall(f"get_{d.owner}", {oid: 1, "extra": 2}),
        "must be integer": ToolCall(f"get_{d.owner}", {oid: "150"}),
        "must be integer ": ToolCall(f"get_{d.owner}", {oid: True}),
        "must be string": ToolCall(f"find_{d.owner}", {"name": 5}),
        "not found": ToolCall(f"get_{d.owner}", {oid: 0}),
        "not found ": ToolCall(f"find_{d.owner}", {"name": "nobody-by-this-name"}),
    }
    for fragment, call in cases.items():
        obs = env.step(call)  # never raises
        assert obs.kind == "tool_error", (call, obs)
        assert fragment.strip() in error_of(obs), (call, obs)
    assert env.call_kinds == ["tool_error"] * len(cases)


def test_raising_tool_is_an_env_error(env_task, monkeypatch):
    env, task, d = env_task

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(env, "_find", broken)
    obs = env.step(ToolCall(f"find_{d.owner}", {"name": "x"}))
    assert obs.kind == "env_error"
    assert "RuntimeError" in error_of(obs) and "disk on fire" not in obs.content
    # other tools still work
    assert env.step(ToolCall(f"get_{d.owner}", {f"{d.owner}_id": 0})).kind == "tool_error"


def test_reset_restores_state_and_copies_are_independent(suite):
    task = next(t for t in suite.tasks.values() if t.kind == "cancel")
    a, b = clone_env(suite.envs[task.env_id]), clone_env(suite.envs[task.env_id])
    a.reset(task, 0)
    b.reset(task, 0)
    fresh = a.fingerprint()
    assert fresh == b.fingerprint()
    for call in task.oracle:
        a.step(call)
    assert a.rows() != b.rows() and a.fingerprint() != fresh
    a.reset(task, 0)
    assert a.rows() == b.rows() and a.fingerprint() == fresh


# ------------------------------------------------------------------------------ rubric


def replay(suite, task, calls, answer):
    env = clone_env(suite.envs[task.env_id])
    env.reset(task, seed=0)
    for call in calls:
        env.step(call)
    return env.verify(answer, list(calls))


def test_rubric_right_answer(suite):
    task = next(t for t in suite.tasks.values() if not t.writes)
    rubric = replay(suite, task, task.oracle, f"  {task.answer.upper()}. ")  # normalized
    assert rubric.success and rubric.reward == pytest.approx(1.0)
    assert set(rubric.scores.values()) == {1.0}


def test_rubric_wrong_answer(suite):
    task = next(t for t in suite.tasks.values() if not t.writes)
    rubric = replay(suite, task, task.oracle, task.answer + "x")
    assert rubric.scores["answer_correct"] == 0.0 and not rubric.success
    assert rubric.scores["grounded"] == 1.0  # it read the right record, then answered wrongly
    assert rubric.reward == pytest.approx(0.7)
    assert replay(suite, task, task.oracle, None).scores["answer_correct"] == 0.0


def test_rubric_extra_calls_cost_efficiency_and_validity(suite):
    task = next(t for t in suite.tasks.values() if not t.writes)
    calls = [*task.oracle, ToolCall("nope", {})]
    rubric = replay(suite, task, calls, task.answer)
    assert rubric.success  # still done
    assert rubric.scores["calls_valid"] == pytest.approx(len(task.oracle) / len(calls))
    assert rubric.scores["efficiency"] == pytest.approx(len(task.oracle) / len(calls))
    assert rubric.reward < 1.0


def read_record(env, task, rid: int) -> ToolCall:
    """The oracle's last read (get_record) pointed at record `rid` instead."""
    final = task.oracle[-1]
    return ToolCall(final.name, {env.keys["record"]: rid})


def test_a_matching_value_read_from_the_wrong_record_fails(suite):
    """The issue's case: the record the task asks about and another one share the answer; an
    episode that reads only the other one answers right but is not grounded, so it fails."""
    found = []
    for task in (t for t in suite.tasks.values() if t.kind == "status"):
        env = clone_env(suite.envs[task.env_id])
        env.reset(task, 0)
        right = task.oracle[-1].arguments[env.keys["record"]]
        for (table, rid), row in env.rows().items():
            if table == f"{env.domain.record}s" and rid != right and row[3] == task.answer:
                found.append((task, rid))
    assert found, "the small suite has a status shared by two records"
    task, other = found[0]
    env = suite.envs[task.env_id]
    wrong = [*task.oracle[:-1], read_record(env, task, other)]
    rubric = replay(suite, task, wrong, task.answer)
    assert rubric.scores["answer_correct"] == 1.0 and rubric.scores["state_correct"] == 1.0
    assert rubric.scores["grounded"] == 0.0 and not rubric.success
    assert rubric.reward == pytest.approx(0.9)
    # reading the right record as well grounds the same answer
    assert replay(suite, task, [*wrong, task.oracle[-1]], task.answer).success


def test_a_constant_answer_without_reads_is_not_grounded(suite):
    for task in (t for t in suite.tasks.values() if not t.writes):
        rubric = replay(suite, task, [], task.answer)
        assert rubric.scores["answer_correct"] == 1.0 and not rubric.success
        assert rubric.scores["grounded"] == 0.0


def test_write_tasks_are_grounded_by_their_state(suite):
    task = next(t for t in suite.tasks.values() if t.writes)
    assert replay(suite, task, task.oracle[-1:], task.answer).scores["grounded"] == 1.0


def test_a_read_only_answer_is_in_the_oracles_last_read(suite):
    """What grounding relies on (envs/generate.py): the answer comes from the last read."""
    from rollwise.envs.rubric import normalize

    for task in (t for t in suite.tasks.values() if not t.writes):
        env = clone_env(suite.envs[task.env_id])
        env.reset(task, 0)
        read = env.read_at_start(task.oracle[-1])
        values = [len(read)] if isinstance(read, list) else read.values()
        assert normalize(task.answer) in {normalize(str(v)) for v in values}, task.task_id


def test_an_equivalent_call_grounds_the_answer():
    """Another tool's result that names the record read and holds the answer counts (the owner's
    city from a record's owner lookup); the same fields of another record, or a keyless result
    equal to the oracle's (another owner's equal total), do not."""
    from rollwise.envs.rubric import covers

    keys = ("order_id", "customer_id")
    owner = {"customer_id": 7, "name": "erin", "city": "oslo"}
    joined = {"order_id": 3, "customer_id": 7, "name": "erin", "city": "oslo"}
    assert covers(joined, owner, "oslo", keys)
    assert not covers({**joined, "customer_id": 8}, owner, "oslo", keys)
    assert not covers({"customer_id": 7, "name": "erin"}, owner, "oslo", keys)
    total = {"count": 2, "amount": 310}
    assert not covers(dict(total), total, "310", keys)
    rows = [{"order_id": 1, "product": "lamp"}, {"order_id": 2, "product": "rug"}]
    assert not covers(rows[::-1], rows, "2", keys)  # only the oracle's own call reads a list


def test_a_faulty_result_of_the_right_call_is_still_grounded(suite):
    from rollwise.envs.rubric import grounding
    from rollwise.types import Observation

    task = next(t for t in suite.tasks.values() if t.kind == "status")
    made = [(c, Observation('{"garbled": 1}')) for c in task.oracle]
    assert grounding(task, made, lambda call: {}, ()) == 1.0
    assert grounding(task, made[:-1], lambda call: {"x": 1}, ("x",)) == 0.0


def test_rubric_cancel_of_the_wrong_record(suite):
    task = next(t for t in suite.tasks.values() if t.kind == "cancel")
    env = suite.envs[task.env_id]
    d = env.domain
    right = task.target["id"]
    probe = clone_env(env)
    probe.reset(task, 0)
    wrong = next(key for table, key in probe.rows() if table == f"{d.record}s" and key != right)
    cancel = f"cancel_{d.record}"
    bad = [*task.oracle[:-1], ToolCall(cancel, {f"{d.record}_id": wrong})]
    rubric = replay(suite, task, bad, "done")
    assert rubric.scores["no_side_effects"] == 0.0
    assert rubric.scores["state_correct"] == 0.0
    assert not rubric.success
    # cancelling both: right state, but a side effect
    both = [*task.oracle, ToolCall(cancel, {f"{d.record}_id": wrong})]
    rubric = replay(suite, task, both, "done")
    assert rubric.scores["state_correct"] == 1.0 and rubric.scores["no_side_effects"] == 0.0
    # not cancelling at all
    rubric = replay(suite, task, task.oracle[:-1], "done")
    assert rubric.scores["state_correct"] == 0.0 and rubric.scores["no_side_effects"] == 1.0


def test_env_json_names_its_domain(suite_dir: Path, suite):
    for env_id, env in suite.envs.items():
        meta = json.loads((suite_dir / env_id / "env.json").read_text())
        assert meta["env_id"] == env_id and env.env_id == env_id
        tools = json.loads((suite_dir / env_id / "tools.json").read_text())
        assert [t["name"] for t in tools] == [t.name for t in env.tools()]
        assert isinstance(env, SyntheticEnv)
