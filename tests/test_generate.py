"""The generator's diversity and complexity knobs: defaults pinned byte for byte, diverse suites
deterministic, every kept oracle passing, and each knob visible in what it generates."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest

from rollwise.config import EnvsConfig, ParamsError
from rollwise.envs.generate import KINDS, feasible_kinds, generate_suite
from rollwise.envs.runtime import load_suite
from rollwise.envs.spec import DISTRACTORS, DOMAINS, TOOL_TEMPLATES
from rollwise.rollout.engine import clone_env
from rollwise.types import ToolCall
from tests.helpers import SMALL_ENVS

# sha256 of catalog + tasks + tools.json + env.json + state.sqlite, taken before the knobs were
# added: the defaults must keep generating exactly the original suites.
PINNED = {
    "params_default_24x40": "0982405ea2a052298d9f07a511c733e78c68e8540dacfdae0833b455f4926f7f",
    "small_3x10": "4e344b402a3d820082d2479c01bf5cc439e108f0ac52820e967d5e444ffa82ed",
}
DIVERSE = EnvsConfig(
    n_envs=18,
    tasks_per_env=30,
    heldout_envs=3,
    domains=list(DOMAINS),
    entity_synonyms=True,
    tool_synonyms=True,
    tool_templates=list(k for k in TOOL_TEMPLATES if k not in DISTRACTORS),
    tools_per_env=7,
    distractor_tools=2,
    schema_templates=3,
    owners_min=4,
    value_dists=["uniform", "skewed", "narrow"],
    amount_types=["integer", "real"],
    task_kinds=list(KINDS),
)


def suite_hash(out: Path) -> str:
    h = hashlib.sha256(pd.read_parquet(out / "catalog.parquet").to_json(orient="records").encode())
    for env_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        h.update(pd.read_parquet(env_dir / "tasks.parquet").to_json(orient="records").encode())
        for name in ("tools.json", "env.json", "state.sqlite"):
            h.update((env_dir / name).read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize(
    "name,cfg", [("params_default_24x40", EnvsConfig(n_envs=24)), ("small_3x10", SMALL_ENVS)]
)
def test_default_knobs_generate_the_original_suite(name: str, cfg: EnvsConfig, tmp_path: Path):
    generate_suite(cfg, tmp_path)
    assert suite_hash(tmp_path) == PINNED[name]
    for env_dir in (p for p in tmp_path.iterdir() if p.is_dir()):
        assert "spec" not in json.loads((env_dir / "env.json").read_text())


@pytest.fixture(scope="module")
def diverse(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("diverse")
    return out, generate_suite(DIVERSE, out)


def test_diverse_suite_is_deterministic(diverse, tmp_path: Path):
    out, counts = diverse
    assert generate_suite(DIVERSE, tmp_path / "again") == counts
    assert suite_hash(tmp_path / "again") == suite_hash(out)
    generate_suite(DIVERSE.model_copy(update={"seed": 1}), tmp_path / "other")
    assert suite_hash(tmp_path / "other") != suite_hash(out)


def test_every_kept_oracle_passes_the_verifier(diverse):
    out, counts = diverse
    suite = load_suite(out)
    assert counts["tasks"] == len(suite.tasks) > 300 and counts["oracle_rejected"] >= 0
    for task in suite.tasks.values():
        env = clone_env(suite.envs[task.env_id])
        env.reset(task, seed=0)
        assert [env.step(c).kind for c in task.oracle] == ["ok"] * len(task.oracle), task
        assert env.verify(task.answer, list(task.oracle)).success, task.task_id


def test_tools_differ_across_environments(diverse):
    out, _ = diverse
    suite = load_suite(out)
    by_domain: dict[str, set] = {}
    arg_names, oracle_tools = set(), set()
    for env_id, env in suite.envs.items():
        tools = env.tools()
        names = [t.name for t in tools]
        assert [t["name"] for t in json.loads((out / env_id / "tools.json").read_text())] == names
        by_domain.setdefault(env.spec.domain, set()).add(tuple(sorted(names)))
        arg_names |= {a for t in tools for a in t.parameters["properties"]}
        distractors = {env.spec.tool_name(t) for t in env.spec.verbs if t in DISTRACTORS}
        assert len(distractors) == DIVERSE.distractor_tools
        assert len(env.spec.verbs) == DIVERSE.tools_per_env + DIVERSE.distractor_tools
        oracle_tools |= {c.name for t in suite.tasks.values() if t.env_id == env_id
                         for c in t.oracle} & distractors  # fmt: skip
    assert all(len(sets) == 2 for sets in by_domain.values())  # 2 envs per domain, unlike
    assert {"name", "full_name", "status", "state"} <= arg_names
    assert not oracle_tools  # distractors are never needed


def test_complexity_schema_and_database_knobs_show(diverse):
    out, _ = diverse
    suite = load_suite(out)
    cat = suite.catalog
    assert set(cat["n_calls"]) == {1, 2, 3, 4}  # dependent calls 1..K
    assert cat["writes"].any() and (~cat["writes"]).any()
    assert {"conditional", "update", "total", "filter_count", "record_city"} <= set(cat["kind"])
    specs = [env.spec for env in suite.envs.values()]
    assert {s.columns for s in specs} == {(), ("priority",), ("priority", "tier")}
    assert {s.amount for s in specs} == {"integer", "real"}
    assert len({s.owners for s in specs}) > 1 and len({s.values for s in specs}) > 1
    assert len({(s.owner, s.record) for s in specs}) > len(DOMAINS)  # entity aliases
    update = next(t for t in suite.tasks.values() if t.kind == "update")
    env = clone_env(suite.envs[update.env_id])
    env.reset(update, seed=0)
    for call in update.oracle:
        env.step(call)
    row = env.rows()[(update.target["table"], update.target["id"])]
    assert update.target["status"] in row


def test_max_calls_and_write_share(tmp_path: Path):
    cfg = DIVERSE.model_copy(update={"n_envs": 6, "max_calls": 2, "write_share": 1.0})
    generate_suite(cfg, tmp_path)
    cat = pd.read_parquet(tmp_path / "catalog.parquet")
    assert len(cat) and cat["n_calls"].max() <= 2
    writable = [k for k in KINDS if KINDS[k].writes and KINDS[k].calls <= 2]
    assert not writable and set(cat["kind"]) <= {k for k in KINDS if KINDS[k].calls <= 2}
    cfg = DIVERSE.model_copy(update={"n_envs": 6, "write_share": 1.0})
    generate_suite(cfg, tmp_path / "writes")
    suite = load_suite(tmp_path / "writes")
    writers = {e for e, env in suite.envs.items()
               if any(KINDS[k].writes for k in feasible_kinds(env.spec, cfg))}  # fmt: skip
    kinds = suite.catalog.loc[suite.catalog["env_id"].isin(writers), "kind"]
    assert writers and set(kinds) <= {k for k in KINDS if KINDS[k].writes}


def test_new_tools_reject_bad_calls_as_observations(diverse):
    out, _ = diverse
    suite = load_suite(out)
    env_id = next(e for e, env in suite.envs.items() if "update" in env.spec.verbs)
    env = clone_env(suite.envs[env_id])
    task = next(t for t in suite.tasks.values() if t.env_id == env_id)
    env.reset(task, seed=0)
    spec, records = env.spec, f"{env.domain.record}s"
    rid = next(key for table, key in env.rows() if table == records)
    bad = [
        spec.call("update", rid, "exploded"),  # not one of the statuses
        ToolCall(spec.tool_name("update"), {spec.keys["record"]: rid}),  # missing status
        ToolCall(spec.tool_name("update"), {spec.keys["record"]: str(rid), "status": "x"}),
    ]
    distractor = next(t for t in spec.verbs if t in DISTRACTORS and not TOOL_TEMPLATES[t].args)
    bad.append(ToolCall(spec.tool_name(distractor), {"x": 1}))  # takes no argument
    before = env.rows()
    assert [env.step(c).kind for c in bad] == ["tool_error"] * len(bad)
    assert env.rows() == before
    assert env.step(ToolCall(spec.tool_name(distractor), {})).kind == "ok"


@pytest.mark.parametrize(
    "update,key",
    [
        ({"task_kinds": ["city_by_id", "teleport"]}, "envs.task_kinds"),
        ({"domains": ["shop", "moon"]}, "envs.domains"),
        ({"owners_min": 9, "owners_per_env": 8}, "envs.owners_min"),
        ({"owners_per_env": 80}, "envs.owners_per_env"),
    ],
)
def test_bad_knobs_name_their_key(update: dict, key: str, tmp_path: Path):
    with pytest.raises(ParamsError, match=key):
        generate_suite(EnvsConfig(n_envs=2, heldout_envs=0).model_copy(update=update), tmp_path)
