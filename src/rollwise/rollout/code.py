"""Code actions in the rollout (rollout.action_mode: code): one turn's Python runs in the
sandbox (rollwise/sandbox: a separate, limited process), and each tool call it makes runs here
through the engine's own `execute`, so it is a recorded step with its fingerprints and per-call
deadline, exactly like a direct call: credit, curation and the cost columns see the same rows.
The turn's observation is the sandbox's output (what the code printed, its last value, or its
error), not the calls' results: those stay in the code's variables."""

from __future__ import annotations

import re
import threading

from rollwise.envs.rubric import parse
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
    return block([(c.name, [(k, repr(v)) for k, v in c.arguments.items()]) for c in calls])


def block(lines: list[tuple[str, list[tuple[str, str]]]]) -> str:
    """(tool, [(argument, Python expression)]) per call as one code action: each result in a
    variable r0, r1, ..., the last call's value shown."""
    calls = [f"{name}({', '.join(f'{k}={expr}' for k, expr in args)})" for name, args in lines]
    return "\n".join([*(f"r{i} = {call}" for i, call in enumerate(calls[:-1])), calls[-1]])


def grounded_blocks(calls: list[ToolCall], observations: list[str], question: str) -> list[str]:
    """The oracle's calls as code a policy could have written without seeing the intermediate
    results (the SFT demos of code mode): a value the question names is written as is, a value
    an earlier call returned as an expression over that call's variable (`r0['customer_id']`,
    or the element of a returned list picked by a field whose value the question names). One
    block when every value is so written; else one block per call, each showing its result."""
    results = [parse(o) for o in observations]
    lines = []
    for i, call in enumerate(calls):
        args = [(k, ground(v, results[:i], question)) for k, v in call.arguments.items()]
        if any(expr is None for _, expr in args):
            return [oracle_code([c]) for c in calls]
        lines.append((call.name, args))
    return [block(lines)]


def ground(value, results: list, question: str) -> str | None:
    """A Python expression for `value`: its literal if the question says it or no earlier result
    holds it; else a path into the latest result that holds it (None: held, but no path a
    policy could write without seeing the result)."""
    if isinstance(value, bool) or said(value, question):
        return repr(value)
    held = False
    for k in reversed(range(len(results))):
        expr, found = reach(value, results[k], f"r{k}", question)
        if expr is not None:
            return expr
        held = held or found
    return None if held else repr(value)


def reach(value, result, var: str, question: str) -> tuple[str | None, bool]:
    """(an expression for `value` inside `result`, whether `result` holds it at all)."""
    if isinstance(result, dict):
        key = next((f for f, v in result.items() if v == value and not isinstance(v, bool)), None)
        return (None, False) if key is None else (f"{var}[{key!r}]", True)
    items = [x for x in result if isinstance(x, dict)] if isinstance(result, list) else []
    for item in items:
        key = next((f for f, v in item.items() if v == value and not isinstance(v, bool)), None)
        if key is None:
            continue
        for field, pick in item.items():  # a field the question names, true of this item only
            if field != key and isinstance(pick, str) and said(pick, question):
                if sum(x.get(field) == pick for x in items) == 1:
                    where = f"[x for x in {var} if x[{field!r}] == {pick!r}][0]"
                    return f"{where}[{key!r}]", True
        return None, True
    return None, False


def said(value, question: str) -> bool:
    """Whether the question states `value` (as a whole word, any case)."""
    text = str(value)
    return bool(text) and re.search(rf"(?<!\w){re.escape(text)}(?!\w)", question, re.I) is not None
