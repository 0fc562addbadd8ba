"""The Environment contract (design.md §3). Bring your own by implementing it and naming a
zero-argument factory in params.yaml: `envs.custom: "package.module:factory"` (envs/custom.py,
README "Bring your own environment").

One departure from design.md §3: `verify` takes the final answer and the calls instead of an
episode record; anything else it needs (the state above all) the environment keeps itself.
Episodes run on shallow copies of one prototype (rollout/engine.py `clone_env`), so per-episode
state must be created in `reset`, never shared through attributes set in `__init__`.

One optional method: `next_turn(answer) -> list[dict] | None` (`MultiTurn`), for an environment
whose user speaks more than once. It is not a member of `Environment`, so isinstance checks keep
passing without it; callers go through the module function `next_turn`, whose default (no such
method) is None: the conversation ends at the first answer, as before. One optional attribute:
`oracle_errors_ok = True` lets generation keep a task whose oracle makes calls the environment
answers with an error (BFCL's ground truth may; its verdict checks those errors).

Two more optional methods, for memory across episodes (rollwise/memory/): `expand(call)` returns
None for a plain call, or a generator that yields the real calls a composite call (a skill)
stands for, is sent each one's observation, and returns the observation the policy sees; the
engine runs each real call as its own recorded step (`expansion`). `progress()` returns a
compact progress note the engine renders after each turn's observations (`progress_note`).
Without them (the default) nothing changes.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from rollwise.types import Observation, Rubric, Task, ToolCall, ToolSpec


@runtime_checkable
class Environment(Protocol):
    def tools(self) -> list[ToolSpec]:
        """The functions exposed to the policy (after `reset`: they may depend on the task)."""

    def reset(self, task: Task, seed: int) -> list[dict]:
        """Fresh state for `task`; returns the opening chat messages (system, user)."""

    def step(self, call: ToolCall) -> Observation:
        """Execute one call. Errors come back as observations, never as exceptions."""

    def fingerprint(self) -> str:
        """Hash of the state the next action depends on (GiGPO anchors key on it)."""

    def verify(self, answer: str | None, calls: list[ToolCall]) -> Rubric:
        """Score the episode from the state, not only the transcript. The scores must include
        the criteria of types.SUCCESS_CRITERIA; those of types.OPTIONAL_CRITERIA it may score
        (success then needs them too)."""


@runtime_checkable
class TaskSource(Protocol):
    """What a custom environment adds: its tasks (generation replays each oracle through it and
    keeps the tasks whose oracle passes `verify`)."""

    def tasks(self) -> list[Task]:
        """Every task, each with an oracle call sequence and its env_id (a folder name)."""


@runtime_checkable
class MultiTurn(Protocol):
    """An environment whose user speaks more than once (envs/bfcl.py)."""

    def next_turn(self, answer: str | None) -> list[dict] | None:
        """The user's next message(s) after the policy ended its turn with `answer` (a reply
        without tool calls), or None when the conversation is over. Only `user` messages: the
        rollout engine tokenizes them once and appends them (loss mask 0) to the episode."""

    def oracle_turns(self, task: Task) -> list[list[ToolCall]]:
        """The task's oracle split by user turn."""


def next_turn(env: Environment, answer: str | None) -> list[dict] | None:
    """The environment's next user turn after `answer`; None (the end) for an environment
    without `next_turn`."""
    method = getattr(env, "next_turn", None)
    return method(answer) if callable(method) else None


def expansion(env: Environment, call: ToolCall):
    """The real calls `call` expands into (a generator, see the module docstring), or None for
    a plain call and for an environment without `expand`."""
    method = getattr(env, "expand", None)
    return method(call) if callable(method) else None


def progress_note(env: Environment) -> list[Observation]:
    """The environment's progress note after a turn, as one more observation ([] for none)."""
    method = getattr(env, "progress", None)
    note = method() if callable(method) else None
    return [Observation(note)] if note else []
