"""Tool-call parsing and loss masks: SFT oracle sequences and real engine episodes."""

from __future__ import annotations

import pytest
import torch

from rollwise.policy.chat import (
    MAX_CALLS_PER_TURN,
    action_text,
    parse_action,
    prompt_ids,
)
from rollwise.types import ToolCall
from tests.helpers import TINY_POLICY, suite_and_tokenizer

# ------------------------------------------------------------------------------ parse_action


def test_valid_call():
    action = parse_action(
        '<tool_call>{"name": "get_order", "arguments": {"order_id": 7}}</tool_call>'
    )
    assert action.calls == [ToolCall("get_order", {"order_id": 7})]
    assert action.answer is None and action.error is None


def test_several_calls_in_order():
    text = (
        '<tool_call>{"name":"find_customer","arguments":{"name":"bob"}}</tool_call>\n'
        '<tool_call>{"name":"get_customer","arguments":{"customer_id":12}}</tool_call>'
    )
    action = parse_action(text)
    assert action.calls == [
        ToolCall("find_customer", {"name": "bob"}),
        ToolCall("get_customer", {"customer_id": 12}),
    ]
    assert action.error is None


def test_missing_arguments_default_to_empty_object():
    assert parse_action('<tool_call>{"name": "ping"}</tool_call>').calls == [ToolCall("ping", {})]


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('<tool_call>{"name": "x", "arguments": {}</tool_call>', "not valid JSON"),
        ("<tool_call>name=x</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "x", "arguments": {}}', "unbalanced"),
        ('{"name": "x", "arguments": {}}</tool_call>', "unbalanced"),
        (
            '<tool_call>{"name": "x", "arguments": [1, 2]}</tool_call>',
            "arguments must be an object",
        ),
        ('<tool_call>{"name": "x", "arguments": "{\\"a\\": 1}"}</tool_call>', "must be an object"),
        ('<tool_call>{"arguments": {}}</tool_call>', "expected"),
        ('<tool_call>["x", {}]</tool_call>', "expected"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "not valid JSON"),
    ],
)
def test_malformed_calls_become_errors(text: str, fragment: str):
    action = parse_action(text)
    assert action.error is not None and fragment in action.error
    assert action.calls == [] and action.answer is None


def test_one_bad_call_spoils_the_turn():
    good = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    action = parse_action(good + "<tool_call>{oops</tool_call>")
    assert action.error is not None and action.calls == []


def test_too_many_calls():
    call = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    assert parse_action(call * MAX_CALLS_PER_TURN).error is None
    assert "too many" in parse_action(call * (MAX_CALLS_PER_TURN + 1)).error


def test_plain_text_is_the_answer():
    action = parse_action("  vilnius \n")
    assert action.answer == "vilnius"
    assert action.calls == [] and action.error is None


def test_im_end_is_stripped():
    assert parse_action("vilnius<|im_end|>").answer == "vilnius"
    call = '<tool_call>{"name": "a", "arguments": {"k": 1}}</tool_call><|im_end|>'
    assert parse_action(call).calls == [ToolCall("a", {"k": 1})]
    assert parse_action("42</s>", eos="</s>").answer == "42"


def test_action_text_round_trips():
    calls = [ToolCall("find_patient", {"name": "ada"}), ToolCall("get_visit", {"visit_id": 3})]
    assert parse_action(action_text(calls)).calls == calls
    assert parse_action(action_text(answer="done")).answer == "done"


# ------------------------------------------------------------------------------ loss masks


@pytest.fixture(scope="module")
def suite_tok(tmp_path_factory):
    return suite_and_tokenizer(tmp_path_factory.mktemp("suite"))


def runs_of_ones(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of 1s."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def one_task_per_kind(suite):
    by_kind = {}
    for task in suite.tasks.values():
        by_kind.setdefault(task.kind, task)
    return list(by_kind.values())


def test_oracle_mask_is_exactly_the_assistant_tokens(suite_tok):
    from rollwise.train.sft import oracle_sequence

    suite, tok = suite_tok
    tasks = one_task_per_kind(suite)
    assert len(tasks) >= 4
    for task in tasks:
        env = suite.envs[task.env_id]
        ids, mask = oracle_sequence(task, env, tok)
        assert len(ids) == len(mask) and set(mask) == {0, 1}
        prompt = prompt_ids(tok, env.reset(task, seed=0), env.tools())
        assert ids[: len(prompt)] == prompt and not any(mask[: len(prompt)])

        runs = runs_of_ones(mask)
        expected = [action_text([c]) for c in task.oracle] + [action_text(answer=task.answer)]
        assert [tok.decode(ids[s:e]) for s, e in runs] == expected, task.task_id
        assert runs[-1][1] == len(ids)  # the sequence ends on the answer's <|im_end|>

        policy = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
        context = tok.decode([i for i, m in zip(ids, mask, strict=True) if not m])
        assert "<tool_call>" in policy and task.answer in policy
        system = env.reset(task, seed=0)[0]["content"]
        for never in ("<tool_response>", "<|im_start|>user", "<|im_start|>", system, "<tools>"):
            assert never not in policy, (task.task_id, never)
        assert context.count("<tool_response>") == len(task.oracle)
        assert "[UNK]" not in tok.decode(ids)


class BiasedLMHead:
    """Pushes an untrained model toward <tool_call> and <|im_end|>, so its turns end and
    (malformed) calls produce observations: every engine path runs with real sampling."""

    def __init__(self, model, tok):
        self.bias = torch.zeros(len(tok))
        self.bias[tok.convert_tokens_to_ids("<tool_call>")] = 7.0
        self.bias[tok.eos_token_id] = 6.0
        model.lm_head.register_forward_hook(lambda mod, inp, out: out + self.bias)


def check_episode_masks(ep: dict, tok, prompt: list[int]) -> int:
    """Mask invariants of one engine episode; returns its number of observation tokens."""
    ids, mask, logp = ep["token_ids"], ep["loss_mask"], ep["logprobs"]
    assert len(ids) == len(mask) == len(logp)
    assert ep["prompt_len"] == len(prompt) and ids[: len(prompt)] == prompt
    in_span = [0] * len(ids)
    for s, e in ep["turn_spans"]:
        assert len(prompt) <= s < e <= len(ids)
        in_span[s:e] = [1] * (e - s)
    assert mask == in_span  # mask 1 exactly on the generated turns
    assert all(lp == 0.0 for lp, m in zip(logp, mask, strict=True) if not m)
    assert all(lp <= 0.0 for lp in logp) and any(lp < 0.0 for lp in logp)
    assert ep["generated_tokens"] == sum(mask)
    assert ep["prompt_tokens"] == len(ids) - sum(mask)
    spans = ep["turn_spans"]
    gaps = [(a[1], b[0]) for a, b in zip(spans, spans[1:], strict=False)]
    if ep["termination"] == "max_turns" and spans:
        gaps.append((spans[-1][1], len(ids)))  # the last turn's observation, never answered
    for s, e in gaps:  # everything between two turns is an observation
        text = tok.decode(ids[s:e])
        assert text.startswith("\n<|im_start|>user\n<tool_response>"), text
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n"), text
        assert not any(mask[s:e])
    return sum(e - s for s, e in gaps)


def test_engine_episode_masks_with_tiny_model(suite_tok):
    from rollwise.policy.build import build_model
    from rollwise.policy.hf import HFBackend
    from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes

    suite, tok = suite_tok
    model = build_model(tok, TINY_POLICY)
    hook = BiasedLMHead(model, tok)
    assert hook.bias.abs().sum() > 0
    tasks = list(suite.tasks.values())[:6]
    specs = [
        EpisodeSpec(f"e{i}", t, clone_env(suite.envs[t.env_id]), group=t.task_id)
        for i, t in enumerate(tasks)
    ]
    limits = Limits(max_turns=3, max_new_tokens=12, max_context=384, seed=0)
    episodes, _ = run_episodes(specs, HFBackend(model, tok), tok, limits)
    observed = 0
    for ep, task in zip(episodes, tasks, strict=True):
        env = suite.envs[task.env_id]
        observed += check_episode_masks(ep, tok, prompt_ids(tok, env.reset(task, 0), env.tools()))
    assert observed > 0, "no episode produced an observation: the test checked nothing"
    assert {ep["termination"] for ep in episodes} >= {"max_turns", "answer"}


class OracleBackend:
    """A scripted policy: replays each task's oracle turns (task and turn read off the prompt)."""

    def __init__(self, tok, tasks):
        self.tok = tok
        self.turns = {
            t.prompt: [action_text([c]) for c in t.oracle] + [action_text(answer=t.answer)]
            for t in tasks
        }

    def generate(
        self, prompts, max_new_tokens, temperature=1.0, greedy=False, seed=None, top_p=1.0
    ):
        from rollwise.policy.hf import Completion

        out = []
        for p in prompts:
            text = self.tok.decode(p)
            (turns,) = [v for k, v in self.turns.items() if f"user\n{k}<|im_end|>" in text]
            ids = self.tok.encode(
                turns[text.count("<|im_start|>assistant") - 1], add_special_tokens=False
            )
            out.append(Completion(ids, [-0.5] * len(ids), stopped=True))
        return out


def test_engine_oracle_episode_masks_and_steps(suite_tok):
    from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes

    suite, tok = suite_tok
    tasks = one_task_per_kind(suite)
    backend = OracleBackend(tok, tasks)
    specs = [
        EpisodeSpec(f"o{i}", t, clone_env(suite.envs[t.env_id]), group=t.task_id)
        for i, t in enumerate(tasks)
    ]
    limits = Limits(max_turns=6, max_new_tokens=48, max_context=512)
    episodes, steps = run_episodes(specs, backend, tok, limits)
    for ep, task in zip(episodes, tasks, strict=True):
        assert ep["termination"] == "answer" and ep["success"], ep["rubric"]
        assert ep["reward"] == pytest.approx(1.0)
        assert ep["turns"] == len(task.oracle) + 1 and ep["tool_calls"] == len(task.oracle)
        env = suite.envs[task.env_id]
        prompt = prompt_ids(tok, env.reset(task, 0), env.tools())
        assert check_episode_masks(ep, tok, prompt) > 0
        policy = [i for i, m in zip(ep["token_ids"], ep["loss_mask"], strict=True) if m]
        assert tok.decode(policy) == "".join(backend.turns[task.prompt])
        mine = [s for s in steps if s["episode_id"] == ep["episode_id"]]
        assert [s["tool"] for s in mine] == [c.name for c in task.oracle]
        assert [[s["span_start"], s["span_end"]] for s in mine] == ep["turn_spans"][:-1]
        assert all(s["observation_kind"] == "ok" for s in mine)


def test_a_huge_integer_is_a_malformed_call_not_a_crash():
    text = '<tool_call>{"name": "get_owner", "arguments": {"id": ' + "9" * 5000 + "}}</tool_call>"
    assert "not valid JSON" in parse_action(text).error
