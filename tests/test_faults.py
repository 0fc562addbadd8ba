"""Fault injection: off means byte-identical suites; on, rates within binomial bounds, ground truth
only in the audit tables, everything deterministic from the seeds."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from rollwise.config import EnvsConfig, FaultsConfig
from rollwise.envs.faults import AUDIT_FILE, KNOBS_FILE
from rollwise.envs.runtime import load_suite
from rollwise.rollout.engine import clone_env
from tests.helpers import SMALL_ENVS, make_suite

# 12 environments x 40 tasks: enough calls for tight binomial bounds, generated in ~0.3 s.
WIDE = EnvsConfig(seed=3, n_envs=12, tasks_per_env=40, heldout_envs=1)


def with_faults(cfg: EnvsConfig, **knobs) -> EnvsConfig:
    return cfg.model_copy(update={"faults": FaultsConfig(**knobs)})


def tree_hash(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def within(k: int, n: int, p: float, z: float = 4.0) -> bool:
    """k successes of n draws is within z standard deviations of n p (plus one for rounding)."""
    return abs(k - n * p) <= z * math.sqrt(n * p * (1 - p)) + 1


def test_faults_off_is_byte_identical(tmp_path: Path):
    make_suite(tmp_path / "plain")
    zero = with_faults(SMALL_ENVS, seed=7, flaky_wrong=0.9)  # knobs set, every rate 0: still off
    make_suite(tmp_path / "zero", zero)
    plain = tree_hash(tmp_path / "plain")
    assert plain == tree_hash(tmp_path / "zero")
    assert AUDIT_FILE not in plain and KNOBS_FILE not in plain
    assert all(env.faults is None for env in load_suite(tmp_path / "plain").envs.values())


def test_same_seed_same_suite_with_faults(tmp_path: Path):
    cfg = with_faults(SMALL_ENVS, flaky_p=0.2, unsolvable_frac=0.3, verifier_flip_q=0.1)
    counts = make_suite(tmp_path / "a", cfg)
    make_suite(tmp_path / "b", cfg)
    make_suite(tmp_path / "plain")
    a, plain = tree_hash(tmp_path / "a"), tree_hash(tmp_path / "plain")
    assert a == tree_hash(tmp_path / "b")
    # Faults add the audit and the knobs and change nothing the scheduler or curator reads.
    assert set(a) - set(plain) == {AUDIT_FILE, KNOBS_FILE}
    assert {k: v for k, v in a.items() if k in plain} == plain
    audit = pd.read_parquet(tmp_path / "a" / AUDIT_FILE)
    assert counts["unsolvable"] == int(audit["unsolvable"].sum()) > 0
    other = with_faults(SMALL_ENVS, seed=1, flaky_p=0.2, unsolvable_frac=0.3)
    make_suite(tmp_path / "c", other)
    assert not pd.read_parquet(tmp_path / "c" / AUDIT_FILE).equals(audit)  # the seed matters


@pytest.fixture(scope="module")
def unsolvable_suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("unsolvable")
    make_suite(out, with_faults(WIDE, unsolvable_frac=0.3))
    return out, load_suite(out)


def test_unsolvable_rate_and_withheld_tools(unsolvable_suite):
    out, suite = unsolvable_suite
    audit = pd.read_parquet(out / AUDIT_FILE)
    assert len(audit) == len(suite.tasks) == 480
    assert within(int(audit["unsolvable"].sum()), len(audit), 0.3)
    for row in audit.itertuples():
        task = suite.tasks[row.task_id]
        env = clone_env(suite.envs[task.env_id])
        env.reset(task, seed=0)
        names = [t.name for t in env.tools()]
        oracle_tools = {c.name for c in task.oracle}
        if row.unsolvable:  # a tool the oracle needs is withheld, and calling it is refused
            assert row.withheld_tool in oracle_tools and row.withheld_tool not in names
            assert [a["fault"] for a in env.audit] == ["withheld_tool"]
            for call in task.oracle:
                obs = env.step(call)
                if call.name == row.withheld_tool:
                    assert obs.kind == "tool_error" and "unknown tool" in obs.content
            if row.withheld_tool.startswith("cancel_"):  # the write can no longer happen
                assert env.verify(task.answer, list(task.oracle)).scores["state_correct"] == 0
        else:
            assert len(names) == 5 and env.audit == []


def test_every_kept_oracle_passes_without_faults(unsolvable_suite):
    """Generation replays oracles on a clean environment: faults never decide what is kept."""
    out, _ = unsolvable_suite
    clean = load_suite(out)
    for env in clean.envs.values():
        env.faults = None
    for task in clean.tasks.values():
        env = clone_env(clean.envs[task.env_id])
        env.reset(task, seed=0)
        assert all(env.step(c).kind == "ok" for c in task.oracle), task.task_id
        assert env.verify(task.answer, list(task.oracle)).success, task.task_id


def run_oracles(suite, seeds) -> list[tuple]:
    """(env, task, seed, observations) for every task's oracle under every seed."""
    out = []
    for seed in seeds:
        for task in suite.tasks.values():
            env = clone_env(suite.envs[task.env_id])
            env.reset(task, seed=seed)
            out.append((env, task, seed, [env.step(c) for c in task.oracle]))
    return out


@pytest.fixture(scope="module")
def flaky_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("flaky")
    make_suite(out, with_faults(WIDE, flaky_p=0.2, flaky_wrong=0.4, stochastic_p=0.5))
    suite = load_suite(out)
    return suite, run_oracles(suite, seeds=range(3))


def test_flaky_rates_within_binomial_bounds(flaky_runs):
    suite, runs = flaky_runs
    n_calls = sum(len(obs) for *_, obs in runs)
    rows = [a for env, *_ in runs for a in env.audit]
    errors = [a for a in rows if a["fault"] == "flaky_error"]
    wrong = [a for a in rows if a["fault"] == "flaky_wrong"]
    assert n_calls > 3000
    assert within(len(errors) + len(wrong), n_calls, 0.2)
    assert within(len(wrong), len(errors) + len(wrong), 0.4)
    for env, _, _, observations in runs:
        for a in env.audit:
            obs = observations[a["step"]]
            if a["fault"] == "flaky_error":  # transient: an environment error
                assert obs.kind == "env_error" and "temporarily unavailable" in obs.content
            elif a["fault"] == "flaky_wrong":  # looks fine, is not
                true = json.loads(a["detail"])["true"]
                assert obs.kind == "ok" and json.loads(obs.content) != true


def test_failed_calls_do_not_run(flaky_runs):
    suite, runs = flaky_runs
    failed_cancels = 0
    for env, task, _, _ in runs:
        failed = {a["step"] for a in env.audit if a["fault"] == "flaky_error"}
        if task.writes and len(task.oracle) - 1 in failed:
            failed_cancels += 1
            assert env.rows() == env.rows_before  # the cancel never happened
            assert not env.verify(task.answer, list(task.oracle)).scores["state_correct"]
    assert failed_cancels > 0


def test_stochastic_execution_reorders_lists_only(flaky_runs):
    suite, runs = flaky_runs
    eligible = shuffled = 0
    for env, _, _, observations in runs:
        flaky = {a["step"] for a in env.audit if a["fault"].startswith("flaky")}
        for step, obs in enumerate(observations):
            value = json.loads(obs.content)
            if step in flaky or not (isinstance(value, list) and len(value) > 1):
                continue
            eligible += 1
            hit = [a for a in env.audit if a["step"] == step and a["fault"] == "stochastic"]
            if hit:
                shuffled += 1
                true = json.loads(hit[0]["detail"])["true"]
                assert value != true and sorted(map(json.dumps, value)) == sorted(
                    map(json.dumps, true)
                )
    assert eligible > 300 and within(shuffled, eligible, 0.5)


def test_faults_are_deterministic_from_seeds(flaky_runs):
    suite, runs = flaky_runs
    env0, task, seed, observations = next(r for r in runs if r[0].audit)
    env = clone_env(suite.envs[task.env_id])
    env.reset(task, seed=seed)
    assert [env.step(c).content for c in task.oracle] == [o.content for o in observations]
    assert env.audit == env0.audit
    patterns = {
        seed: [(a["task_id"], a["step"], a["fault"]) for env, t, s, _ in runs if s == seed
               for a in env.audit]
        for seed in range(3)
    }  # fmt: skip
    assert patterns[0] != patterns[1] != patterns[2]  # the episode seed matters


def test_verifier_flips_within_binomial_bounds(tmp_path: Path):
    make_suite(tmp_path, with_faults(WIDE, verifier_flip_q=0.1))
    suite = load_suite(tmp_path)
    n = flips = disagreements = 0
    for seed in range(4):
        for task in suite.tasks.values():
            env = clone_env(suite.envs[task.env_id])
            env.reset(task, seed=seed)
            for call in task.oracle:
                env.step(call)
            first = env.verify(task.answer, list(task.oracle))
            flipped = [a for a in env.audit if a["fault"] == "verdict_flip"]
            n, flips = n + 1, flips + len(flipped)
            assert first.success == (not flipped)  # an oracle run succeeds unless flipped
            second = env.verify(task.answer, list(task.oracle))  # re-verifying draws anew
            disagreements += first.success != second.success
    assert n == 4 * 480 and within(flips, n, 0.1)
    assert within(disagreements, n, 2 * 0.1 * 0.9)


def test_fault_knobs_override_by_dotted_key():
    from rollwise.config import ParamsError, apply_overrides, validate

    raw = apply_overrides({}, {"envs.faults.flaky_p": 0.1, "envs.custom": None})
    assert validate(raw).envs.faults.flaky_p == 0.1 and validate(raw).envs.faults.active
    with pytest.raises(ParamsError, match=r"envs\.faults\.flaky"):
        apply_overrides({}, {"envs.faults.flaky": 0.1})
    with pytest.raises(ParamsError, match=r"envs\.faults\.flaky_p"):
        apply_overrides({}, {"envs.faults.flaky_p": 2.0})
