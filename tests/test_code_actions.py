"""Code actions (rollout.action_mode: code): the fenced format parsed as data, and a code-mode
episode through the real engine: token-exact, loss mask on the policy's turns only, every tool
call the code made a recorded step with its fingerprints, scored by the same verifier."""

from __future__ import annotations

import json

import pytest

from rollwise.envs.runtime import load_suite
from rollwise.policy.build import train_tokenizer
from rollwise.policy.chat import (
    CODE_FORMAT,
    code_action_text,
    code_messages,
    encode,
    observation_text,
    parse_code_action,
    prompt_ids,
)
from rollwise.rollout.code import oracle_code
from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes
from rollwise.types import Observation
from tests.helpers import make_suite
from tests.test_chat import check_episode_masks
from tests.test_engine import ScriptBackend

CODE = Limits(action_mode="code", max_new_tokens=200, max_context=4096, greedy=True)
HOSTILE = code_action_text("import os\nos.system('echo pwned')")


def test_parse_code_action():
    block = "```python\nx = find(name='a')\nx\n```<|im_end|>"
    assert parse_code_action(block).code == "x = find(name='a')\nx\n"
    assert parse_code_action("thinking first\n```py\n1 + 1\n```").code == "1 + 1\n"
    assert parse_code_action("  lamp <|im_end|>").answer == "lamp"
    assert "unbalanced" in parse_code_action("```python\nx = 1\n").error
    assert "one code block" in parse_code_action("```\n1\n```\n```\n2\n```").error
    assert "code mode" in parse_code_action('<tool_call>{"name": "f"}</tool_call>').error


def test_code_messages_list_the_tools_as_functions(tmp_path):
    make_suite(tmp_path)
    suite = load_suite(tmp_path)
    task = suite.split("train")[0]
    env = clone_env(suite.envs[task.env_id])
    messages = code_messages(env.reset(task, 0), env.tools())
    system = messages[0]["content"]
    assert system.startswith("You are the") and CODE_FORMAT in system
    assert all(f"{t.name}(" in system for t in env.tools())
    assert messages[1:] == env.reset(task, 0)[1:]


@pytest.fixture(scope="module")
def code_run(tmp_path_factory):
    """Each train task of a small suite, solved by a scripted code-mode oracle."""
    root = tmp_path_factory.mktemp("code")
    make_suite(root)
    suite = load_suite(root)
    tasks = [t for t in suite.split("train") if len(t.oracle) > 1][:6]
    turns = {t.prompt: [code_action_text(oracle_code(list(t.oracle))), t.answer + "<|im_end|>"]
             for t in tasks}  # fmt: skip
    corpus = [HOSTILE, "Error: ImportError", *(x for v in turns.values() for x in v)]
    scratch = train_tokenizer([])
    for t in tasks:  # every word of the rendered episode a token (the script finds turns by text)
        env = clone_env(suite.envs[t.env_id])
        opening = code_messages(env.reset(t, 0), env.tools())
        corpus += [scratch.apply_chat_template(opening, tokenize=False, add_generation_prompt=True)]
        corpus += [env.step(c).content for c in t.oracle]
    tok = train_tokenizer(corpus)

    def script(text):
        return next(v for k, v in turns.items() if f"user\n{k}<|im_end|>" in text)

    specs = [EpisodeSpec(f"e{i}", t, clone_env(suite.envs[t.env_id]), seed=i)
             for i, t in enumerate(tasks)]  # fmt: skip
    episodes, steps = run_episodes(specs, ScriptBackend(tok, script), tok, CODE)
    return suite, tok, tasks, episodes, steps


def test_a_code_mode_episode_succeeds_under_the_same_verifier(code_run):
    _, _, tasks, episodes, steps = code_run
    for task, ep in zip(tasks, episodes, strict=True):
        assert (ep["termination"], ep["success"], ep["turns"]) == ("answer", True, 2)
        mine = [s for s in steps if s["episode_id"] == ep["episode_id"]]
        assert [s["tool"] for s in mine] == [c.name for c in task.oracle]
        assert [json.loads(s["arguments"]) for s in mine] == [c.arguments for c in task.oracle]
        assert ep["tool_calls"] == len(task.oracle) and ep["tool_errors"] == 0
        for a, b in zip(mine, mine[1:], strict=False):  # fingerprints chain call to call
            assert a["fingerprint_after"] == b["fingerprint_before"] != "unavailable"
        assert {(s["span_start"], s["span_end"]) for s in mine} == {tuple(ep["turn_spans"][0])}


def test_a_code_mode_episode_is_token_exact_with_its_loss_mask(code_run):
    suite, tok, tasks, episodes, steps = code_run
    for task, ep in zip(tasks, episodes, strict=True):
        env = clone_env(suite.envs[task.env_id])
        opening = code_messages(env.reset(task, 0), env.tools())
        prompt = prompt_ids(tok, opening, [])
        check_episode_masks(ep, tok, prompt)
        ids, (code_span, answer_span) = ep["token_ids"], ep["turn_spans"]
        code = code_action_text(oracle_code(list(task.oracle)))
        assert ids[slice(*code_span)] == encode(tok, code)
        last = [s for s in steps if s["episode_id"] == ep["episode_id"]][-1]
        shown = repr(json.loads(last["observation"]))  # the last call's value, not the others
        obs = ids[code_span[1] : answer_span[0]]
        assert obs == encode(tok, observation_text(tok, [Observation(shown)]))
        messages = [*opening, {"role": "assistant", "content": code.removesuffix("<|im_end|>")},
                    {"role": "tool", "content": shown},
                    {"role": "assistant", "content": task.answer}]  # fmt: skip
        rendered = tok.apply_chat_template(messages, tokenize=False)
        assert tok.decode(ids) == rendered.removesuffix("\n")


def test_grounded_blocks_write_what_a_policy_could_know():
    """A value the question names: a literal; a value an earlier call returned: a path into that
    call's variable (a list's element picked by a field the question names); a value returned
    but unreachable by such a path: a block a call, each result shown."""
    from rollwise.rollout.code import grounded_blocks
    from rollwise.types import ToolCall as Call

    calls = [Call("find_customer", {"name": "wanda"}), Call("list_orders", {"customer_id": 7}),
             Call("get_order", {"order_id": 98})]  # fmt: skip
    results = ['{"customer_id": 7, "name": "wanda"}',
               '[{"order_id": 97, "product": "lamp"}, {"order_id": 98, "product": "rug"}]',
               '{"order_id": 98, "amount": 3}']  # fmt: skip
    (block,) = grounded_blocks(calls, results, "What is the amount of the rug order of Wanda?")
    assert block == (
        "r0 = find_customer(name='wanda')\n"
        "r1 = list_orders(customer_id=r0['customer_id'])\n"
        "get_order(order_id=[x for x in r1 if x['product'] == 'rug'][0]['order_id'])"
    )
    unnamed = grounded_blocks(calls, results, "What is the amount of the newest order of wanda?")
    assert unnamed == [oracle_code([c]) for c in calls]  # which order: only its result says


def test_grounded_demo_code_makes_exactly_the_oracles_calls(tmp_path):
    """Every train task's demo code, run in the sandbox, makes the oracle's calls, in order."""
    from rollwise.rollout.code import execute_code, grounded_blocks
    from rollwise.train.sft import dry_run

    make_suite(tmp_path)
    suite = load_suite(tmp_path)
    single = 0
    for task in [t for t in suite.split("train") if t.oracle]:
        env = clone_env(suite.envs[task.env_id])
        env.reset(task, 0)
        calls = list(task.oracle)
        blocks = grounded_blocks(calls, dry_run(task, env, calls), task.prompt)
        made = [r[0] for b in blocks for r in execute_code(env, b, CODE)[0]]
        assert [(c.name, c.arguments) for c in made] == [(c.name, c.arguments) for c in calls]
        single += len(blocks) == 1
    assert single > 0


def test_a_code_mode_warm_start_demo_is_the_engines_episode_token_for_token(code_run):
    """SFT in code mode (rollout.action_mode: code) trains on what a code-mode rollout of the
    demo's turns is: the same ids, the same mask; direct demos of the same tasks differ."""
    from rollwise.train.sft import oracle_sequence, oracle_texts
    from rollwise.train.warmstart import suite_tokenizer

    suite, _, tasks, _, _ = code_run
    tok = suite_tokenizer(suite, code=True)
    turns = {}
    for t in tasks:
        _, pieces = oracle_texts(t, clone_env(suite.envs[t.env_id]), tok, CODE)
        turns[t.prompt] = [action for action, _ in pieces]

    def script(text):
        return next(v for k, v in turns.items() if f"user\n{k}<|im_end|>" in text)

    specs = [EpisodeSpec(f"d{i}", t, clone_env(suite.envs[t.env_id]), seed=i)
             for i, t in enumerate(tasks)]  # fmt: skip
    episodes, _ = run_episodes(specs, ScriptBackend(tok, script), tok, CODE)
    for task, ep in zip(tasks, episodes, strict=True):
        ids, mask = oracle_sequence(task, clone_env(suite.envs[task.env_id]), tok, CODE)
        assert ep["success"] and (ids, mask) == (list(ep["token_ids"]), list(ep["loss_mask"]))
        direct, _ = oracle_sequence(task, clone_env(suite.envs[task.env_id]), tok)
        assert direct != ids


def test_the_warm_start_demonstrates_in_the_rollouts_action_mode(code_run):
    from rollwise.config import validate
    from rollwise.train.warmstart import demo_limits, demos_with_kinds

    suite, tok, _, _, _ = code_run
    for mode, fence in (("code", True), ("direct", False)):
        params = validate({"rollout": {"action_mode": mode}})
        seqs, _ = demos_with_kinds([suite], tok, 0.0, 0, demo_limits(params))
        texts = [tok.decode(ids) for ids, _ in seqs]
        assert all(("```python" in t) == fence and ("<tool_call>" in t) != fence for t in texts)


def test_code_mode_warm_starts_are_cached_apart_from_direct_ones():
    from rollwise.config import validate
    from rollwise.loop import warmstart_key

    direct, code = validate({}), validate({"rollout": {"action_mode": "code"}})
    assert warmstart_key(direct) != warmstart_key(code)
    assert warmstart_key(direct) == warmstart_key(validate({"rollout": {"max_turns": 3}}))


def test_hostile_code_in_an_episode_is_a_tool_error_and_the_episode_goes_on(code_run):
    suite, tok, tasks, _, _ = code_run
    task = tasks[0]
    turns = [HOSTILE, task.answer + "<|im_end|>"]
    spec = EpisodeSpec("h", task, clone_env(suite.envs[task.env_id]))
    (ep,), steps = run_episodes([spec], ScriptBackend(tok, lambda _: turns), tok, CODE)
    assert steps == [] and ep["tool_errors"] == 1 and ep["termination"] == "answer"
    obs = tok.decode(ep["token_ids"][ep["turn_spans"][0][1] : ep["turn_spans"][1][0]])
    assert "Error: ImportError" in obs
    assert not ep["success"]  # the grounded read never happened


def test_evaluation_runs_in_the_evaluated_interface():
    """evaluate.action_mode, else the rollout's: a code-trained policy is evaluated in code
    unless asked otherwise, with the rollout's sandbox (loop.greedy_limits)."""
    from rollwise.config import validate
    from rollwise.loop import greedy_limits

    assert greedy_limits(validate({})).action_mode == "direct"
    assert greedy_limits(validate({"rollout": {"action_mode": "code"}})).action_mode == "code"
    across = validate({"rollout": {"action_mode": "code"}, "evaluate": {"action_mode": "direct"}})
    assert greedy_limits(across).action_mode == "direct"
    limits = greedy_limits(validate({"rollout": {"sandbox": {"cpu_s": 2}}}), max_turns=3)
    assert (limits.sandbox.cpu_s, limits.max_turns, limits.greedy) == (2, 3, True)
