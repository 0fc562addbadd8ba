"""The rollout engine: token-exact multi-turn episodes, every termination reason, tool timeouts,
reproducibility, and the cost of a round."""

from __future__ import annotations

import dataclasses
import json
import time

import pandas as pd
import pytest

from rollwise.config import CostConfig
from rollwise.policy.chat import encode, parse_action, prompt_ids
from rollwise.policy.hf import Completion, HFBackend
from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes
from tests.helpers import assert_same_episodes, scripted_policy
from tests.test_chat import action_text, check_episode_masks, one_task_per_kind


@pytest.fixture(scope="module")
def policy():
    return scripted_policy()


class ScriptBackend:
    """A scripted policy: turn k of an episode is script(prompt text)[k], cut to max_new_tokens
    as a model would be (not stopped when cut)."""

    def __init__(self, tok, script):
        self.tok, self.script = tok, script

    def generate(
        self, prompts, max_new_tokens, temperature=1.0, greedy=False, seed=None, top_p=1.0
    ):
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            turn = self.script(text)[text.count("<|im_start|>assistant") - 1]
            ids = encode(self.tok, turn)
            cut = ids[:max_new_tokens]
            out.append(Completion(cut, [-0.25] * len(cut), stopped=len(cut) == len(ids)))
        return out


def oracle_script(tasks):
    """Each task's oracle turns (one call per turn, then the answer), found by its prompt."""
    turns = {
        t.prompt: [action_text([c]) for c in t.oracle] + [action_text(answer=t.answer)]
        for t in tasks
    }
    return lambda text: next(v for k, v in turns.items() if f"user\n{k}<|im_end|>" in text)


class Troubled:
    """A real environment with trouble injected: the n-th call sleeps, reset or verify raise."""

    def __init__(self, env, sleep_s: dict[int, float] | None = None, fail: str = ""):
        self.env, self.sleep_s, self.fail, self.calls = env, sleep_s or {}, fail, 0

    def tools(self):
        return self.env.tools()

    def reset(self, task, seed):
        if self.fail == "reset":
            raise RuntimeError("database down")
        return self.env.reset(task, seed)

    def step(self, call):
        self.calls += 1
        time.sleep(self.sleep_s.get(self.calls, 0.0))
        return self.env.step(call)

    def fingerprint(self):
        return self.env.fingerprint()

    def verify(self, answer, calls):
        if self.fail == "verify":
            raise RuntimeError("verifier down")
        return self.env.verify(answer, calls)


def specs_for(suite, tasks, wrap=lambda env: env, samples: int = 1) -> list[EpisodeSpec]:
    return [
        EpisodeSpec(f"{t.task_id}/s{k}", t, wrap(clone_env(suite.envs[t.env_id])), t.task_id, k, k)
        for t in tasks
        for k in range(samples)
    ]


def multi_call_tasks(suite, n: int = 3):
    tasks = [t for t in suite.split("train") if len(t.oracle) >= 2][:n]
    assert tasks, "the suite has no multi-call task"
    return tasks


def rendered(tok, suite, task, ep: dict, steps: list[dict]) -> str:
    """The episode as the tokenizer's chat template renders it as text: the opening messages,
    each assistant turn, and each observation as a tool message."""
    env = clone_env(suite.envs[task.env_id])
    messages = env.reset(task, 0)
    ids, spans = ep["token_ids"], ep["turn_spans"]
    for k, (s, e) in enumerate(spans):
        text = tok.decode(ids[s:e])
        messages.append({"role": "assistant", "content": text.removesuffix("<|im_end|>")})
        observed = [st["observation"] for st in steps if st["span_start"] == s]
        if not observed and parse_action(text).error:
            observed = [json.dumps({"error": parse_action(text).error})]
        if k < len(spans) - 1 or ep["termination"] == "max_turns":
            messages += [{"role": "tool", "content": o} for o in observed]
    cue = ep["termination"] == "max_turns"  # the sequence ends on the next assistant cue
    text = tok.apply_chat_template(
        messages, tools=[t.to_openai() for t in env.tools()], add_generation_prompt=cue,
        tokenize=False,
    )  # fmt: skip
    return text if cue else text.removesuffix("\n")  # it ends on the answer's <|im_end|>


# ------------------------------------------------------------------------------ token exactness


def test_scripted_multi_turn_episodes_are_the_rendered_conversation(policy):
    suite, tok = policy.suite, policy.tokenizer
    tasks = list(
        {t.task_id: t for t in multi_call_tasks(suite) + one_task_per_kind(suite)}.values()
    )
    backend = ScriptBackend(tok, oracle_script(tasks))
    episodes, steps = run_episodes(specs_for(suite, tasks), backend, tok, Limits(max_context=512))
    for ep, task in zip(episodes, tasks, strict=True):
        assert ep["termination"] == "answer" and ep["success"], ep["rubric"]
        assert ep["turns"] == len(task.oracle) + 1 >= 2
        mine = [s for s in steps if s["episode_id"] == ep["episode_id"]]
        assert tok.decode(ep["token_ids"]) == rendered(tok, suite, task, ep, mine)
        env = clone_env(suite.envs[task.env_id])
        prompt = prompt_ids(tok, env.reset(task, 0), env.tools())
        assert check_episode_masks(ep, tok, prompt) > 0
        policy_text = tok.decode(
            [i for i, m in zip(ep["token_ids"], ep["loss_mask"], strict=True) if m]
        )
        assert policy_text == "".join(oracle_script([task])(f"user\n{task.prompt}<|im_end|>"))


def test_sampled_multi_turn_episodes_are_the_rendered_conversation(policy):
    """The SFT'd tiny model at temperature: valid, wrong and malformed calls, all exact."""
    suite, tok = policy.suite, policy.tokenizer
    tasks = suite.split("train")[:8]
    limits = Limits(max_turns=3, max_new_tokens=40, max_context=512, temperature=0.7, seed=1)
    episodes, steps = run_episodes(
        specs_for(suite, tasks, samples=2), HFBackend(policy.model, tok), tok, limits
    )
    checked = 0
    for ep in episodes:
        task = suite.tasks[ep["task_id"]]
        mine = [s for s in steps if s["episode_id"] == ep["episode_id"]]
        calls_per_turn = pd.Series([s["span_start"] for s in mine]).value_counts()
        if ep["termination"] not in ("answer", "max_turns") or (calls_per_turn > 1).any():
            continue  # a cut turn or a multi-call turn has no one-message rendering
        assert tok.decode(ep["token_ids"]) == rendered(tok, suite, task, ep, mine)
        checked += ep["turns"] > 1
    assert checked >= 4, "too few multi-turn episodes: the test checked little"
    assert {s["observation_kind"] for s in steps} >= {"ok", "tool_error"}


# ------------------------------------------------------------------------------ terminations


def run_scripted(policy, tasks, limits, script=None, wrap=lambda env: env):
    backend = ScriptBackend(policy.tokenizer, script or oracle_script(tasks))
    specs = specs_for(policy.suite, tasks, wrap)
    return run_episodes(specs, backend, policy.tokenizer, limits)


def test_every_limit_ends_the_episode_with_its_own_reason(policy):
    tasks = multi_call_tasks(policy.suite, 1)
    tok = policy.tokenizer
    (ep,), _ = run_scripted(policy, tasks, Limits(max_turns=1))
    assert ep["termination"] == "max_turns" and ep["turns"] == 1 and ep["tool_calls"] == 1

    (ep,), _ = run_scripted(policy, tasks, Limits(max_new_tokens=3))
    assert ep["termination"] == "max_tokens" and ep["generated_tokens"] == 3

    prompt_len = run_scripted(policy, tasks, Limits(max_turns=1))[0][0]["prompt_len"]
    (ep,), _ = run_scripted(policy, tasks, Limits(max_context=prompt_len + 5))
    assert ep["termination"] == "context" and len(ep["token_ids"]) == prompt_len + 5
    assert ep["generated_tokens"] == 5  # the turn's room was the context's, not max_new_tokens

    first_turn = len(encode(tok, action_text([tasks[0].oracle[0]])))
    limits = Limits(max_context=prompt_len + first_turn + 4)  # the observation will not fit
    (ep,), steps = run_scripted(policy, tasks, limits)
    assert ep["termination"] == "context" and ep["tool_calls"] == 1 and len(steps) == 1
    assert len(ep["token_ids"]) == prompt_len + first_turn  # ends on the call, no observation

    (ep,), _ = run_scripted(policy, tasks, Limits(max_context=prompt_len))
    assert ep["termination"] == "context" and ep["turns"] == 0


def test_environment_failures_end_with_env_error(policy):
    tasks = multi_call_tasks(policy.suite, 1)
    (ep,), _ = run_scripted(policy, tasks, Limits(), wrap=lambda e: Troubled(e, fail="reset"))
    assert ep["termination"] == "env_error" and ep["turns"] == 0 and ep["env_errors"] == 1
    (ep,), _ = run_scripted(policy, tasks, Limits(), wrap=lambda e: Troubled(e, fail="verify"))
    assert ep["termination"] == "env_error" and ep["reward"] == 0.0 and ep["verifier_calls"] == 0


def test_a_tool_that_raises_is_an_env_error_observation(policy):
    tasks = multi_call_tasks(policy.suite, 1)

    class Raising(Troubled):
        def step(self, call):
            raise OSError("disk")

    (ep,), steps = run_scripted(policy, tasks, Limits(), wrap=lambda e: Raising(e))
    assert ep["termination"] == "answer" and ep["env_errors"] == len(tasks[0].oracle)
    assert all(
        s["observation_kind"] == "env_error" and "OSError" in s["observation"] for s in steps
    )


# ------------------------------------------------------------------------------ tool timeouts


def test_a_tool_call_past_its_timeout_is_an_observation_and_the_episode_goes_on(policy):
    tasks = multi_call_tasks(policy.suite, 1)
    limits = Limits(tool_timeout_s=0.4)
    t0 = time.perf_counter()
    (ep,), steps = run_scripted(policy, tasks, limits, wrap=lambda e: Troubled(e, {1: 0.5}))
    assert time.perf_counter() - t0 < 5.0
    assert ep["termination"] == "answer" and ep["turns"] == len(tasks[0].oracle) + 1
    assert steps[0]["observation_kind"] == "env_error" and "timed out" in steps[0]["observation"]
    assert [s["observation_kind"] for s in steps[1:]] == ["ok"] * (len(steps) - 1)
    assert ep["env_errors"] == 1 and ep["verifier_calls"] == 1
    observed = policy.tokenizer.decode(ep["token_ids"][ep["turn_spans"][0][1] :])
    assert "timed out after 0.4 s" in observed  # the policy saw it


def test_a_call_still_running_blocks_the_state_until_it_returns(policy):
    """Later calls on the same state would race the hung one: they are env errors too, and the
    episode is not verified while it still runs."""
    tasks = multi_call_tasks(policy.suite, 1)
    limits = Limits(tool_timeout_s=0.2)
    (ep,), steps = run_scripted(policy, tasks, limits, wrap=lambda e: Troubled(e, {1: 3.0}))
    assert [s["observation_kind"] for s in steps] == ["env_error"] * len(tasks[0].oracle)
    assert "busy" in steps[1]["observation"]
    assert ep["termination"] == "env_error" and ep["verifier_calls"] == 0


def test_calls_after_a_timed_out_call_in_the_same_turn_are_not_run(policy):
    task = multi_call_tasks(policy.suite, 1)[0]
    both = action_text(list(task.oracle[:2]))  # two calls in one turn
    script = lambda text: [both, action_text(answer=task.answer)]  # noqa: E731
    wrap = lambda e: Troubled(e, {1: 0.3})  # noqa: E731
    limits = Limits(max_new_tokens=96, tool_timeout_s=0.2)  # room for both calls
    (ep,), steps = run_scripted(policy, [task], limits, script, wrap)
    assert [s["observation_kind"] for s in steps] == ["env_error", "env_error"]
    assert "timed out" in steps[0]["observation"] and "not run" in steps[1]["observation"]
    assert ep["termination"] == "answer"  # the hung call returned before verification


# ------------------------------------------------------------------------------ reproducibility


def test_same_plan_and_seeds_give_identical_episodes(policy):
    suite, tok = policy.suite, policy.tokenizer
    tasks = suite.split("train")[:6]
    limits = Limits(max_turns=3, max_new_tokens=40, max_context=512, temperature=1.0, top_p=0.9)
    backend = HFBackend(policy.model, tok)

    def roll(lim):
        return run_episodes(specs_for(suite, tasks, samples=2), backend, tok, lim)

    (a, a_steps), (b, b_steps) = roll(limits), roll(limits)
    assert_same_episodes(a, b)
    assert a_steps == b_steps and a_steps
    c, _ = roll(dataclasses.replace(limits, seed=limits.seed + 1))
    assert [e["token_ids"] for e in c] != [e["token_ids"] for e in a]  # the seed matters
    assert len({tuple(e["token_ids"]) for e in a}) > len(a) // 2, "samples barely differ"


# ------------------------------------------------------------------------------ cost


def test_episode_cost_prices_every_cost_column():
    from rollwise.rollout.cost import episode_costs
    from tasks.rollout import rollout_metrics

    episodes = pd.DataFrame(
        {"prompt_tokens": [1000, 3000], "generated_tokens": [500, 0], "tool_calls": [2, 0],
         "verifier_calls": [1, 1], "tool_errors": [0, 0], "env_errors": [0, 1],
         "reward": [1.0, 0.0], "success": [True, False], "group": ["g", "g"]}
    )  # fmt: skip
    prices = CostConfig(
        per_1k_prompt_tokens=0.1, per_1k_generated_tokens=0.4, per_tool_call=0.01,
        per_verifier_call=0.05,
    )  # fmt: skip
    episodes["cost"] = episode_costs(episodes, prices)
    assert episodes["cost"].tolist() == pytest.approx([0.1 + 0.2 + 0.02 + 0.05, 0.3 + 0.05])
    assert rollout_metrics(episodes)["cost"] == pytest.approx(0.72)
    free = episode_costs(episodes, CostConfig(**dict.fromkeys(CostConfig.model_fields, 0.0)))
    assert free.sum() == 0.0
