"""The one batched multi-turn loop. All live episodes advance together; finished ones leave.

Each episode's sequence is built token-in, token-out: the prompt is tokenized once, then each
turn appends exactly the generated ids (loss mask 1) and the observation ids (mask 0); the
conversation is never re-tokenized. A turn ends on the stop token (the tokenizer's eos, e.g.
`<|im_end|>`, which closes a tool-call turn and an answer alike) or at its token room.

The user may speak more than once: when the policy answers, the engine asks the environment
for its next user turn (`protocol.next_turn`; None, the default, ends the conversation). User
messages are tokenized once and appended like observations (loss mask 0), and the episode goes
on; every limit below counts over the whole conversation.

How an episode ends (its `termination`):
  answer      the policy answered and the environment has no further user turn
  max_turns   `max_turns` assistant turns taken (over all user turns) before that
  max_tokens  a turn ran out of `max_new_tokens` before its stop token
  context     the sequence reached `max_context`: no room for the next token, observation or
              user turn
  env_error   the environment failed where no observation can stand in (reset, next_turn,
              verify, or a hung call still holding the state at the end)
Tool calls that raise or overrun `tool_timeout_s` do not end the episode: they become
observations of kind `env_error` and the policy takes its next turn.

An episode's result does not depend on the batch it runs in: each turn samples with the
episode's own seed (`turn_seed`) and its own token room, so any sharding or batch size of the
same plan gives the same episodes (rollout/executors.py relies on it).
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field

from rollwise.envs.protocol import expansion, next_turn, progress_note
from rollwise.policy.chat import (
    code_messages,
    encode,
    observation_text,
    parse_action,
    parse_code_action,
    prompt_ids,
    user_text,
)
from rollwise.rollout.code import execute_code
from rollwise.sandbox import SandboxLimits
from rollwise.types import Observation, Task, ToolCall


@dataclass(frozen=True)
class Limits:
    max_turns: int = 6
    max_new_tokens: int = 48
    max_context: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    tool_timeout_s: float = 5.0  # per call
    batch_size: int = 256
    seed: int = 0
    action_mode: str = (
        "direct"  # direct: <tool_call> turns; code: ```python turns (rollout/code.py)
    )
    sandbox: SandboxLimits = SandboxLimits()  # what one code action may spend


@dataclass
class EpisodeSpec:
    episode_id: str
    task: Task
    env: object  # an Environment (envs/protocol.py); one private copy per episode
    group: str = ""
    sample: int = 0
    seed: int = 0


@dataclass
class Live:
    spec: EpisodeSpec
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turn_spans: list[list[int]] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    prompt_len: int = 0
    answer: str | None = None
    termination: str | None = None
    tool_errors: int = 0
    env_errors: int = 0
    t0: float = 0.0
    wall_s: float = 0.0
    hung: threading.Thread | None = None  # a tool call that overran and may still touch state

    def extend(self, ids: list[int], logprobs: list[float] | None, policy: bool) -> None:
        self.ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.mask += [int(policy)] * len(ids)

    def end(self, reason: str) -> None:
        self.termination, self.wall_s = reason, time.perf_counter() - self.t0


TOOL_WORKERS = 32  # episodes whose calls run at once; mostly waiting (I/O, timeouts), not CPU


def run_episodes(specs: list[EpisodeSpec], backend, tokenizer, limits: Limits) -> tuple[list, list]:
    """Roll out every spec to an answer or a limit; returns (episode rows, step rows)."""
    keeping = getattr(backend, "keeping", nullcontext)  # HF: a turn prefills its new tokens
    with ThreadPoolExecutor(max_workers=TOOL_WORKERS) as pool, keeping():
        live = [start(s, tokenizer, limits.action_mode == "code") for s in specs]
        for _ in range(limits.max_turns):
            active = [e for e in live if e.termination is None]
            active = [e for e in active if fits(e, limits)]
            if not active:
                break
            for lo in range(0, len(active), limits.batch_size):
                advance(active[lo : lo + limits.batch_size], backend, tokenizer, limits, pool)
        for e in live:
            if e.termination is None:
                e.end("max_turns")
        return [finish(e, limits) for e in live], [s for e in live for s in e.steps]


def start(spec: EpisodeSpec, tokenizer, code: bool = False) -> Live:
    e = Live(spec, t0=time.perf_counter())
    try:
        messages, tools = spec.env.reset(spec.task, spec.seed), spec.env.tools()
        if code:  # the tools are listed as functions of the code instead
            messages, tools = code_messages(messages, tools), []
        e.extend(prompt_ids(tokenizer, messages, tools), None, policy=False)
    except Exception as exc:  # a user environment that raises costs this episode only
        e.answer = f"reset failed: {type(exc).__name__}"
        e.env_errors += 1
        e.end("env_error")
    e.prompt_len = len(e.ids)
    return e


def fits(e: Live, limits: Limits) -> bool:
    if len(e.ids) + 1 >= limits.max_context:
        e.end("context")
        return False
    return True


def turn_seed(e: Live, rollout_seed: int) -> int:
    """The sampling seed of an episode's next turn, from (rollout seed, episode seed, episode id,
    turn): its own stream whatever batch it lands in. The id keeps episodes of different tasks
    that share a seed from sharing noise. 63 bits, stable across processes (no hash())."""
    key = f"{rollout_seed}/{e.spec.seed}/{e.spec.episode_id}/{len(e.turn_spans)}"
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1


def room(e: Live, limits: Limits) -> int:
    """New tokens this episode may generate this turn (its own context, not its batch mates')."""
    return max(1, min(limits.max_new_tokens, limits.max_context - len(e.ids)))


def clip(out, n: int) -> tuple[list[int], list[float], bool]:
    """(ids, log-probs, stopped) of a completion cut to n tokens; a cut one did not stop."""
    if len(out.token_ids) <= n:
        return out.token_ids, out.logprobs, out.stopped
    return out.token_ids[:n], out.logprobs[:n], False


def advance(chunk: list[Live], backend, tokenizer, limits: Limits, pool) -> None:
    """One turn for a chunk: generate, parse, execute the tool calls concurrently, observe."""
    rooms = [room(e, limits) for e in chunk]
    outs = backend.generate(
        [e.ids for e in chunk],
        max(rooms),
        limits.temperature,
        greedy=limits.greedy,
        seed=[turn_seed(e, limits.seed) for e in chunk],
        top_p=limits.top_p,
    )
    pending = []
    for e, out, n in zip(chunk, outs, rooms, strict=True):
        ids, logprobs, stopped = clip(out, n)
        span = [len(e.ids), len(e.ids) + len(ids)]
        e.extend(ids, logprobs, policy=True)
        e.turn_spans.append(span)
        if not stopped:  # cut by its room: the context's if that was the tighter limit
            e.end("context" if len(e.ids) >= limits.max_context else "max_tokens")
            continue
        parse = parse_code_action if limits.action_mode == "code" else parse_action
        action = parse(tokenizer.decode(ids, skip_special_tokens=False), tokenizer.eos_token)
        if action.answer is not None:
            e.answer = action.answer
            user_turn(e, tokenizer, limits)
        elif action.error is not None:
            e.tool_errors += 1
            error = Observation(json.dumps({"error": action.error}), "tool_error")
            observe(e, [error], tokenizer, limits)
        elif action.code is not None:
            args = (e.spec.env, action.code, limits, e.hung)
            pending.append((e, span, True, pool.submit(execute_code, *args)))
        else:
            args = (e.spec.env, action.calls, limits.tool_timeout_s, e.hung)
            pending.append((e, span, False, pool.submit(execute, *args)))
    for e, span, code, future in pending:  # each bounded by its own per-call deadlines
        results, shown, e.hung = future.result()  # shown: what the policy reads
        for call, obs, before, after in results:
            record_step(e, call, obs, before, after, span)
        if code:  # a code action's one observation: its error is the policy's tool error
            e.tool_errors += sum(o.kind == "tool_error" for o in shown)
        observe(e, shown, tokenizer, limits)


def env_error(message: str) -> Observation:
    return Observation(json.dumps({"error": f"environment: {message}"}), "env_error")


def execute(
    env, calls: list[ToolCall], timeout_s: float, hung: threading.Thread | None = None
) -> tuple[list[tuple], list[Observation], threading.Thread | None]:
    """Run one episode's calls in order (they may depend on each other's state), each with its
    own deadline; returns ((call, observation, state before, state after) per call run, the
    observation shown to the policy per call, the call left running if one overran). A call
    the environment expands (a skill, protocol.expansion) runs as its real calls, each one
    such step; the policy sees the expansion's own result. A call that overruns becomes an
    env_error observation and the calls after it are not run: they would race it for the
    state. Likewise while an earlier turn's overrunning call is still running."""
    if hung is not None:
        hung.join(timeout_s)
        if hung.is_alive():
            busy = env_error("busy: an earlier call has not returned")
            return (
                [(c, busy, "unavailable", "unavailable") for c in calls],
                [busy] * len(calls),
                hung,
            )
    out, shown, before = [], [], safe_fingerprint(env)
    for i, call in enumerate(calls):
        plan = safe_expansion(env, call) or single(call)
        try:
            real = next(plan)
            while True:
                obs, running = timed_step(env, real, timeout_s)
                if running is not None:
                    plan.close()
                    skipped = env_error("not run: an earlier call in this turn timed out")
                    out.append((real, obs, before, "unavailable"))
                    out += [(c, skipped, "unavailable", "unavailable") for c in calls[i + 1 :]]
                    return out, shown + [obs] + [skipped] * len(calls[i + 1 :]), running
                after = safe_fingerprint(env)  # also the next call's "before": hashed once
                out.append((real, obs, before, after))
                before = after
                real = plan.send(obs)
        except StopIteration as stop:
            shown.append(stop.value)
        except Exception as exc:  # an expansion that raises: an observation, like a tool
            shown.append(env_error(type(exc).__name__))
    return out, shown, None


def single(call: ToolCall):
    """A plain call as an expansion of itself: the policy sees its own observation."""
    return (yield call)


def safe_expansion(env, call: ToolCall):
    try:
        return expansion(env, call)
    except Exception:  # a user environment that raises: the call runs plainly
        return None


def timed_step(
    env, call: ToolCall, timeout_s: float
) -> tuple[Observation, threading.Thread | None]:
    """env.step on its own thread, waited for at most timeout_s: (observation, None), or a
    timeout observation and the thread still running (Python cannot stop it)."""
    box: list[Observation] = []
    worker = threading.Thread(target=lambda: box.append(safe_step(env, call)), daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return env_error(f"{call.name} timed out after {timeout_s:g} s"), worker
    return box[0], None


def safe_step(env, call: ToolCall) -> Observation:
    try:
        return env.step(call)
    except Exception as exc:  # the protocol says errors are observations; enforce it
        return env_error(type(exc).__name__)


def safe_fingerprint(env) -> str:
    try:
        return env.fingerprint()
    except Exception:
        return "unavailable"


def record_step(e: Live, call: ToolCall, obs: Observation, before: str, after: str, span) -> None:
    e.calls.append(call)
    e.tool_errors += obs.kind == "tool_error"
    e.env_errors += obs.kind == "env_error"
    e.steps.append(
        {
            "episode_id": e.spec.episode_id,
            "step": len(e.steps),
            "fingerprint_before": before,
            "fingerprint_after": after,
            "tool": call.name,
            "arguments": json.dumps(call.arguments, default=str),
            "observation": obs.content,
            "observation_kind": obs.kind,
            "span_start": span[0],
            "span_end": span[1],
        }
    )


def observe(e: Live, observations: list[Observation], tokenizer, limits: Limits) -> None:
    """The turn's observations, then the environment's progress note if it keeps one."""
    shown = observations + progress_note(e.spec.env)
    append(e, encode(tokenizer, observation_text(tokenizer, shown)), limits)


def user_turn(e: Live, tokenizer, limits: Limits) -> None:
    """After an answer: the environment's next user turn appended, or the conversation's end."""
    try:
        messages = next_turn(e.spec.env, e.answer)
        text = None if messages is None else user_text(tokenizer, messages)
    except Exception:  # a user environment that raises (or says nonsense) costs this episode
        e.env_errors += 1
        e.end("env_error")
        return
    if text is None:
        e.end("answer")
    else:
        append(e, encode(tokenizer, text), limits)


def append(e: Live, ids: list[int], limits: Limits) -> None:
    """Append non-policy tokens (observations, a user turn; loss mask 0), or end the episode
    if they leave no room for a turn."""
    if len(e.ids) + len(ids) + 1 >= limits.max_context:
        e.end("context")
        return
    e.extend(ids, None, policy=False)


class EpisodeRow(dict):
    """An episode row with the faults injected into it riding beside it, not in it: `audit`
    holds the environment's audit rows of this episode (envs/faults.py; [] for an environment
    that keeps none). pd.DataFrame(rows) sees only the columns, so nothing downstream of the
    episode table (the curator above all) can read the ground truth, while the audit still
    crosses a Ray worker's pickling with its row. The rollout stage writes it apart
    (`audit_row`)."""

    audit: list[dict]


AUDIT_COLUMNS = ["episode_id", "env_id", "task_id", "seed", "faults", "injections", "detail"]


def audit_row(row: EpisodeRow) -> dict:
    """One row of the rollout's audit table (data/rollouts/round_r/audit.parquet): the distinct
    faults injected into the episode ([] for none), how many injections, and the environment's
    own audit rows as JSON."""
    if not isinstance(row, EpisodeRow):  # a plain dict lost its audit: never guess "no faults"
        raise TypeError(f"audit_row needs the engine's own row, not a {type(row).__name__}")
    return {
        **{k: row[k] for k in ("episode_id", "env_id", "task_id", "seed")},
        "faults": sorted({a["fault"] for a in row.audit}),
        "injections": len(row.audit),
        "detail": json.dumps(row.audit, default=str),
    }


def finish(e: Live, limits: Limits) -> EpisodeRow:
    """Verify and flatten into an episode row (design.md §2 columns) with its audit."""
    rubric, verifier_calls = None, 0
    if e.hung is not None:
        e.hung.join(limits.tool_timeout_s)
    if e.hung is not None and e.hung.is_alive():  # the state may still change: no verdict
        e.env_errors += 1
        e.termination = "env_error"
    elif e.prompt_len:  # reset succeeded
        try:
            rubric, verifier_calls = e.spec.env.verify(e.answer, e.calls), 1
        except Exception:
            e.env_errors += 1
            e.termination = "env_error"
    scores = rubric.scores if rubric else {}
    s = e.spec
    row = {
        "episode_id": s.episode_id,
        "env_id": s.task.env_id,
        "task_id": s.task.task_id,
        "group": s.group,
        "sample": s.sample,
        "seed": s.seed,
        "token_ids": e.ids,
        "logprobs": e.logprobs,
        "loss_mask": e.mask,
        "turn_spans": e.turn_spans,
        "prompt_len": e.prompt_len,
        "answer": e.answer,
        "reward": rubric.reward if rubric else 0.0,
        "success": bool(rubric and rubric.success),
        "rubric": json.dumps(scores),
        "termination": e.termination,
        "prompt_tokens": len(e.ids) - sum(e.mask),
        "generated_tokens": sum(e.mask),
        "turns": len(e.turn_spans),
        "tool_calls": len(e.calls),
        "tool_errors": e.tool_errors,
        "env_errors": e.env_errors,
        "verifier_calls": verifier_calls,
        "wall_s": e.wall_s,
    }
    # Read after verify (a flipped verdict is noted there); a failed reset leaves a stale list.
    row = EpisodeRow(row)
    row.audit = [dict(a) for a in getattr(s.env, "audit", [])] if e.prompt_len else []
    return row


def clone_env(prototype):
    """A private copy of an environment for one episode (state is created in reset)."""
    return copy.copy(prototype)
