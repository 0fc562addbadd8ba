"""Code actions in the rollout (rollout.action_mode: code): one turn's Python runs in the
sandbox (rollwise/sandbox: a separate, limited process), and each tool call it makes runs here
through the engine's own `execute`, so it is a recorded step with its fingerprints and per-call
deadline, exactly like a direct call: credit, curation and the cost columns see the same rows.
The turn's observation is the sandbox's output (what the code printed, its last value, or its
error), not the calls' results: those stay in the code's variables."""

from __future__ import annotations

import threading

from rollwise.sandbox import run_code
from rollwise.types import Observation, ToolCall


def tool_signatures(env) -> dict[str, list[str]]:
    """Each tool's argument names in schema order (a code action may pass them by position)."""
    return {t.name: list(t.parameters.get("properties", {})) for t in env.tools()}


def execute_code(
    env, code: str, limits, hung: threading.Thread | None = None
) -> tuple[list[tuple], list[Observation], threading.Thread | None]:
    """((call, observation, state before, state after) per call the code made, [the turn's one
    observation], a call left running if one overran): engine.execute's shape."""
    from rollwise.rollout.engine import execute  # the engine imports this module

    results: list[tuple] = []
    state = {"hung": hung}

    def call_tool(name: str, arguments: dict) -> Observation:
        out, shown, state["hung"] = execute(
            env, [ToolCall(name, arguments)], limits.tool_timeout_s, state["hung"]
        )
        results.extend(out)
        return shown[0]

    result = run_code(code, tool_signatures(env), call_tool, limits.sandbox)
    return results, [result.observation()], state["hung"]


def oracle_code(calls: list[ToolCall]) -> str:
    """An oracle's calls as one code action: each result kept in a variable, the last shown."""
    lines = [f"{c.name}({', '.join(f'{k}={v!r}' for k, v in c.arguments.items())})" for c in calls]
    return "\n".join([*(f"r{i} = {line}" for i, line in enumerate(lines[:-1])), lines[-1]])
