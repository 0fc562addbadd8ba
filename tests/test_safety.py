"""Safety of tool execution: every malformed call is an error observation (never an exception),
SQL is always parameterized, and a call cannot reach anything outside its environment's state."""

from __future__ import annotations

import ast
import decimal
import json
import sqlite3
import time
from pathlib import Path

import mpmath
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import rollwise.envs.runtime as runtime
from rollwise.envs.bfcl import BFCLEnv
from rollwise.envs.bfcl_exec import MAX_PRECISION
from rollwise.envs.runtime import load_suite
from rollwise.envs.schema import MAX_STRING, check_call
from rollwise.rollout.engine import clone_env
from rollwise.types import ToolCall
from tests.helpers import make_suite

FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
NOT_JSON = st.binary(max_size=8) | st.sets(st.integers(), max_size=3) | st.builds(object)
INJECTIONS = ["x' OR '1'='1", "'; DROP TABLE customers; --", '" OR 1=1 --', "%s", "?"]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("safety")
    make_suite(out)
    return load_suite(out)


@pytest.fixture(scope="module")
def synthetic(suite):
    """A fresh copy of the first environment, reset on a cancel task (the one write tool)."""
    task = next(t for t in suite.tasks.values() if t.kind == "cancel")
    return clone_env(suite.envs[task.env_id]), task


def malformed_calls(d) -> dict[str, ToolCall]:
    oid, get = f"{d.owner}_id", f"get_{d.owner}"
    return {
        "unknown tool": ToolCall("launch_rocket", {}),
        "private method": ToolCall("_cancel", {f"{d.record}_id": 1}),
        "dunder": ToolCall("__init__", {}),
        "missing argument": ToolCall(get, {}),
        "extra argument": ToolCall(get, {oid: 1, "extra": 2}),
        "string for integer": ToolCall(get, {oid: "150"}),
        "float for integer": ToolCall(get, {oid: 1.5}),
        "bool for integer": ToolCall(get, {oid: True}),
        "null": ToolCall(get, {oid: None}),
        "list": ToolCall(get, {oid: [1]}),
        "huge integer": ToolCall(get, {oid: 2**70}),
        "huge string": ToolCall(f"find_{d.owner}", {"name": "a" * (MAX_STRING + 1)}),
        "NaN": ToolCall(get, {oid: float("nan")}),
        "bytes": ToolCall(f"find_{d.owner}", {"name": b"alice"}),
        "arguments not an object": ToolCall(get, "not json {"),
        "arguments a list": ToolCall(get, [1]),
        "name not a string": ToolCall(["get"], {}),
    }


def test_malformed_calls_are_error_observations(synthetic):
    env, task = synthetic
    env.reset(task, seed=0)
    before = env.rows()
    cases = malformed_calls(env.domain)
    for what, call in cases.items():
        obs = env.step(call)  # never raises
        assert obs.kind == "tool_error", (what, obs)
        assert json.loads(obs.content)["error"], what
    assert env.call_kinds == ["tool_error"] * len(cases) and env.rows() == before


def tool_calls(env, known: list | None = None) -> st.SearchStrategy[ToolCall]:
    """Calls with real or junk names and JSON (or not) arguments keyed by real or junk names;
    `known` values (ids and names in the state) make some calls valid."""
    names = [t.name for t in env.tools()]
    keys = sorted({k for t in env.tools() for k in t.parameters["properties"]})
    values = st.one_of(
        st.sampled_from(known or INJECTIONS), JSON, NOT_JSON, st.sampled_from(INJECTIONS)
    )
    arguments = st.dictionaries(st.sampled_from(keys) | st.text(max_size=8), values, max_size=3)
    name = st.sampled_from(names) | st.text(max_size=12) | st.sampled_from(["__class__", "rows"])
    well_formed = st.sampled_from(env.tools()).flatmap(
        lambda t: st.builds(
            ToolCall,
            st.just(t.name),
            st.fixed_dictionaries(dict.fromkeys(t.parameters["properties"], values)),
        )
    )
    return well_formed | st.builds(ToolCall, name, arguments | values)


def test_fuzzed_calls_never_raise_or_leave_the_state(synthetic, tmp_path, monkeypatch):
    env, task = synthetic
    monkeypatch.chdir(tmp_path)  # anything written to disk would land here
    d = env.domain
    env.reset(task, seed=0)
    known = sorted({key for _, key in env.rows()}) + [row[1] for row in env.rows().values()]
    ran = []

    record_id = next(key for table, key in env.rows() if table == f"{d.record}s")
    valid_cancel = ToolCall(f"cancel_{d.record}", {f"{d.record}_id": record_id})

    @FUZZ
    @given(calls=st.lists(tool_calls(env, known), min_size=1, max_size=4))
    @example(calls=[valid_cancel])  # the state check always sees at least one real change
    def check(calls):
        env.reset(task, seed=0)
        before, cancelled = env.rows(), set()
        for call in calls:
            obs = env.step(call)
            assert obs.kind in ("ok", "tool_error"), obs  # never the environment's fault
            if obs.kind == "ok":  # only schema-valid calls run
                specs = {t.name: t for t in env.tools()}
                assert check_call(specs, call.name, call.arguments) is None
                if call.name == f"cancel_{d.record}":
                    cancelled.add((f"{d.record}s", call.arguments[f"{d.record}_id"]))
        changed = {k for k in before if before[k] != env.rows().get(k)}
        assert changed <= cancelled and env.rows().keys() == before.keys()
        ran.extend(cancelled)

    check()
    assert list(tmp_path.iterdir()) == []
    assert ran, "no fuzzed cancel ever ran: the state check checked nothing"


# ------------------------------------------------------------------------------ SQL


def test_sql_interpolates_only_generator_names():
    """Static audit of runtime.py: an f-string holding SQL may interpolate only table and column
    names from the domain (`d.<field>`, `table`); every value goes in as a ? parameter."""
    tree = ast.parse(Path(runtime.__file__).read_text())
    sql = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        and any(
            isinstance(v, ast.Constant) and any(w in v.value for w in ("SELECT", "UPDATE", "WHERE"))
            for v in node.values
        )
    ]
    assert len(sql) >= 8
    for node in sql:
        for part in node.values:
            if isinstance(part, ast.FormattedValue):
                expr = part.value
                named = isinstance(expr, ast.Name) and expr.id == "table"
                domain = isinstance(expr, ast.Attribute) and getattr(expr.value, "id", "") == "d"
                assert named or domain, ast.unparse(node)


class Recorder:
    """Wraps an episode's connection and records every statement and its parameters."""

    def __init__(self, con):
        self.con, self.log = con, []

    def execute(self, sql, params=()):
        self.log.append((sql, params))
        return self.con.execute(sql, params)


def test_injection_payloads_are_parameters(synthetic):
    env, task = synthetic
    d = env.domain
    env.reset(task, seed=0)
    before = env.rows()
    env.con = Recorder(env.con)
    for payload in INJECTIONS:
        obs = env.step(ToolCall(f"find_{d.owner}", {"name": payload}))
        assert obs.kind == "tool_error" and "not found" in obs.content
    assert len(env.con.log) >= len(INJECTIONS)
    for sql, params in env.con.log:
        assert not any(c in sql for c in "'\";") and "?" in sql
        assert params and params[0] in INJECTIONS
    env.con = env.con.con
    assert env.rows() == before


@pytest.mark.parametrize(
    "statement",
    [
        "ATTACH DATABASE ':memory:' AS other",
        "PRAGMA table_info(customers)",
        "SELECT * FROM sqlite_master",
        "CREATE TABLE leak (x)",
        "DROP TABLE {owner}s",
        "DELETE FROM {record}s",
        "INSERT INTO {owner}s VALUES (1, 'x', 'y')",
    ],
)
def test_authorizer_keeps_sql_inside_the_state(synthetic, statement):
    """Even SQL that reached the connection could not leave the environment's two tables."""
    env, task = synthetic
    env.reset(task, seed=0)
    before = env.rows()
    with pytest.raises(sqlite3.DatabaseError, match="not authorized|prohibited"):
        env.con.execute(statement.format(owner=env.domain.owner, record=env.domain.record))
    assert env.rows() == before
    assert all(env.step(c).kind == "ok" for c in task.oracle)  # the tools still work


# ------------------------------------------------------------------------------ BFCL


@pytest.fixture(scope="module")
def bfcl():
    env = BFCLEnv(["base"], ids=["multi_turn_base_0", "multi_turn_base_15"])
    return env, {t.task_id: t for t in env.tasks()}


def test_bfcl_whitelist_and_malformed_calls(bfcl):
    env, tasks = bfcl
    env.reset(tasks["multi_turn_base_0"], seed=0)
    before = env.fingerprint()
    cases = {
        "private": ToolCall("_load_scenario", {"scenario": {}}),
        "dunder": ToolCall("__init__", {}),
        "class": ToolCall("__class__", {}),
        "builtin": ToolCall("eval", {"source": "1"}),
        "missing": ToolCall("cd", {}),
        "extra": ToolCall("cd", {"folder": "document", "sudo": True}),
        "wrong type": ToolCall("cd", {"folder": 5}),
        "huge string": ToolCall("cd", {"folder": "x" * (MAX_STRING + 1)}),
        "not JSON": ToolCall("cd", {"folder": float("inf")}),
        "not an object": ToolCall("cd", "folder=document"),
    }
    for what, call in cases.items():  # BFCL's executor's own text where BFCL would answer
        obs = env.step(call)
        bfcl_text = obs.content.startswith("Error during execution: ")
        assert obs.kind == "tool_error" and (bfcl_text or "error" in json.loads(obs.content)), what
    assert env.fingerprint() != before  # the last observation is part of the fingerprint
    env.reset(tasks["multi_turn_base_0"], seed=0)
    assert env.fingerprint() == before


def test_bfcl_fuzzed_calls_never_raise(bfcl):
    env, tasks = bfcl
    task = tasks["multi_turn_base_0"]
    env.reset(task, seed=0)
    known = ["workspace", "document", "archive", "final_report.pdf", "temp", "..", "budget", 3]
    kinds = []

    @FUZZ
    @given(calls=st.lists(tool_calls(env, known), min_size=1, max_size=3))
    def check(calls):
        env.reset(task, seed=0)
        for call in calls:
            kinds.append(env.step(call).kind)
            assert kinds[-1] in ("ok", "tool_error")

    check()
    assert "ok" in kinds  # some fuzzed calls did run


def test_bfcl_math_is_bounded_and_leaves_precision_alone(bfcl):
    env, tasks = bfcl
    env.reset(tasks["multi_turn_base_15"], seed=0)
    dps, prec = mpmath.mp.dps, decimal.getcontext().prec
    t0 = time.perf_counter()
    for call in [
        ToolCall("logarithm", {"value": 20, "base": 10, "precision": MAX_PRECISION + 1}),
        ToolCall("power", {"base": 9, "exponent": 10**12}),
    ]:
        obs = env.step(call)
        assert obs.kind == "tool_error", obs
    assert time.perf_counter() - t0 < 1.0
    assert env.step(ToolCall("logarithm", {"value": 20, "base": 10, "precision": 60})).kind == "ok"
    assert env.step(ToolCall("square_root", {"number": 2, "precision": 70})).kind == "ok"
    assert (mpmath.mp.dps, decimal.getcontext().prec) == (dps, prec)
