"""SMITH's joint tool creation and use (seed 004) as one environment: every task is a build
task (a description and a few input/output examples -> a JSON schema and a Python function,
submitted with `define_tool`) or a use task (answer a question by calling a pooled tool).

A build episode is scored on three axes, each its own rubric criterion so each failure has its
own gradient: `schema_valid` (the schema names the tool and declares exactly the examples'
arguments with their JSON types), `examples_pass` (the code, run in the sandbox, returns every
example's output) and `answer_correct` (it returns the right output on held-out inputs the
prompt never showed: the outcome). A use episode is scored like any tool task: the answer.
Model-written code runs only in rollwise/sandbox (a separate, limited process), for the build
checks and for every call of a pooled tool alike; pooled tools are admitted on evidence
(envs/tool_pool.py).

Use it as a custom environment (`envs.custom: "rollwise.envs.toolsmith:toolsmith"`; the
use-only arm: `...:toolsmith_use_only`); bench/smith.py compares the two.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from rollwise.envs.rubric import normalize
from rollwise.sandbox import SandboxLimits, run_code
from rollwise.types import Observation, Rubric, Task, ToolCall, ToolSpec

MARK = "ROLLWISE-RESULTS "  # the checker's line in the sandbox's output
CHECK_LIMITS = SandboxLimits(cpu_s=2.0, wall_s=10.0, output_chars=4000, max_calls=0)
AXES = ("schema_valid", "examples_pass", "answer_correct")  # SMITH's three reward axes
WEIGHTS = {
    "schema_valid": 1.0,
    "examples_pass": 1.0,
    "answer_correct": 2.0,
    "state_correct": 0.0,
    "no_side_effects": 0.0,
}
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array"}
WORDS = (
    "ada",
    "grace",
    "alan",
    "linus",
    "barbara",
    "edsger",
    "donald",
    "margaret",
    "ken",
    "dennis",
    "river",
    "stone",
    "maple",
    "harbor",
    "silver",
    "north",
    "quiet",
    "amber",
    "delta",
    "orbit",
    "cedar",
    "lumen",
    "violet",
    "copper",
)


# The reference tools: plain functions whose source is the build oracle's code (so it runs in
# the sandbox under the same restrictions as a model's) and whose values are the expected ones.
# Families come in sibling pairs that share a tool name, schema and description and differ in
# one rule (a separator, a bound, a case rule): only a build's examples say which sibling it is,
# so a build must read them, and a tool recalled from another task fails them.
def slugify(title: str) -> str:
    return "-".join(title.lower().split())


def slugify_underscore(title: str) -> str:
    return "_".join(title.lower().split())


def initials(name: str) -> str:
    return "".join(word[0].upper() for word in name.split())


def initials_dotted(name: str) -> str:
    return "".join(word[0].upper() + "." for word in name.split())


def total_above(amounts: list, threshold: int) -> int:
    return sum(a for a in amounts if a > threshold)


def total_excess(amounts: list, threshold: int) -> int:
    return sum(a - threshold for a in amounts if a > threshold)


def count_letter(text: str, letter: str) -> int:
    return text.lower().count(letter.lower())


def count_letter_exact(text: str, letter: str) -> int:
    return text.count(letter)


def with_tax(price: int, percent: int) -> float:
    return round(price * (100 + percent) / 100, 2)


def with_tax_whole(price: int, percent: int) -> int:
    return round(price * (100 + percent) / 100)


def reverse_words(text: str) -> str:
    return " ".join(reversed(text.split()))


def reverse_each_word(text: str) -> str:
    return " ".join(word[::-1] for word in text.split())


def padded_id(number: int, width: int) -> str:
    return "ID-" + str(number).zfill(width)


def padded_id_hash(number: int, width: int) -> str:
    return "ID#" + str(number).zfill(width)


def clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def clamp_below_high(value: int, low: int, high: int) -> int:
    return max(low, min(high - 1, value))


def phrase(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS).capitalize() for _ in range(n))


@dataclass(frozen=True)
class Family:
    """One tool to build and use: its reference, what the prompt says, how inputs are drawn.
    `tool` is the name the policy sees (a sibling pair shares it); `key` (the reference's own
    name) tells the pair apart in task ids, env ids and the pool."""

    fn: Callable
    description: str
    question: str  # a use task's question, formatted with the arguments
    draw: Callable[[random.Random], dict]
    tool: str = ""  # "": the reference's own name
    sibling: str = ""  # the key of the family sharing this one's tool name

    @property
    def key(self) -> str:
        return self.fn.__name__

    @property
    def name(self) -> str:
        return self.tool or self.fn.__name__

    def schema(self) -> dict:
        """The reference schema (OpenAI function style), types from the annotations."""
        hints = {str: "string", int: "integer", list: "array", float: "number"}
        params = inspect.signature(self.fn).parameters
        props = {k: {"type": hints[eval_hint(p.annotation)]} for k, p in params.items()}
        return {
            "name": self.name,
            "description": self.description,
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        }

    def source(self) -> str:
        """The reference's code, its function named as the tool is."""
        return inspect.getsource(self.fn).replace(f"def {self.key}(", f"def {self.name}(", 1)


def eval_hint(annotation) -> type:
    """`from __future__ import annotations` keeps hints as strings: the builtin they name."""
    return {"str": str, "int": int, "list": list, "float": float}.get(annotation, annotation)


def pair(first: Callable, second: Callable, description: str, question: str, draw) -> list:
    """Two sibling families: one tool name, description, question and input draw, two rules."""
    return [
        Family(first, description, question, draw, sibling=second.__name__),
        Family(second, description, question, draw, first.__name__, first.__name__),
    ]


def draw_amounts(r: random.Random) -> dict:
    amounts = [r.randint(1, 99) for _ in range(r.randint(3, 6))]
    return {"amounts": amounts, "threshold": r.randint(10, 60)}


def draw_range(r: random.Random) -> dict:
    return {"value": r.randint(-50, 150), "low": r.randint(0, 20), "high": r.randint(60, 100)}


FAMILIES: dict[str, Family] = {
    f.key: f
    for f in (
        *pair(
            slugify,
            slugify_underscore,
            "lowercase a title and join its words with a separator",
            "What is the URL slug of the title '{title}'?",
            lambda r: {"title": phrase(r, r.randint(2, 4))},
        ),
        *pair(
            initials,
            initials_dotted,
            "the initials of a name, upper case",
            "What are the initials of {name}?",
            lambda r: {"name": phrase(r, r.randint(2, 3))},
        ),
        *pair(
            total_above,
            total_excess,
            "a total over the amounts strictly greater than the threshold",
            "What is the total of the amounts {amounts} above {threshold}?",
            draw_amounts,
        ),
        *pair(
            count_letter,
            count_letter_exact,
            "how often a letter occurs in a text",
            "How many times does the letter '{letter}' occur in '{text}'?",
            lambda r: {"text": phrase(r, 3), "letter": r.choice("aeinorst")},
        ),
        *pair(
            with_tax,
            with_tax_whole,
            "a price with a percentage tax added, rounded",
            "What is {price} with {percent}% tax?",
            lambda r: {"price": r.randint(5, 500), "percent": r.choice([5, 8, 12, 20, 25])},
        ),
        *pair(
            reverse_words,
            reverse_each_word,
            "the text reversed word by word",
            "What is '{text}' with its words reversed?",
            lambda r: {"text": phrase(r, r.randint(2, 4))},
        ),
        *pair(
            padded_id,
            padded_id_hash,
            "'ID', a mark, then the number zero-padded to the width",
            "What is the ID of number {number} padded to width {width}?",
            lambda r: {"number": r.randint(1, 999), "width": r.randint(4, 6)},
        ),
        *pair(
            clamp,
            clamp_below_high,
            "the value limited to the range given by low and high",
            "What is {value} clamped to [{low}, {high}]?",
            draw_range,
        ),
    )
}


def telling_cases(family: Family, rng: random.Random, n: int = 7, shown: int = 3) -> list[dict]:
    """`n` inputs that tell the family from its sibling in both parts, the first `shown` (a
    build's examples) and the rest (its held-out inputs): each part has an input whose output
    differs under the sibling's rule (redrawn until it does)."""
    other = FAMILIES.get(family.sibling)

    def tells(part: list[dict]) -> bool:
        return not part or any(family.fn(**c) != other.fn(**c) for c in part)

    for _ in range(1000):
        cases = [family.draw(rng) for _ in range(n)]
        if other is None or (tells(cases[:shown]) and tells(cases[shown:])):
            return cases
    raise RuntimeError(f"{family.key}: no draw tells it from {family.sibling}")


def call_text(name: str, args: dict) -> str:
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


def build_prompt(family: Family, examples: list[dict]) -> str:
    shown = "\n".join(f"{call_text(family.name, e['args'])} -> {e['out']!r}" for e in examples)
    return (
        f"Write a tool named {family.name}: {family.description}.\nExamples:\n{shown}\n"
        "Submit it with define_tool(schema, code): a JSON schema and a Python function."
    )


def make_tasks(
    seed: int = 0,
    per_family: int = 12,
    heldout_share: float = 0.25,
    families: tuple[str, ...] = tuple(FAMILIES),
    kinds=("build", "use"),
) -> list[Task]:
    """`per_family` tasks of each kind per family (env_id `smith-<family>`); a share of each
    family's tasks is held out. Build tasks show 3 examples and keep 4 held-out inputs."""
    tasks = []
    for name in families:
        family = FAMILIES[name]
        rng = random.Random(f"{seed}/{name}")
        for i in range(per_family):
            split = "heldout" if i < round(per_family * heldout_share) else "train"
            cases = telling_cases(family, rng)
            io = [{"args": a, "out": family.fn(**a)} for a in cases]
            if "build" in kinds:
                schema, code = family.schema(), family.source()
                tasks.append(
                    Task(
                        f"{name}-build-{i}",
                        f"smith-{name}",
                        "build",
                        build_prompt(family, io[:3]),
                        (ToolCall("define_tool", {"schema": schema, "code": code}),),
                        f"defined {family.name}",
                        split,
                        target={"examples": io[:3], "heldout": io[3:]},
                    )
                )
            if "use" in kinds:
                ask = io[0]
                tasks.append(
                    Task(
                        f"{name}-use-{i}",
                        f"smith-{name}",
                        "use",
                        family.question.format(**ask["args"]),
                        (ToolCall(family.name, ask["args"]),),
                        answer_text(ask["out"]),
                        split,
                    )
                )
    return tasks


def answer_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def schema_errors(schema: object, name: str, example_args: dict) -> list[str]:
    """What is wrong with a submitted schema for a tool `name` taking `example_args`."""
    if not isinstance(schema, dict):
        return ["schema is not an object"]
    errors = [] if schema.get("name") == name else [f"schema name is not {name!r}"]
    params = schema.get("parameters")
    props = params.get("properties") if isinstance(params, dict) else None
    if not isinstance(props, dict):
        return [*errors, "schema has no parameters.properties"]
    if set(props) != set(example_args):
        errors.append(f"parameters {sorted(props)} != the examples' {sorted(example_args)}")
    for key, value in example_args.items():
        declared = props.get(key, {}).get("type") if isinstance(props.get(key), dict) else None
        if key in props and declared != JSON_TYPES.get(type(value)):
            errors.append(f"{key}: type {declared!r}, the examples pass {JSON_TYPES[type(value)]}")
    return errors


def run_cases(
    code: str, name: str, cases: list[dict], limits: SandboxLimits = CHECK_LIMITS
) -> tuple[list[object], str | None]:
    """`name(**args)` for each case, run in the sandbox after `code`: (each case's value, or
    None where it raised; the sandbox's error, if the code did not get that far). The cases are
    JSON data (ours, or a call's parsed arguments), written into the checker as Python literals."""
    if not name.isidentifier() or name.startswith("_"):
        return [None] * len(cases), f"not a function name: {name!r}"
    thunks = ", ".join(f"lambda: {call_text(name, args)}" for args in cases)  # repr: literals
    checker = (
        "\n\nimport json\ndef rollwise_case(thunk):\n    try:\n        return [thunk()]\n"
        f"    except Exception:\n        return None\n"
        f"print({MARK!r} + json.dumps([rollwise_case(t) for t in [{thunks}]], default=str))\n"
    )
    result = run_code(code + checker, {}, lambda *_: Observation("no tools", "tool_error"), limits)
    lines = [x for x in result.text.splitlines() if x.startswith(MARK)]
    if not lines:
        return [None] * len(cases), result.error or "the code printed no results"
    try:
        values = json.loads(lines[-1][len(MARK) :])
    except json.JSONDecodeError:
        return [None] * len(cases), "the results line was cut"
    if not isinstance(values, list) or len(values) != len(cases):
        return [None] * len(cases), "the results line does not match the cases"
    return [v[0] if isinstance(v, list) and len(v) == 1 else None for v in values], None


def same(value: object, expected: object) -> bool:
    """Equal as JSON would carry them (a float result equal to an int one counts)."""
    if isinstance(expected, float) or isinstance(value, float):
        return isinstance(value, int | float) and abs(value - expected) < 1e-9
    return value == expected and type(value) is type(expected)


DEFINE_TOOL = ToolSpec(
    "define_tool",
    "Submit a tool: its JSON schema (name, description, parameters) and Python code defining "
    "a function of that name. Returns how it did on the examples.",
    {
        "type": "object",
        "properties": {"schema": {"type": "object"}, "code": {"type": "string"}},
        "required": ["schema", "code"],
    },
)


class Toolsmith:
    """Build and use tasks over FAMILIES (envs/protocol.py's Environment and TaskSource).
    `pool`: the tools use tasks call (envs/tool_pool.py); None: the reference tools."""

    def __init__(self, seed: int = 0, per_family: int = 12, kinds=("build", "use"), pool=None):
        self.seed, self.per_family, self.kinds, self.pool = seed, per_family, kinds, pool

    def tasks(self) -> list[Task]:
        return make_tasks(self.seed, self.per_family, kinds=self.kinds)

    def family(self) -> Family:
        return FAMILIES[self.task.env_id.removeprefix("smith-")]

    def tools(self) -> list[ToolSpec]:
        if self.task.kind == "build":
            return [DEFINE_TOOL]
        schema = self.family().schema()
        return [ToolSpec(schema["name"], schema["description"], schema["parameters"])]

    def reset(self, task: Task, seed: int) -> list[dict]:
        self.task, self.submitted, self.last = task, None, ""
        system = (
            "You write tools: define one with define_tool, then reply done."
            if task.kind == "build"
            else "Call the tool, then reply with its answer."
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": task.prompt}]

    def step(self, call: ToolCall) -> Observation:
        obs = self.define(call) if self.task.kind == "build" else self.use(call)
        self.last = obs.content
        return obs

    def define(self, call: ToolCall) -> Observation:
        if call.name != "define_tool":
            return Observation(json.dumps({"error": f"unknown tool {call.name!r}"}), "tool_error")
        schema, code = call.arguments.get("schema"), call.arguments.get("code")
        if not isinstance(code, str):
            return Observation(json.dumps({"error": "code must be a string"}), "tool_error")
        examples = self.task.target["examples"]
        name = self.family().name
        errors = schema_errors(schema, name, examples[0]["args"])
        values, error = run_cases(code, name, [e["args"] for e in examples])
        passed = [same(v, e["out"]) for v, e in zip(values, examples, strict=True)]
        self.submitted = {
            "schema": schema,
            "code": code,
            "schema_errors": errors,
            "examples_passed": sum(passed),
        }
        report = {"schema": errors or "ok", "examples_passed": f"{sum(passed)}/{len(passed)}"}
        if error:
            report["error"] = error[:300]
        kind = "ok" if not errors and all(passed) else "tool_error"
        return Observation(json.dumps(report), kind)

    def use(self, call: ToolCall) -> Observation:
        family = self.family()
        if call.name != family.name:
            return Observation(json.dumps({"error": f"unknown tool {call.name!r}"}), "tool_error")
        expected = set(inspect.signature(family.fn).parameters)
        if set(call.arguments) != expected:
            return Observation(
                json.dumps({"error": f"arguments must be {sorted(expected)}"}), "tool_error"
            )
        code = self.pool.code(family.key) if self.pool is not None else None
        values, error = run_cases(code or family.source(), family.name, [call.arguments])
        if values[0] is None:
            return Observation(json.dumps({"error": error or "the tool raised"}), "tool_error")
        return Observation(json.dumps({"result": values[0]}))

    def fingerprint(self) -> str:
        blob = json.dumps([self.task.task_id, self.submitted, self.last], default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def verify(self, answer: str | None, calls: list[ToolCall]) -> Rubric:
        if self.task.kind == "use":
            right = float(normalize(answer) == normalize(self.task.answer))
            return Rubric(
                {"answer_correct": right, "state_correct": 1.0, "no_side_effects": 1.0},
                {"answer_correct": 1.0},
            )
        scores = dict.fromkeys(AXES, 0.0) | {"state_correct": 0.0, "no_side_effects": 1.0}
        if self.submitted is not None:
            examples, held = self.task.target["examples"], self.task.target["heldout"]
            scores["schema_valid"] = float(not self.submitted["schema_errors"])
            scores["examples_pass"] = self.submitted["examples_passed"] / len(examples)
            values, _ = run_cases(
                self.submitted["code"], self.family().name, [h["args"] for h in held]
            )
            outcome = all(same(v, h["out"]) for v, h in zip(values, held, strict=True))
            scores["answer_correct"] = float(outcome)
            scores["state_correct"] = scores["schema_valid"]  # what the pool would admit
        return Rubric(scores, WEIGHTS)


def toolsmith() -> Toolsmith:
    """The zero-argument factory for `envs.custom`: build and use tasks."""
    return Toolsmith()


def toolsmith_use_only() -> Toolsmith:
    """The use-only arm: the same use tasks, no build tasks."""
    return Toolsmith(kinds=("use",))
