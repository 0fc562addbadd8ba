"""The Environment contract (design.md §3). Bring your own by implementing it."""

from __future__ import annotations

from typing import Protocol

from rollwise.types import Observation, Rubric, Task, ToolCall, ToolSpec


class Environment(Protocol):
    def tools(self) -> list[ToolSpec]:
        """The functions exposed to the policy."""

    def reset(self, task: Task, seed: int) -> list[dict]:
        """Fresh state for `task`; returns the opening chat messages (system, user)."""

    def step(self, call: ToolCall) -> Observation:
        """Execute one call. Errors come back as observations, never as exceptions."""

    def fingerprint(self) -> str:
        """Hash of the state the next action depends on (GiGPO anchors key on it)."""

    def verify(self, answer: str | None, calls: list[ToolCall]) -> Rubric:
        """Score the episode from the state, not only the transcript."""
