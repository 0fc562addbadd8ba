"""Memory across episodes (issue 40): skill induction and expansion, evidence-driven retirement,
the validation gate of the meta-agent, and working memory's state. Episodes are hand-made
(oracle calls through the real runtime) or scripted through the real engine; no model."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from rollwise.curate.success_bank import trajectory
from rollwise.memory import bank as skill_bank
from rollwise.memory import meta, wrap
from rollwise.memory.skills import SkillConfig, drive, expand, induce
from rollwise.memory.working import render, state_of
from rollwise.policy.chat import encode
from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes
from rollwise.types import ToolCall
from tests.helpers import suite_and_tokenizer
from tests.test_chat import action_text
from tests.test_engine import ScriptBackend


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return suite_and_tokenizer(tmp_path_factory.mktemp("memory"))


def status_tasks(suite):
    """Train tasks of the find -> list -> get kind, grouped by environment (two per env)."""
    by_env: dict[str, list] = {}
    for t in suite.split("train"):
        if t.kind == "status":
            by_env.setdefault(t.env_id, []).append(t)
    return next(ts for ts in by_env.values() if len(ts) >= 2)


def run_calls(suite, task, calls, seed: int = 0, eid: str = "e0"):
    """(recorded (call, result) pairs, step rows) of calls run by hand on a fresh episode."""
    env = clone_env(suite.envs[task.env_id])
    env.reset(task, seed)
    pairs, rows = [], []
    for i, call in enumerate(calls):
        before = env.fingerprint()
        obs = env.step(call)
        pairs.append((call, obs.content))
        rows.append({"episode_id": eid, "step": i, "fingerprint_before": before,
                     "fingerprint_after": env.fingerprint(), "tool": call.name,
                     "arguments": json.dumps(call.arguments), "observation": obs.content,
                     "observation_kind": obs.kind, "span_start": 10 * i,
                     "span_end": 10 * i + 5})  # fmt: skip
    return pairs, rows


def scripted_episode(tok, task, env, script: list[str], eid: str, r: int):
    """(episodes, steps) of one episode of `task` in `env` whose turns are `script`, as round
    r's rollout (by policy version r-1) would have written them."""
    spec = EpisodeSpec(eid, task, env, task.task_id)
    limits = Limits(max_context=2048, max_new_tokens=96)
    eps, steps = run_episodes([spec], ScriptBackend(tok, lambda _: script), tok, limits)
    return pd.DataFrame(eps).assign(round=r, policy_version=r - 1), pd.DataFrame(steps)


def test_induction_from_a_hand_made_success(world):
    suite, _ = world
    task = status_tasks(suite)[0]
    pairs, _ = run_calls(suite, task, task.oracle)
    skill = induce(task.env_id, pairs)
    find, listing, get = task.oracle
    owner_key, record_key = next(iter(listing.arguments)), next(iter(get.arguments))
    item = next(i for i in json.loads(pairs[1][1]) if i[record_key] == get.arguments[record_key])
    product_key = next(k for k in item if k != record_key)
    # Ids are read from earlier results, never stored; only the prompt's values are arguments.
    assert [s["tool"] for s in skill.steps] == [c.name for c in task.oracle]
    assert skill.steps[0]["arguments"] == {"name": {"arg": "name"}}
    assert skill.steps[1]["arguments"] == {owner_key: {"from": 0, "key": owner_key}}
    assert skill.steps[2]["arguments"] == {
        record_key: {"from": 1, "key": record_key, "where": {product_key: {"arg": product_key}}}
    }
    assert skill.example == {"name": find.arguments["name"], product_key: item[product_key]}
    assert skill.spec().parameters["required"] == ["name", product_key]


def test_the_success_bank_induces_skills_and_marks_repairs(world):
    suite, _ = world
    task = status_tasks(suite)[0]
    _, rows = run_calls(suite, task, task.oracle, eid="r02/win")
    banked = pd.DataFrame([{"task_id": task.task_id, "env_id": task.env_id,
                            "episode_id": "r02/win", "round": 2,
                            "trajectory": json.dumps(trajectory(pd.DataFrame(rows)))}])  # fmt: skip
    history = pd.DataFrame({"episode_id": ["r01/lose", "r02/win"], "task_id": [task.task_id] * 2,
                            "round": [1, 2], "success": [False, True]})  # fmt: skip
    assert skill_bank.induced(banked, None, 2)["pathway"].tolist() == ["success"]
    table = skill_bank.induced(banked, history, 2)
    assert table["pathway"].tolist() == ["repair"] and table["status"].tolist() == ["active"]
    # the scheduler's history (a row per group): a failed sample in round 1 makes it a repair,
    # a failure only in the win's own round does not
    groups = pd.DataFrame({"round": [1, 2], "task_id": [task.task_id] * 2, "samples": [4, 4],
                           "successes": [1, 2]})  # fmt: skip
    assert skill_bank.induced(banked, groups, 2)["pathway"].tolist() == ["repair"]
    later = groups.assign(successes=[4, 2])
    assert skill_bank.induced(banked, later, 2)["pathway"].tolist() == ["success"]
    assert skill_bank.skill_of(table.iloc[0].to_dict()).steps[0]["tool"] == task.oracle[0].name
    twice = pd.concat([table, table.assign(round=3)], ignore_index=True)  # one skill, two rows
    assert skill_bank.add(skill_bank.empty(), twice)["round"].tolist() == [2]
    assert skill_bank.add(table, twice.assign(round=4))["round"].tolist() == [2]  # kept as was


def test_a_skills_expansion_equals_the_steps_it_abstracts(world):
    suite, _ = world
    first, second = status_tasks(suite)[:2]
    pairs, _ = run_calls(suite, first, first.oracle)
    skill = induce(first.env_id, pairs)
    env = clone_env(suite.envs[first.env_id])
    env.reset(first, 0)
    done, shown = drive(expand(skill, skill.example), env.step)
    assert [(c, o.content) for c, o in done] == pairs  # the same calls, the same results
    assert json.loads(shown.content)["results"] == [json.loads(p[1]) for p in pairs]
    # Another task of the kind: bound with its own values, the expansion is its own oracle.
    other = induce(second.env_id, run_calls(suite, second, second.oracle)[0])
    assert other.skill_id == skill.skill_id
    env.reset(second, 0)
    done, _ = drive(expand(skill, other.example), env.step)
    assert [c for c, _ in done] == list(second.oracle)
    assert env.verify(second.answer, [c for c, _ in done]).success


def test_a_skill_call_runs_through_the_engine_as_recorded_real_steps(world):
    suite, tok = world
    task = status_tasks(suite)[0]
    skill = induce(task.env_id, run_calls(suite, task, task.oracle)[0])
    script = [action_text([ToolCall(skill.name, skill.example)]), action_text(answer=task.answer)]
    env = wrap(clone_env(suite.envs[task.env_id]), [skill], working=True)
    spec = EpisodeSpec("e/skill", task, env, task.task_id)
    episodes, steps = run_episodes([spec], ScriptBackend(tok, lambda _: script), tok,
                                   Limits(max_context=2048, max_new_tokens=96))  # fmt: skip
    e = episodes[0]
    assert e["success"] and e["tool_calls"] == 3 and e["turns"] == 2
    assert [s["tool"] for s in steps] == [c.name for c in task.oracle]  # real calls, recorded
    assert len({s["span_start"] for s in steps}) == 1  # all under the turn that chose the skill
    assert all(s["fingerprint_before"] != "unavailable" for s in steps)
    assert skill.name in tok.decode(e["token_ids"], skip_special_tokens=False)
    # The progress note after the skill's turn is working memory folded from those steps.
    note = encode(tok, render(state_of(steps, suite.envs[task.env_id].tools())))
    ids = e["token_ids"]
    assert any(ids[i : i + len(note)] == note for i in range(len(ids)))
    calls = skill_bank.invocations(pd.DataFrame(episodes).assign(policy_version=0),
                                   pd.DataFrame(steps), tok)  # fmt: skip
    assert calls[["skill", "ok", "success"]].values.tolist() == [[skill.name, True, True]]


def row(skill, evidence: dict, last_used: int = 3, tag: str = "") -> dict:
    """A bank row of `skill` with this evidence; `tag` tells copies of one skill apart."""
    out = skill_bank.row_of(skill, "success", "e0", 0)
    return {**out, "skill_id": out["skill_id"] + tag, "name": out["name"] + tag,
            "evidence": json.dumps(evidence), "last_used": last_used}  # fmt: skip


def test_a_stale_skill_is_retired_on_evidence_and_a_fresh_one_kept(world):
    suite, _ = world
    task = status_tasks(suite)[0]
    skill = induce(task.env_id, run_calls(suite, task, task.oracle)[0])
    falling = {"0": [6, 6], "1": [4, 1], "2": [5, 0]}  # worked for version 0, fails since
    stale = {"0": [6, 6], "1": [4, 0], "2": [6, 0]}
    fresh = {"0": [4, 0], "2": [5, 5]}
    rows = [row(skill, falling, tag="a"), row(skill, stale, tag="b"), row(skill, fresh, tag="c")]
    cfg = SkillConfig()
    statuses = skill_bank.review(pd.DataFrame(rows), 3, 2, cfg)["status"].tolist()
    assert statuses == ["demoted", "retired", "active"]
    bank = pd.DataFrame(rows[1:], columns=skill_bank.SKILL_COLUMNS)
    assert skill_bank.review(bank, 3, 2, SkillConfig(mode="append"))["status"].tolist() == [
        "active", "active"]  # fmt: skip
    idle = pd.DataFrame([row(skill, fresh, last_used=0)], columns=skill_bank.SKILL_COLUMNS)
    assert skill_bank.review(idle, 3, 2, cfg)["status"].tolist() == ["retired"]
    # Evidence comes in per policy version; a retired skill is never exposed again.
    calls = pd.DataFrame([["e", task.env_id, task.task_id, 2, skill.name + "c", True, True]],
                         columns=skill_bank.INVOCATION_COLUMNS)  # fmt: skip
    recorded = skill_bank.record(bank, calls, 3)
    assert json.loads(recorded.iloc[1]["evidence"])["2"] == [6, 6]
    assert recorded.iloc[0]["evidence"] == bank.iloc[0]["evidence"]  # not invoked: unchanged
    reviewed = skill_bank.review(recorded, 3, 2, cfg)
    assert reviewed["status"].tolist() == ["retired", "active"]
    assert len(skill_bank.exposed(reviewed, task.env_id, cfg)) == 1


def oracle_validator(suite, tasks, cfg):
    """A held-aside batch run by an oracle-argument policy: it solves a task iff the skill its
    oracle abstracts is exposed (it expands it and answers); its success rate."""

    def validate(bank: pd.DataFrame) -> float:
        wins = 0
        for task in tasks:
            env = clone_env(suite.envs[task.env_id])
            want = induce(task.env_id, run_calls(suite, task, task.oracle)[0])
            exposed = {s.skill_id for s in skill_bank.exposed(bank, task.env_id, cfg)}
            if want.skill_id in exposed:
                env.reset(task, 0)
                done, _ = drive(expand(want, want.example), env.step)
                wins += env.verify(task.answer, [c for c, _ in done]).success
        return wins / len(tasks)

    return validate


def test_the_meta_agent_keeps_an_update_only_if_validation_improves(world):
    suite, _ = world
    first, second = status_tasks(suite)[:2]
    pairs, rows = run_calls(suite, first, first.oracle, eid="r01/win")
    skill = induce(first.env_id, pairs)
    bank = pd.DataFrame([row(skill, {})], columns=skill_bank.SKILL_COLUMNS)
    # A failed episode whose skill call hit an error: diagnosed stale, proposed for retirement.
    failed = pd.DataFrame([{"episode_id": "r01/lose", "env_id": first.env_id,
                            "task_id": first.task_id, "success": False}])  # fmt: skip
    calls = pd.DataFrame([["r01/lose", first.env_id, first.task_id, 0, skill.name, False, False]],
                         columns=skill_bank.INVOCATION_COLUMNS)  # fmt: skip
    diagnoses = meta.localize(failed, pd.DataFrame(rows).iloc[:0], calls)
    assert diagnoses["cause"].tolist() == ["stale_skill"]
    updates = meta.propose(diagnoses, bank, pd.DataFrame(columns=["task_id"]), 1)
    assert [(u.action, u.skill_id) for u in updates] == [("retire", skill.skill_id)]
    validate = oracle_validator(suite, [second], SkillConfig())
    kept, log = meta.gate(bank, updates, validate)
    assert log[["before", "after", "kept"]].values.tolist() == [[1.0, 0.0, False]]
    assert kept["status"].tolist() == ["active"]  # rejected: the bank is unchanged
    # A missing skill with a banked success: the added skill lifts validation, so it is kept.
    empty = bank.iloc[:0]
    missing = meta.localize(failed, pd.DataFrame(rows).iloc[:0], calls.iloc[:0])
    assert missing["cause"].tolist() == ["missing_skill"]
    banked = pd.DataFrame([{"task_id": first.task_id, "env_id": first.env_id,
                            "episode_id": "r01/win",
                            "trajectory": json.dumps(trajectory(pd.DataFrame(rows)))}])  # fmt: skip
    kept, log = meta.gate(empty, meta.propose(missing, empty, banked, 2), validate)
    assert log[["action", "kept"]].values.tolist() == [["add", True]]
    assert kept["skill_id"].tolist() == [skill.skill_id]


def test_working_memory_state_after_a_hand_made_episode(world):
    suite, _ = world
    task = status_tasks(suite)[0]
    find, listing, get = task.oracle
    owner_key, record_key = next(iter(listing.arguments)), next(iter(get.arguments))
    bad = ToolCall(get.name, {record_key: 999999})  # not found: a tool error
    pairs, rows = run_calls(suite, task, [find, listing, bad])
    tools = suite.envs[task.env_id].tools()
    state = state_of(rows, tools)
    listed = [i[record_key] for i in json.loads(pairs[1][1])]
    assert state.found == {owner_key: [listing.arguments[owner_key]], record_key: listed}
    owner = listing.arguments[owner_key]
    assert state.done == [f"{find.name}(name:{find.arguments['name']})",
                          f"{listing.name}({owner_key}:{owner})"]  # fmt: skip
    assert len(state.failed) == 1 and state.failed[0].startswith(f"{get.name}({record_key}:999999)")
    assert state.needed == []  # every id argument of the tools left is in hand
    assert state_of(rows[:1], tools).needed == [record_key]
    # A wrong id where results offered others: the meta-agent reads it as progress misread.
    assert meta.misread(rows) and not meta.misread(rows[:2])


def test_the_round_carries_the_skill_bank_from_curate_to_the_next_rollout(world):
    """rollout.memory in the round (loop.py): curate@1 induces a skill from a verified success,
    the next rollout offers it as a tool, and its invocation there is curate@2's evidence."""
    from rollwise.config import validate
    from rollwise.loop import RoundState, curate, remembering

    suite, tok = world
    task = status_tasks(suite)[0]
    params = validate({"rollout": {"memory": {"skills": "managed", "working": True}}})

    def episode(env, script, eid: str, r: int):
        return scripted_episode(tok, task, env, script, eid, r)

    oracle = [action_text([c]) for c in task.oracle] + [action_text(answer=task.answer)]
    episodes, steps = episode(clone_env(suite.envs[task.env_id]), oracle, "r01/a", 1)
    first = curate(params, suite, episodes, steps, RoundState(), 1, tok)
    bank = first.tables["skill_bank"]
    assert (len(bank), first.metrics["skills"], first.metrics["skill_calls"]) == (1, 1, 0)

    env = remembering(params, bank)(clone_env(suite.envs[task.env_id]), task.env_id)
    (skill,) = [
        t for t in env.tools() if t.name not in {u.name for u in suite.envs[task.env_id].tools()}
    ]
    assert skill.name == bank["name"].iloc[0] and callable(env.progress)
    example = json.loads(bank["example"].iloc[0])
    script = [action_text([ToolCall(skill.name, example)]), action_text(answer=task.answer)]
    episodes, steps = episode(env, script, "r02/a", 2)
    second = curate(params, suite, episodes, steps, RoundState(skills=bank), 2, tok)
    assert second.metrics["skill_calls"] == 1 and second.metrics["skill_call_success"] == 1.0
    assert json.loads(second.tables["skill_bank"]["evidence"].iloc[0]) == {"1": [1, 1]}

    off = validate({})
    plain = clone_env(suite.envs[task.env_id])
    assert remembering(off, bank)(plain, task.env_id) is plain
    ray = validate({"rollout": {"memory": {"working": True}, "executor": "ray"}})
    with pytest.raises(ValueError, match="rollout.memory travels only with the local executor"):
        remembering(ray, bank)


def test_the_curate_stage_writes_the_skill_bank_and_the_next_round_reads_it(world, tmp_path):
    """data/curated/round_NN/skill_bank.parquet: a DVC output per round, read back as the next
    round's state; the stage reads skill calls with the rollout policy's tokenizer."""
    from rollwise.config import rounds_dict, validate
    from rollwise.schedule.history import extend, observe, to_state
    from tasks import curate
    from tasks.common import round_state
    from tasks.warmstart import initial_states
    from tests.helpers import make_suite

    suite, tok = world
    task = status_tasks(suite)[0]
    make_suite(tmp_path / "data" / "envs")
    initial_states(tmp_path)
    tok.save_pretrained(tmp_path / "models" / "round_00")
    oracle = [action_text([c]) for c in task.oracle] + [action_text(answer=task.answer)]
    spec = EpisodeSpec("r01/a", task, clone_env(suite.envs[task.env_id]), task.task_id)
    eps, steps = run_episodes([spec], ScriptBackend(tok, lambda _: oracle), tok,
                              Limits(max_context=2048, max_new_tokens=96))  # fmt: skip
    rollouts = tmp_path / "data" / "rollouts" / "round_01"
    rollouts.mkdir(parents=True)
    episodes = pd.DataFrame(eps).assign(round=1, policy_version=0)
    episodes.to_parquet(rollouts / "episodes.parquet")
    pd.DataFrame(steps).to_parquet(rollouts / "steps.parquet")
    # the scheduler's history as rollout@01 writes it, with this task failed in an earlier round
    failed = observe(episodes, 0).assign(successes=0)
    state = to_state(extend(failed, observe(episodes, 1)))
    (rollouts / "scheduler_state.json").write_text(json.dumps(state))
    params = validate({"rounds": rounds_dict(2), "rollout": {"memory": {"skills": "append"}}})
    metrics = curate.run(params, tmp_path, "01")
    written = pd.read_parquet(tmp_path / "data" / "curated" / "round_01" / "skill_bank.parquet")
    assert metrics["skills"] == len(written) == 1
    assert written["pathway"].tolist() == ["repair"] and metrics["skills_repair"] == 1
    state = round_state(tmp_path, "01", "curate")
    assert state.skills["skill_id"].tolist() == written["skill_id"].tolist()


def test_the_meta_agent_runs_in_the_round_gated_by_the_rounds_policy(world):
    """rollout.memory.meta_tasks: curate localizes round 2's failure (its skill call did not
    run clean: a stale skill), proposes retiring the skill, and keeps that only if the round's
    policy solves more held-aside train tasks without it. A policy that succeeds only where the
    skill is offered rejects the retirement; one the skill misleads keeps it. Scripted policies
    stand in for the model (the gate reads any backend's greedy success). A demotion only
    reorders what is offered (bank.exposed), so it can change validation only past per_env."""
    from rollwise.config import ParamsError, validate
    from rollwise.loop import RoundState, curate, remembering

    suite, tok = world
    task = status_tasks(suite)[0]
    params = validate({"rollout": {"memory": {"skills": "managed", "meta_tasks": 64}}})

    def episode(env, script, eid: str, r: int):
        return scripted_episode(tok, task, env, script, eid, r)

    oracle = [action_text([c]) for c in task.oracle] + [action_text(answer=task.answer)]
    episodes, steps = episode(clone_env(suite.envs[task.env_id]), oracle, "r01/a", 1)
    plain = validate({"rollout": {"memory": {"skills": "managed"}}})  # round 1: no meta-agent
    bank = curate(plain, suite, episodes, steps, RoundState(), 1, tok).tables["skill_bank"]
    name = bank["name"].iloc[0]
    env = remembering(params, bank)(clone_env(suite.envs[task.env_id]), task.env_id)
    example = json.loads(bank["example"].iloc[0])
    wrong = {k: "no such thing" for k in example}  # its first step finds nothing
    script = [action_text([ToolCall(name, wrong)]), action_text(answer="unknown")]
    episodes, steps = episode(env, script, "r02/a", 2)
    turns = {t.prompt: [action_text([c]) for c in t.oracle] + [action_text(answer=t.answer)]
             for t in suite.split("train")}  # fmt: skip

    def policy(solves_with_skill: bool) -> ScriptBackend:
        def script(text: str) -> list[str]:
            oracle = next(v for k, v in turns.items() if f"user\n{k}<|im_end|>" in text)
            offered = f'"{name}"' in text or f"{name}(" in text
            return oracle if offered == solves_with_skill else [action_text(answer="unknown")]

        return ScriptBackend(tok, script)

    state = RoundState(skills=bank)
    leaning = curate(params, suite, episodes, steps, state, 2, tok, policy(True))
    log = leaning.tables["meta_updates"]
    assert log[["action", "cause", "kept"]].values.tolist() == [["retire", "stale_skill", False]]
    assert log["before"][0] > log["after"][0]
    assert leaning.metrics["meta_stale_skill"] == 1 and leaning.metrics["meta_kept"] == 0
    assert leaning.tables["skill_bank"]["status"].tolist() == ["active"]
    misled = curate(params, suite, episodes, steps, state, 2, tok, policy(False))
    log = misled.tables["meta_updates"]
    assert log["kept"].tolist() == [True] and log["after"][0] > log["before"][0]
    assert misled.tables["skill_bank"]["status"].tolist() == ["retired"]
    assert misled.metrics["meta_validation"] == log["after"][0]

    with pytest.raises(ValueError, match="meta_tasks: curate needs the round's policy"):
        curate(params, suite, episodes, steps, state, 2, tok)
    with pytest.raises(ParamsError, match="rollout.memory.meta_tasks: 4 needs rollout.memory"):
        validate({"rollout": {"memory": {"skills": "append", "meta_tasks": 4}}})


def test_the_curate_stage_runs_the_meta_agent_with_the_rounds_policy(world, tmp_path):
    """With rollout.memory.meta_tasks the stage loads the round's policy (models/round_NN) for
    the gate and writes meta_updates.parquet. Here the failure's task has a banked success whose
    skill the bank already induced this round, so nothing is proposed and nothing validated."""
    from rollwise.config import rounds_dict, validate
    from rollwise.policy.build import build_model, save_policy
    from rollwise.schedule.history import observe, to_state
    from tasks import curate
    from tasks.warmstart import initial_states
    from tests.helpers import TINY_POLICY, make_suite

    suite, tok = world
    task = status_tasks(suite)[0]
    make_suite(tmp_path / "data" / "envs")
    initial_states(tmp_path)
    save_policy(build_model(tok, TINY_POLICY), tok, tmp_path / "models" / "round_00")
    oracle = [action_text([c]) for c in task.oracle] + [action_text(answer=task.answer)]
    scripts = {"r01/a": oracle, "r01/b": [action_text(answer="unknown")]}
    runs = [scripted_episode(tok, task, clone_env(suite.envs[task.env_id]), x, e, 1)
            for e, x in scripts.items()]  # fmt: skip
    rollouts = tmp_path / "data" / "rollouts" / "round_01"
    rollouts.mkdir(parents=True)
    episodes = pd.concat([e for e, _ in runs], ignore_index=True)
    episodes.to_parquet(rollouts / "episodes.parquet")
    pd.concat([s for _, s in runs], ignore_index=True).to_parquet(rollouts / "steps.parquet")
    (rollouts / "scheduler_state.json").write_text(json.dumps(to_state(observe(episodes, 1))))
    params = validate({"rounds": rounds_dict(2),
                       "rollout": {"memory": {"skills": "managed", "meta_tasks": 2}}})  # fmt: skip
    metrics = curate.run(params, tmp_path, "01")
    log = pd.read_parquet(tmp_path / "data" / "curated" / "round_01" / "meta_updates.parquet")
    assert list(log.columns) == meta.GATE_COLUMNS and len(log) == 0
    assert (metrics["meta_missing_skill"], metrics["meta_tried"], metrics["skills"]) == (1, 0, 1)


def test_a_skill_use_demo_calls_the_skill_its_oracle_abstracts(world):
    """warmstart.skill_demos: with the task's own skill offered, the demo is one call to it (the
    expansion's results are the oracle calls' results) then the answer; with only another skill
    offered, the oracle's own calls with the skill listed among the tools."""
    from rollwise.memory.skills import Skill
    from rollwise.train.sft import oracle_sequence, skill_sequence

    suite, tok = world
    task = status_tasks(suite)[0]
    env = suite.envs[task.env_id]
    pairs, _ = run_calls(suite, task, task.oracle)
    own = induce(task.env_id, pairs)

    def called(ids, mask) -> list[str]:
        acted = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
        return [json.loads(c)["name"] for c in re.findall(r"<tool_call>(.*?)</tool_call>", acted)]

    ids, mask = skill_sequence(task, env, tok, [own])
    assert called(ids, mask) == [own.name]
    assert tok.decode(ids).endswith(task.answer + tok.eos_token)
    results = [json.loads(r) for _, r in pairs]  # the real calls' results, in order
    assert json.dumps(results, separators=(",", ":")) in tok.decode(ids)

    other = Skill(own.env_id, own.params, own.steps[:1], own.example)  # fits no task here
    ids, mask = skill_sequence(task, env, tok, [other])
    assert called(ids, mask) == [c.name for c in task.oracle]
    assert f"{other.name}(" in tok.decode(ids)  # offered in the tool listing
    assert other.name not in tok.decode(oracle_sequence(task, env, tok)[0])


def test_skill_demos_offer_each_environments_common_skills_to_a_share_of_demos(world):
    from rollwise.config import ParamsError, validate
    from rollwise.loop import warmstart_key
    from rollwise.train.warmstart import demo_skills, demos_with_kinds

    suite, tok = world
    offered = demo_skills(suite, per_env=2)
    assert offered and all(0 < len(v) <= 2 for v in offered.values())
    plain, kinds = demos_with_kinds([suite], tok, 0.0, 0)
    skilled, skill_kinds = demos_with_kinds([suite], tok, 0.0, 0, skill_share=1.0, per_env=2)
    assert kinds == skill_kinds and len(plain) == len(skilled)
    calls = [tok.decode(ids).count("run_") for ids, _ in skilled]
    assert sum(c > 0 for c in calls) > 0  # some demos offer, and some call, a skill
    assert sum(tok.decode(ids).count("run_") for ids, _ in plain) == 0
    base = validate({})
    on = validate({"warmstart": {"skill_demos": 0.5}})
    wider = validate({"warmstart": {"skill_demos": 0.5}, "rollout": {"memory": {"per_env": 8}}})
    assert len({warmstart_key(base), warmstart_key(on), warmstart_key(wider)}) == 3
    assert warmstart_key(base) == warmstart_key(validate({"rollout": {"memory": {"per_env": 8}}}))
    with pytest.raises(ParamsError, match=r"warmstart\.skill_demos.*rollout\.action_mode"):
        validate({"warmstart": {"skill_demos": 0.5}, "rollout": {"action_mode": "code"}})
