"""envs/toolsmith.py and envs/tool_pool.py (SMITH): build tasks scored on three axes computed by
hand, use tasks through pooled tools, admission on evidence, and hostile submissions as error
observations (the code runs in the sandbox, never here)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest

from rollwise.envs.tool_pool import PooledTool, ToolPool, harvest
from rollwise.envs.toolsmith import FAMILIES, Toolsmith, make_tasks, run_cases, telling_cases
from rollwise.types import ToolCall

SLUG_SCHEMA = FAMILIES["slugify"].schema()


def build_task(name: str = "slugify"):
    return next(t for t in make_tasks(per_family=1) if t.task_id == f"{name}-build-0")


def submit(schema, code: str, task=None):
    env = Toolsmith()
    task = task or build_task()
    env.reset(task, seed=0)
    obs = env.step(ToolCall("define_tool", {"schema": schema, "code": code}))
    return obs, env.verify("done", [])


def test_every_oracle_passes_on_all_three_axes():
    env = Toolsmith()
    for task in make_tasks(per_family=1):
        env.reset(task, seed=0)
        observations = [env.step(call) for call in task.oracle]
        rubric = env.verify(task.answer, list(task.oracle))
        assert all(o.kind == "ok" for o in observations), (task.task_id, observations)
        assert rubric.success and rubric.reward == 1.0, (task.task_id, rubric.scores)


def test_sibling_families_share_a_tool_and_only_the_examples_tell_them_apart():
    # a build must read its examples: the sibling's reference (a recalled tool) has the right
    # schema but fails an example and a held-out input, and the pool refuses it
    for key, family in FAMILIES.items():
        sibling = FAMILIES[family.sibling]
        assert sibling.sibling == key and sibling.schema() == family.schema()
    task = build_task("slugify_underscore")
    assert "Write a tool named slugify:" in task.prompt and "_" in task.target["examples"][0]["out"]
    obs, rubric = submit(SLUG_SCHEMA, FAMILIES["slugify"].source(), task)
    assert json.loads(obs.content)["examples_passed"] == "0/3" and obs.kind == "tool_error"
    assert rubric.scores["schema_valid"] == 1.0 and rubric.scores["answer_correct"] == 0.0
    obs, rubric = submit(SLUG_SCHEMA, FAMILIES["slugify_underscore"].source(), task)
    assert rubric.success and "def slugify(" in FAMILIES["slugify_underscore"].source()
    excess, above = FAMILIES["total_excess"], FAMILIES["total_above"]
    assert "fresh inputs wrong" in ToolPool().admit("total_excess", excess.schema(),
                                                    above.source(), "recalled")  # fmt: skip
    for key, family in FAMILIES.items():  # examples and held-out inputs each tell the pair apart
        for part in (slice(0, 3), slice(3, 7)):
            cases = telling_cases(family, random.Random(key))[part]
            assert any(family.fn(**c) != FAMILIES[family.sibling].fn(**c) for c in cases), key


def test_the_three_axes_fail_apart_with_rewards_by_hand():
    task = build_task()
    shown = {e["args"]["title"]: e["out"] for e in task.target["examples"]}
    memorized = f"def slugify(title):\n    return {shown!r}.get(title, 'x')\n"
    obs, rubric = submit(SLUG_SCHEMA, memorized, task)
    assert obs.kind == "ok" and json.loads(obs.content)["examples_passed"] == "3/3"
    assert (rubric.scores["schema_valid"], rubric.scores["examples_pass"]) == (1.0, 1.0)
    assert rubric.scores["answer_correct"] == 0.0  # held-out inputs it never saw
    assert rubric.reward == pytest.approx((1 + 1 + 0) / 4) and not rubric.success

    wrong_schema = {
        **SLUG_SCHEMA,
        "parameters": {"type": "object", "properties": {"title": {"type": "integer"}}},
    }
    obs, rubric = submit(wrong_schema, FAMILIES["slugify"].source(), task)
    assert obs.kind == "tool_error" and "type 'integer'" in obs.content
    assert rubric.scores == {
        "schema_valid": 0.0,
        "examples_pass": 1.0,
        "answer_correct": 1.0,
        "state_correct": 0.0,
        "no_side_effects": 1.0,
    }
    assert rubric.reward == pytest.approx(3 / 4) and not rubric.success

    half = "def slugify(title):\n    return title.lower().replace(' ', '-', 1)\n"
    _, rubric = submit(SLUG_SCHEMA, half, task)
    two_word = sum(len(e["args"]["title"].split()) <= 2 for e in task.target["examples"])
    assert rubric.scores["examples_pass"] == pytest.approx(two_word / 3)

    env = Toolsmith()
    env.reset(task, seed=0)
    assert env.verify("done", []).reward == 0.0  # nothing submitted: every axis 0


@pytest.mark.parametrize(
    "code",
    [
        "import os\ndef slugify(title):\n    return os.getcwd()\n",
        "def slugify(title):\n    return open('/etc/passwd').read()\n",
        "def slugify(title):\n    while True:\n        pass\n",
        "def slugify(title):\n    return ().__class__.__bases__[0].__subclasses__()\n",
        "def slugify(title):\n    return slugify(title)\n",
        "def slugify(title):\n    print('x' * 10**7)\n",
        "slugify = 3",
        "def slugify(title) return",
    ],
)
def test_hostile_or_broken_submissions_are_error_observations(code, tmp_path):
    before = set(Path.cwd().iterdir())
    obs, rubric = submit(SLUG_SCHEMA, code)
    assert obs.kind == "tool_error" and "examples_passed" in obs.content
    assert rubric.scores["examples_pass"] == 0.0 and rubric.scores["answer_correct"] == 0.0
    assert set(Path.cwd().iterdir()) == before


def test_use_task_checks_arguments_and_calls_the_pooled_version():
    task = next(t for t in make_tasks(per_family=1) if t.task_id == "slugify-use-0")
    env = Toolsmith()
    env.reset(task, seed=0)
    assert env.tools()[0].name == "slugify"
    assert env.step(ToolCall("slugify", {"text": "A b"})).kind == "tool_error"
    assert env.step(ToolCall("initials", {"name": "A b"})).kind == "tool_error"
    (call,) = task.oracle
    assert json.loads(env.step(call).content)["result"] == task.answer
    assert env.verify(task.answer, [call]).success and not env.verify("no", [call]).success
    loud = "def slugify(title):\n    return title.upper()\n"  # placed by hand: not admitted
    env = Toolsmith(pool=ToolPool([PooledTool("slugify", SLUG_SCHEMA, loud, "test", 0)]))
    env.reset(task, seed=0)
    assert json.loads(env.step(call).content)["result"] == call.arguments["title"].upper()


def test_pool_admits_on_evidence_and_round_trips(tmp_path):
    pool = ToolPool()
    assert pool.admit("slugify", SLUG_SCHEMA, FAMILIES["slugify"].source(), "round 1 a") is None
    memorized = "def slugify(title):\n    return 'ada-grace'\n"
    assert "fresh inputs wrong" in pool.admit("slugify", SLUG_SCHEMA, memorized, "round 1 b")
    assert "schema name" in pool.admit("slugify", {**SLUG_SCHEMA, "name": "s"}, "", "round 1 c")
    assert "no family" in pool.admit("nope", {}, "", "round 1 d")
    assert pool.verified_share() == pytest.approx(1 / 4) and pool.code("slugify")
    pool.save(tmp_path / "pool_round_01.json")
    back = ToolPool.load(tmp_path / "pool_round_01.json")
    assert back == pool and back.code("clamp") is None
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        ToolPool.load(tmp_path / "bad.json")


def test_harvest_offers_successful_builds_only():
    code = FAMILIES["clamp"].source()
    args = json.dumps({"schema": FAMILIES["clamp"].schema(), "code": code})
    episodes = pd.DataFrame(
        {
            "episode_id": ["e1", "e2", "e3"],
            "success": [True, False, True],
            "task_id": ["clamp-build-0", "clamp-build-1", "clamp-use-0"],
        }
    )
    steps = pd.DataFrame(
        {
            "episode_id": ["e1", "e2", "e3"],
            "tool": ["define_tool"] * 2 + ["clamp"],
            "arguments": [args, args, "{}"],
        }
    )
    pool = ToolPool()
    assert harvest(pool, episodes, steps, 3) == {"submitted": 1, "admitted": 1}
    assert [t.origin for t in pool.built()] == ["round 3 episode e1"]


def test_run_cases_reports_a_raising_case_as_none():
    values, error = run_cases("def f(x):\n    return 10 // x\n", "f", [{"x": 2}, {"x": 0}])
    assert values == [5, None] and error is None
    assert run_cases("x = 1", "_f", [{}])[1].startswith("not a function name")


def test_generate_stage_keeps_every_task_of_the_custom_env(tmp_path):
    from rollwise.config import Params
    from rollwise.envs.custom import generate_custom

    cfg = Params().envs.model_copy(update={"custom": "rollwise.envs.toolsmith:toolsmith"})
    counts = generate_custom(cfg, tmp_path)
    assert counts == {"envs": len(FAMILIES), "tasks": len(make_tasks()), "oracle_rejected": 0}
    catalog = pd.read_parquet(tmp_path / "catalog.parquet")
    assert set(catalog["kind"]) == {"build", "use"} and set(catalog["split"]) == {
        "train",
        "heldout",
    }


def test_curate_stage_versions_the_tool_pool_and_the_next_rollout_calls_it(tmp_path):
    """The pipeline's pool: curate@01 harvests round 01's successful builds into
    data/curated/round_01/tool_pool.json with the three axes in its metrics; round 02's state
    reads it back and the rollout binds it; a damaged file names itself and its stage."""
    from rollwise.artifacts import CorruptArtifact
    from rollwise.config import Params, rounds_dict
    from rollwise.envs.custom import generate_custom
    from rollwise.envs.runtime import load_suite
    from rollwise.loop import bind_tools
    from tasks import curate
    from tasks.common import round_state
    from tests.test_curate import frames, run_script, write_rollouts

    envs = Params().envs.model_copy(update={"custom": "rollwise.envs.toolsmith:toolsmith"})
    generate_custom(envs, tmp_path / "envs")
    suite = load_suite(tmp_path / "envs")
    family = FAMILIES["clamp"]
    task = suite.tasks["clamp-build-0"]
    suite.envs[task.env_id].audit = []  # run_script reads a synthetic env's fault audit: none
    define = lambda code: [ToolCall("define_tool", {"schema": family.schema(), "code": code})]  # noqa: E731
    right = run_script(suite, task, 0, define(family.source()), "done", "r01/right")
    recalled = define(FAMILIES[family.sibling].source())  # the sibling's rule: fails, unoffered
    wrong = run_script(suite, task, 1, recalled, "done", "r01/wrong")
    assert right[0]["success"] and not wrong[0]["success"]
    episodes, steps = frames([right, wrong])
    write_rollouts(tmp_path, tmp_path / "envs", episodes, steps)
    metrics = curate.run(Params(rounds=rounds_dict(2), envs=envs), tmp_path, "01")
    rubrics = [json.loads(e[0]["rubric"]) for e in (right, wrong)]
    for axis in ("schema_valid", "examples_pass", "answer_correct"):
        assert metrics[axis] == pytest.approx(sum(r[axis] for r in rubrics) / 2)
    assert (metrics["tools_submitted"], metrics["tools_admitted"], metrics["tools_built"]) == (
        1, 1, 1)  # fmt: skip
    path = tmp_path / "data" / "curated" / "round_01" / "tool_pool.json"
    state = round_state(tmp_path, "01", "curate")
    assert [t.origin for t in state.tools.built()] == ["round 1 episode r01/right"]
    assert state.tools.code("clamp") == family.source()
    bind_tools(suite, state.tools, "local")
    assert all(env.pool is state.tools for env in suite.envs.values())
    with pytest.raises(ValueError, match="rollout.executor 'ray'"):
        bind_tools(suite, state.tools, "ray")
    path.write_text("{not json")
    with pytest.raises(CorruptArtifact, match="tool_pool.json") as err:
        round_state(tmp_path, "01", "curate")
    assert "curate@01" in str(err.value)
