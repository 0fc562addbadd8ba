"""A skill bank (SkillForge-style): named, parameterized procedures induced from verified
successes, exposed to the policy as tools, kept only while their evidence holds.

A skill is a sequence of tool-call templates. Each argument of a step is a slot:
  {"arg": p}                          the skill's own argument p
  {"from": k, "key": f}               field f of step k's result (a JSON object)
  {"from": k, "key": f, "where": {g: {"arg": p}}}
                                      field f of the element of step k's result (a list of
                                      objects) whose field g equals argument p
Induction (`induce`) abstracts a recorded trajectory: a value an earlier result holds becomes a
"from" slot (support-use), any other value a skill argument named after the call's argument.
So a skill never stores the ids of the episode it came from, only where they were read.

The bank as a table, its evidence and its review live in memory/bank.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Generator
from dataclasses import dataclass

from rollwise.envs.schema import check_arguments
from rollwise.types import Observation, ToolCall, ToolSpec

SKILL_PREFIX = "run_"  # a skill tool is run_<its tools>_<n> (words a whole-word vocabulary has)
Expansion = Generator[ToolCall, Observation, Observation]  # yields calls, returns what is shown


@dataclass(frozen=True)
class SkillConfig:
    """Evidence rules of the bank."""

    mode: str = "managed"  # "managed" (demote, retire) or "append" (only ever adds)
    decay: float = 0.5  # weight of a policy version's evidence per version behind the newest
    min_evidence: float = 2.0  # decayed invocations before the rate may demote or retire
    demote_below: float = 0.5  # decayed success rate (Beta(1,1) prior) below which: demoted
    retire_below: float = 0.25  # ... below which: retired
    idle_rounds: int = 3  # rounds without an invocation before a skill is retired
    per_env: int = 4  # skills exposed per environment (active first, then demoted)


@dataclass(frozen=True)
class Skill:
    env_id: str
    params: dict  # argument -> JSON type ("string", "integer", ...)
    steps: list  # [{"tool": name, "arguments": {arg: slot}}]
    example: dict  # the arguments of the trajectory it was induced from

    @property
    def skill_id(self) -> str:
        blob = json.dumps([self.env_id, self.steps], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def name(self) -> str:
        tools = "_".join(dict.fromkeys(s["tool"] for s in self.steps))
        return f"{SKILL_PREFIX}{tools}_{int(self.skill_id, 16) % 1000}"

    def spec(self) -> ToolSpec:
        """The skill as a tool the policy may call."""
        chain = " -> ".join(s["tool"] for s in self.steps)
        props = {p: {"type": t} for p, t in self.params.items()}
        params = {"type": "object", "properties": props, "required": list(self.params)}
        return ToolSpec(self.name, f"Runs {chain}; returns every result.", params)


# ---------------------------------------------------------------------------- induction
def json_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {int: "integer", float: "number", str: "string"}.get(type(value), "string")


def slot_for(value, results: list, params: dict, example: dict, arg: str) -> dict:
    """Where `value` comes from: the latest earlier result that holds it, else an argument."""
    for k in reversed(range(len(results))):
        found = locate(value, results[k], params, example)
        if found is not None:
            return {"from": k, **found}
    name = next((p for p, v in example.items() if v == value), None) or unique(arg, example)
    params.setdefault(name, json_type(value))
    example.setdefault(name, value)
    return {"arg": name}


def locate(value, result, params: dict, example: dict) -> dict | None:
    """{"key": f} if result is an object whose field f is value; for a list of objects, the key
    plus a "where" selector on the element's first other text field (a new argument)."""
    if isinstance(result, dict):
        key = next((f for f, v in result.items() if v == value and not isinstance(v, bool)), None)
        return None if key is None else {"key": key}
    for item in result if isinstance(result, list) else []:
        if not isinstance(item, dict):
            continue
        key = next((f for f, v in item.items() if v == value), None)
        other = next((g for g, v in item.items() if g != key and isinstance(v, str)), None)
        if key is not None and other is not None:
            name = unique(other, example, item[other])
            params.setdefault(name, "string")
            example.setdefault(name, item[other])
            return {"key": key, "where": {other: {"arg": name}}}
    return None


def unique(name: str, example: dict, value=None) -> str:
    """`name`, or name_2, ... if taken by another value."""
    k, out = 1, name
    while out in example and example[out] != value:
        k, out = k + 1, f"{name}_{k + 1}"
    return out


def induce(env_id: str, calls: list[tuple[ToolCall, str]]) -> Skill:
    """The skill a trajectory (each call with its recorded result) abstracts."""
    params, example, results, steps = {}, {}, [], []
    for call, observation in calls:
        slots = {a: slot_for(v, results, params, example, a) for a, v in call.arguments.items()}
        steps.append({"tool": call.name, "arguments": slots})
        results.append(parse(observation))
    return Skill(env_id, params, steps, example)


def parse(content: str):
    try:
        return json.loads(content)
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------- expansion
class Unbound(Exception):
    """A slot whose value is not in the results the skill has seen (a stale skill)."""


def bind(slot: dict, args: dict, results: list):
    if "arg" in slot:
        return args[slot["arg"]]
    result = results[slot["from"]]
    if "where" in slot:
        want = {g: args[s["arg"]] for g, s in slot["where"].items()}
        items = result if isinstance(result, list) else []
        result = next((i for i in items if isinstance(i, dict)
                       and all(i.get(g) == v for g, v in want.items())), None)  # fmt: skip
    if not isinstance(result, dict) or slot["key"] not in result:
        raise Unbound(f"no {slot['key']} in the result of step {slot['from']}")
    return result[slot["key"]]


def error(message: str, kind: str = "tool_error") -> Observation:
    return Observation(json.dumps({"error": message}), kind)  # type: ignore[arg-type]


def expand(skill: Skill, args: dict) -> Expansion:
    """The skill's real calls, one at a time (each result is sent back in: later slots read
    it); returns the observation the policy sees: every result, or the first failure."""
    if problem := check_arguments(skill.spec(), args):
        return error(problem)
    results = []
    for k, step in enumerate(skill.steps):
        try:
            bound = {a: bind(s, args, results) for a, s in step["arguments"].items()}
        except Unbound as exc:
            return error(f"{skill.name} step {k}: {exc}")
        call = ToolCall(step["tool"], bound)
        obs = yield call
        if obs.kind != "ok":
            return error(f"{skill.name} step {k} ({call.name}): {obs.content}", obs.kind)
        results.append(parse(obs.content))
    return Observation(json.dumps({"skill": skill.name, "results": results}, separators=(",", ":")))


def drive(plan: Expansion, step: Callable[[ToolCall], Observation]):
    """Run an expansion synchronously through `step`: ([(call, observation)], shown)."""
    done = []
    try:
        call = next(plan)
        while True:
            obs = step(call)
            done.append((call, obs))
            call = plan.send(obs)
    except StopIteration as stop:
        return done, stop.value


# ---------------------------------------------------------------------------- as an action
@dataclass
class Skilled:
    """An episode's environment with skills as extra tools. The rollout engine expands a skill
    call through `expand` (envs/protocol.py `expansion`): each real call is executed, recorded,
    fingerprinted and costed as its own step, under the span of the turn that chose the skill,
    so step-level credit lands on that choice. Called directly (a replay, a test), `step` runs
    the expansion itself. Everything else is the wrapped environment's."""

    env: object
    skills: list  # Skill, this environment's exposed ones

    def tools(self) -> list[ToolSpec]:
        return [*self.env.tools(), *(s.spec() for s in self.skills)]

    def expand(self, call: ToolCall) -> Expansion | None:
        skill = next((s for s in self.skills if s.name == call.name), None)
        outer = getattr(self.env, "expand", None)  # a wrapped env may expand calls too
        if skill is None:
            return outer(call) if callable(outer) else None
        return expand(skill, call.arguments if isinstance(call.arguments, dict) else {})

    def step(self, call: ToolCall) -> Observation:
        plan = self.expand(call)
        return self.env.step(call) if plan is None else drive(plan, self.env.step)[1]

    def __getattr__(self, name: str):
        if name in ("env", "skills"):  # not set yet (copy/pickle): never recurse
            raise AttributeError(name)
        return getattr(self.env, name)
