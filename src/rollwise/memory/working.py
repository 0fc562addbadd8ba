"""Working memory (Recuris-style): a compact progress state rendered into the prompt each turn.

The state is folded from the recorded steps (call, observation), never written by the model:
  found    every id-like field (`id`, `*_id`) an ok result held, its distinct values in order
  done     the calls that succeeded, as `tool(arg:value, ...)` (sub-goals done)
  failed   the latest failed calls and their errors (at most MAX_FAILED)
  needed   the id arguments of tools not yet called successfully that no result has held yet
           (values still needed)
`Working` keeps it per episode and hands it to the engine as a progress note after each turn
(envs/protocol.py `progress_note`): "beside" the full history. Rendering it *instead of* the
history needs per-turn sequences in the engine and trainer (one token sequence per turn); not
built here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from rollwise.types import Observation, Task, ToolCall, ToolSpec

MAX_VALUES = 6  # values kept per found key
MAX_FAILED = 2


@dataclass
class Progress:
    found: dict[str, list] = field(default_factory=dict)
    done: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    needed: list[str] = field(default_factory=list)


def is_id(key: str) -> bool:
    return key == "id" or key.endswith("_id")


def ids_in(value) -> list[tuple[str, object]]:
    """(key, value) of every id-like scalar field in a result (objects and lists of them)."""
    if isinstance(value, list):
        return [kv for item in value for kv in ids_in(item)]
    if isinstance(value, dict):
        return [(k, v) for k, v in value.items() if is_id(k) and isinstance(v, (int, str))]
    return []


def call_text(call: ToolCall) -> str:
    args = call.arguments if isinstance(call.arguments, dict) else {}
    return f"{call.name}({', '.join(f'{k}:{v}' for k, v in args.items())})"


def fold(state: Progress, call: ToolCall, obs: Observation, tools: list[ToolSpec]) -> Progress:
    """The state after one recorded step."""
    found = {k: list(v) for k, v in state.found.items()}
    done, failed = list(state.done), list(state.failed)
    if obs.kind == "ok":
        try:
            result = json.loads(obs.content)
        except ValueError:
            result = None
        for key, value in ids_in(result):
            values = found.setdefault(key, [])
            if value not in values and len(values) < MAX_VALUES:
                values.append(value)
        text = call_text(call)
        done += [text] if text not in done else []
    else:
        failed = (failed + [f"{call_text(call)}: {obs.content[:80]}"])[-MAX_FAILED:]
    return Progress(found, done, failed, needed_ids(found, done, tools))


def needed_ids(found: dict, done: list[str], tools: list[ToolSpec]) -> list[str]:
    called = {d.split("(", 1)[0] for d in done}
    out = []
    for t in tools:
        if t.name in called:
            continue
        out += [a for a in t.parameters.get("required", []) if is_id(a) and a not in found]
    return sorted(set(out))


def state_of(steps: list[dict], tools: list[ToolSpec]) -> Progress:
    """The state after an episode's recorded step rows (the step table's columns)."""
    state = Progress(needed=needed_ids({}, [], tools))
    for s in sorted(steps, key=lambda s: s["step"]):
        call = ToolCall(s["tool"], json.loads(s["arguments"]))
        state = fold(state, call, Observation(s["observation"], s["observation_kind"]), tools)
    return state


def render(state: Progress) -> str:
    """The note the policy reads: short JSON, empty parts left out."""
    parts = {k: v for k, v in vars(state).items() if v}
    return json.dumps({"progress": parts}, separators=(",", ":"), default=str)


@dataclass
class Working:
    """An episode's environment that keeps working memory from its own steps and renders it as
    the engine's progress note each turn. Everything else is the wrapped environment's. With
    skills, wrap it inside: Skilled(Working(env)) (memory.wrap), so a skill's real calls reach
    it one by one."""

    env: object

    def reset(self, task: Task, seed: int) -> list[dict]:
        messages = self.env.reset(task, seed)
        self.state = Progress(needed=needed_ids({}, [], self.env.tools()))
        return messages

    def step(self, call: ToolCall) -> Observation:
        obs = self.env.step(call)
        self.state = fold(self.state, call, obs, self.env.tools())
        return obs

    def progress(self) -> str:
        return render(self.state)

    def __getattr__(self, name: str):
        if name in ("env", "state"):  # not set yet (copy/pickle): never recurse
            raise AttributeError(name)
        return getattr(self.env, name)
