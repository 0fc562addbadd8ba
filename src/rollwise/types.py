"""The vocabulary that crosses stages. Tables on disk have one column per field below."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

ObservationKind = Literal["ok", "tool_error", "env_error"]
Termination = Literal["answer", "max_turns", "max_tokens", "context", "env_error"]


@dataclass(frozen=True)
class ToolSpec:
    """One function the policy may call; `parameters` is a JSON schema (OpenAI style)."""

    name: str
    description: str
    parameters: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def to_json(self) -> str:
        """Compact JSON, the exact text a policy emits inside <tool_call>...</tool_call>."""
        return json.dumps({"name": self.name, "arguments": self.arguments}, separators=(",", ":"))


@dataclass(frozen=True)
class Observation:
    """What a tool call returned. Errors are observations, never exceptions."""

    content: str
    kind: ObservationKind = "ok"


@dataclass(frozen=True)
class Task:
    """One task of one environment; `oracle` solves it, `answer` is the expected final answer."""

    task_id: str
    env_id: str
    kind: str
    prompt: str
    oracle: tuple[ToolCall, ...]
    answer: str
    split: Literal["train", "heldout"]
    writes: bool = False
    target: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rubric:
    """Per-criterion scores in [0, 1] and their weights; reward is the weighted mean."""

    scores: dict[str, float]
    weights: dict[str, float]

    @property
    def reward(self) -> float:
        total = sum(self.weights.values())
        return sum(self.weights[k] * self.scores[k] for k in self.weights) / total

    @property
    def success(self) -> bool:
        """The task was done: right answer, right final state, nothing else touched (and, where
        the environment scores it, the answer read from the record asked about)."""
        gates = [*SUCCESS_CRITERIA, *(k for k in OPTIONAL_CRITERIA if k in self.scores)]
        return all(self.scores[k] == 1.0 for k in gates)


SUCCESS_CRITERIA = ("answer_correct", "state_correct", "no_side_effects")
# Success criteria an environment may leave out (the synthetic suites score it: envs/rubric.py).
OPTIONAL_CRITERIA = ("grounded",)


# Columns of the per-stage tables (design.md §2); tests check artifacts against these.
EPISODE_COLUMNS = [
    "episode_id",
    "round",
    "env_id",
    "task_id",
    "group",
    "sample",
    "policy_version",
    "seed",
    "token_ids",
    "logprobs",
    "loss_mask",
    "prompt_len",
    "answer",
    "reward",
    "success",
    "rubric",
    "termination",
    "prompt_tokens",
    "generated_tokens",
    "turns",
    "tool_calls",
    "tool_errors",
    "env_errors",
    "verifier_calls",
    "wall_s",
    "cost",  # the cost columns priced by params rollout.cost (rollout/cost.py)
]
STEP_COLUMNS = [
    "episode_id",
    "step",
    "fingerprint_before",
    "fingerprint_after",
    "tool",
    "arguments",
    "observation",
    "observation_kind",
    "span_start",
    "span_end",
]
DECISION_COLUMNS = ["episode_id", "kept", "reason", "evidence"]
ADVANTAGE_COLUMNS = ["episode_id", "step", "advantage", "span_start", "span_end"]
