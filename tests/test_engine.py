"""The rollout engine: token-exact multi-turn episodes, every termination reason, tool timeouts,
reproducibility, and the cost of a round."""

from __future__ import annotations

import ast
import dataclasses
import json
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest

from rollwise.config import CostConfig, FaultsConfig, validate
from rollwise.policy.chat import encode, parse_action, prompt_ids
from rollwise.policy.hf import Completion, HFBackend
from rollwise.rollout.engine import (
    AUDIT_COLUMNS,
    EpisodeSpec,
    Limits,
    audit_row,
    clone_env,
    run_episodes,
    user_text,
)
from tests.helpers import SMALL_ENVS, assert_same_episodes, make_suite, scripted_policy
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


# ------------------------------------------------------------------------------ user turns


class TwoTurns(Troubled):
    """A real environment whose user speaks twice: after the first answer, `follow_up`; after
    the second, nothing. `fail="next_turn"` makes the user raise instead."""

    def __init__(self, env, follow_up: list[dict], fail: str = ""):
        super().__init__(env, fail=fail)
        self.follow_up = follow_up

    def reset(self, task, seed):
        self.answers = []  # per episode: created in reset (episodes run on copies)
        return super().reset(task, seed)

    def next_turn(self, answer):
        if self.fail == "next_turn":
            raise RuntimeError("user gone")
        self.answers.append(answer)
        return self.follow_up if len(self.answers) == 1 else None


def two_turn_run(policy, limits, follow_up=None, fail=""):
    """One multi-call task: its oracle turns and answer, the follow-up, the answer again."""
    task, other = multi_call_tasks(policy.suite, 2)
    follow_up = follow_up or [{"role": "user", "content": other.prompt}]  # in-vocabulary words
    again = action_text(answer=task.answer)
    script = lambda text: oracle_script([task])(text) + [again]  # noqa: E731
    wrap = lambda env: TwoTurns(env, follow_up, fail)  # noqa: E731
    specs = specs_for(policy.suite, [task], wrap)
    (ep,), steps = run_episodes(specs, ScriptBackend(policy.tokenizer, script), policy.tokenizer,
                                limits)  # fmt: skip
    return task, follow_up, specs[0].env, ep, steps, script


def test_a_second_user_turn_is_appended_token_exact_with_loss_mask_0(policy):
    tok = policy.tokenizer
    task, follow_up, env, ep, steps, script = two_turn_run(policy, Limits())
    n = len(task.oracle)
    assert ep["termination"] == "answer" and ep["turns"] == n + 2 and ep["success"]
    assert env.answers == [task.answer] * 2 and ep["answer"] == task.answer
    spans, ids, mask = ep["turn_spans"], ep["token_ids"], ep["loss_mask"]
    start, end = spans[n][1], spans[n + 1][0]  # after the first answer, before the second
    assert ids[start:end] == encode(tok, user_text(tok, follow_up))  # tokenized once, as is
    assert mask[start:end] == [0] * (end - start) and not any(ep["logprobs"][start:end])
    assert tok.decode(ids[start:end]) == (
        f"\n<|im_start|>user\n{follow_up[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
    )
    # The whole sequence is the chat template's rendering of the two-turn conversation.
    messages = clone_env(policy.suite.envs[task.env_id]).reset(task, 0)
    for call, step in zip(task.oracle, steps, strict=True):
        said = action_text([call]).removesuffix("<|im_end|>")
        messages += [{"role": "assistant", "content": said},
                     {"role": "tool", "content": step["observation"]}]  # fmt: skip
    messages += [{"role": "assistant", "content": task.answer}, *follow_up,
                 {"role": "assistant", "content": task.answer}]  # fmt: skip
    tools = [t.to_openai() for t in env.tools()]
    rendered_text = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    assert tok.decode(ids) == rendered_text.removesuffix("\n")
    policy_ids = [i for i, m in zip(ids, mask, strict=True) if m]
    assert tok.decode(policy_ids) == "".join(script(f"user\n{task.prompt}<|im_end|>"))


def test_user_turns_respect_the_limits_and_a_failing_user_is_an_env_error(policy):
    tok = policy.tokenizer
    task, follow_up, _, full, _, _ = two_turn_run(policy, Limits())
    n = len(task.oracle)
    answered = full["turn_spans"][n][1]  # the sequence's length at the first answer
    user_ids = encode(tok, user_text(tok, follow_up))

    _, _, _, ep, _, _ = two_turn_run(policy, Limits(max_turns=n + 1))  # no turn left to reply
    assert ep["termination"] == "max_turns" and ep["turns"] == n + 1
    assert ep["token_ids"] == full["token_ids"][: answered + len(user_ids)]

    _, _, _, ep, _, _ = two_turn_run(policy, Limits(max_context=answered + len(user_ids)))
    assert ep["termination"] == "context" and ep["token_ids"] == full["token_ids"][:answered]
    assert ep["answer"] == task.answer and ep["verifier_calls"] == 1

    _, _, _, ep, _, _ = two_turn_run(policy, Limits(), fail="next_turn")
    assert ep["termination"] == "env_error" and ep["env_errors"] == 1 and ep["turns"] == n + 1

    bad = [{"role": "assistant", "content": "words in the policy's mouth"}]
    _, _, _, ep, _, _ = two_turn_run(policy, Limits(), follow_up=bad)
    assert ep["termination"] == "env_error" and len(ep["token_ids"]) == answered


def test_the_audit_rides_beside_the_row_never_in_it(policy):
    """Injected faults come back per episode (for the rollout's audit table) without being a
    column of the episode table, and survive pickling (Ray returns rows pickled)."""
    import pickle

    tasks = multi_call_tasks(policy.suite, 2)

    class Noted(Troubled):
        def reset(self, task, seed):
            self.audit = [{"fault": "flaky_error", "step": 0}, {"fault": "flaky_error", "step": 1}]
            return super().reset(task, seed)

    episodes, _ = run_scripted(policy, tasks[:1], Limits(), wrap=lambda e: Noted(e))
    clean, _ = run_scripted(policy, tasks[1:], Limits())
    (row,) = pickle.loads(pickle.dumps(episodes))
    assert audit_row(row)["faults"] == ["flaky_error"] and audit_row(row)["injections"] == 2
    assert json.loads(audit_row(row)["detail"])[1] == {"fault": "flaky_error", "step": 1}
    assert audit_row(clean[0])["faults"] == [] and list(audit_row(row)) == AUDIT_COLUMNS
    table = pd.DataFrame(episodes + clean)
    assert not [c for c in table.columns if "audit" in c or "fault" in c]
    with pytest.raises(TypeError, match="engine's own row"):
        audit_row(dict(row))  # a row that lost its audit is never read as "no faults"


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


def test_kept_turns_and_shared_prefixes_roll_the_episodes_whole_prompts_do(policy):
    """The HF backend inside run_episodes prefills a group's prompt once and each later turn's
    new tokens only (keeping()); the episodes equal those of every prompt prefilled whole."""
    suite, tok = policy.suite, policy.tokenizer
    tasks = suite.split("train")[:4]
    limits = Limits(max_turns=4, max_new_tokens=40, max_context=512, temperature=1.0)

    def roll(backend):
        return run_episodes(specs_for(suite, tasks, samples=3), backend, tok, limits)

    reused = []  # per generate call: how many prompts extended a kept turn
    fast = HFBackend(policy.model, tok)
    plan = fast._cuts

    def counted(prompts):
        cuts, kvs = plan(prompts)
        reused.append(sum(kv is not None for kv in kvs))
        return cuts, kvs

    fast._cuts = counted
    whole = HFBackend(policy.model, tok, share_prefixes=False)
    (a, a_steps), (b, b_steps) = roll(fast), roll(whole)
    assert sum(reused) >= len(a), "no turn extended a kept one: nothing checked"
    assert fast.kept is None  # dropped on leaving run_episodes
    assert max(len(e["turn_spans"]) for e in a) >= 3
    assert_same_episodes(a, b)
    assert a_steps == b_steps


# ------------------------------------------------------------------------------ cost


def test_episode_cost_prices_every_cost_column():
    from rollwise.loop import rollout_metrics
    from rollwise.rollout.cost import episode_costs

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


# ------------------------------------------------------------------------------ the rollout stage


@pytest.fixture(scope="module")
def stage_root(policy, tmp_path_factory) -> Path:
    """A workspace ready for rollout@01: the scripted policy's suite regenerated with faults
    (same tasks and words: faults change nothing the policy reads), its checkpoint as round 00,
    and round 00's empty scheduler and curator states."""
    from tasks.common import envs_dir, model_dir
    from tasks.warmstart import initial_states

    root = tmp_path_factory.mktemp("stage")
    faults = FaultsConfig(flaky_p=0.5, flaky_wrong=0.3, verifier_flip_q=0.2, unsolvable_frac=0.3)
    make_suite(envs_dir(root), SMALL_ENVS.model_copy(update={"faults": faults}))
    shutil.copytree(policy.policy_dir, model_dir(root, "00"))
    initial_states(root)
    return root


STAGE_PARAMS = {
    "schedule": {"method": "random", "tasks_per_round": 6},
    "rollout": {"samples_per_task": 2, "max_turns": 4, "max_new_tokens": 40, "temperature": 0.7},
}


def test_the_rollout_stage_writes_one_audit_row_per_episode_apart(stage_root: Path):
    from tasks.common import round_dir
    from tasks.rollout import run

    metrics = run(validate(STAGE_PARAMS), stage_root, "01")
    out = round_dir(stage_root, "rollouts", "01")
    audit = pd.read_parquet(out / "audit.parquet")
    episodes, steps = (pd.read_parquet(out / f) for f in ("episodes.parquet", "steps.parquet"))
    assert list(audit.columns) == AUDIT_COLUMNS and len(audit) == metrics["episodes"] == 12
    assert audit["episode_id"].is_unique and set(episodes["episode_id"]) <= set(audit["episode_id"])
    assert not [c for c in [*episodes.columns, *steps.columns] if "audit" in c or "fault" in c]
    detail = audit["detail"].map(json.loads)
    distinct = [sorted({d["fault"] for d in rows}) for rows in detail]
    assert distinct == audit["faults"].map(list).tolist()
    assert (audit["injections"] == detail.map(len)).all() and audit["injections"].sum() > 0
    # The audit agrees with the steps: each call-level fault sits on a recorded call, of the
    # kind the policy saw (a flaky failure is an environment error; a wrong value looks ok).
    kinds = steps.set_index(["episode_id", "step"])["observation_kind"]
    seen = {"flaky_error": "env_error", "flaky_wrong": "ok", "stochastic": "ok"}
    calls = [((e, d["step"]), seen[d["fault"]])
             for e, rows in zip(audit["episode_id"], detail, strict=True)
             for d in rows if d["step"] >= 0 and e in set(steps["episode_id"])]  # fmt: skip
    assert calls and all(kinds[key] == kind for key, kind in calls)


DOC_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
NAME_FIELDS = {ast.Name: "id", ast.Attribute: "attr", ast.alias: "name", ast.arg: "arg"}


def code_words(path: Path, function: str | None = None) -> list[str]:
    """A module's (or one of its functions') identifiers and string constants; docstrings left
    out (comments are not in the syntax tree)."""
    tree = ast.parse(path.read_text())
    if function is not None:
        tree = next(n for n in tree.body if getattr(n, "name", None) == function)
    owners = [n for n in ast.walk(tree) if isinstance(n, DOC_OWNERS)]
    docs = {id(n.body[0].value) for n in owners if ast.get_docstring(n, clean=False)}
    words = []
    for node in ast.walk(tree):
        if type(node) in NAME_FIELDS:
            words.append(getattr(node, NAME_FIELDS[type(node)]))
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
        ):
            words.append(node.value)
    return words


def test_the_curator_never_reads_the_audit():
    """No code in curate/, tasks/curate.py or the round's curate step names an audit (their
    docstrings say they never read one), while the rollout step that writes it does."""
    root = Path(__file__).resolve().parents[1]
    files = [*sorted((root / "src/rollwise/curate").glob("*.py")), root / "tasks/curate.py"]
    named = [f"{p.name}: {w}" for p in files for w in code_words(p) if "audit" in w.lower()]
    loop = root / "src/rollwise/loop.py"
    named += [w for f in ("curate", "curate_metrics") for w in code_words(loop, f) if "audit" in w]
    assert len(files) > 3 and named == []
    assert "audit_row" in code_words(loop, "rollout")  # the scan can see a use


@pytest.mark.parametrize(
    ("damaged", "named"),
    [
        ("data/envs/catalog.parquet", r"catalog\.parquet.*`generate`"),
        ("data/envs/{env}/tasks.parquet", r"tasks\.parquet.*`generate`"),
        ("data/rollouts/round_00/scheduler_state.json", r"scheduler_state\.json.*`warmstart`"),
        ("data/curated/round_00/quarantine.parquet", r"quarantine\.parquet.*`warmstart`"),
        ("models/round_00/model.safetensors", r"round_00.*`warmstart`"),
    ],
)
def test_a_damaged_upstream_artifact_is_named(stage_root: Path, tmp_path: Path, damaged, named):
    from tasks.common import CorruptArtifact
    from tasks.rollout import run

    root = tmp_path / "root"
    shutil.copytree(stage_root, root, ignore=shutil.ignore_patterns("round_01"))
    env = sorted(p.name for p in (root / "data/envs").iterdir() if p.is_dir())[0]
    path = root / damaged.format(env=env)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # truncated mid-write
    with pytest.raises(CorruptArtifact, match=named):
        run(validate(STAGE_PARAMS), root, "01")
