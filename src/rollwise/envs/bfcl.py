"""BFCL multi-turn adapter: the Berkeley Function-Calling Leaderboard's multi-turn categories
(base, miss_func, miss_param, long_context) as an Environment.

BFCL's own API classes (`pip install --no-deps bfcl-eval`; they need only the standard library
and mpmath) hold the state. Each entry's initial_config builds fresh instances, their function
docs are the tools, and the user turns are fed in order (`next_turn`). A call runs by name on a
whitelist, the documented public methods of the entry's instances, with arguments checked
against the doc's schema first; nothing is ever eval'd. The ground truth's call strings are
parsed with `ast` (arguments by `ast.literal_eval`) and run through the same executor. Where
BFCL's executor answers a call with "Error during execution: ..." before running anything (an
argument the function lacks, one missing, a function that does not exist, a call that does not
compile), so do we, to the policy and for the ground truth alike (envs/bfcl_exec.py): such a
ground-truth call is an expected error result, not a reason to drop the entry. Instances load
with the long_context flag BFCL's checker sets for the entry's category.

Verification follows BFCL's multi_turn_checker: after every turn whose ground truth is not
empty, (1) the model called something in that turn, (2) every instance's public attributes
equal those of instances that ran the ground truth up to that turn (state check), and (3) the
ground truth's results of that turn are all among the model's results so far, as a multiset in
any order (response check). The episode passes when every such turn passes all three.

Departures from BFCL's inference loop: (a) in miss_func, the held-out functions are revealed by
listing their docs in the user message (BFCL's prompting-mode wording), since our prompt's tool
list is tokenized once; (b) MathAPI's precision arguments are capped and its int ** int bounded,
and calls run one at a time with mpmath's and decimal's precision restored afterwards: those are
process-wide settings a call would otherwise change for every other episode.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib
import inspect
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from rollwise.envs.rubric import WEIGHTS
from rollwise.envs.schema import check_call
from rollwise.types import Observation, Rubric, Task, ToolCall, ToolSpec

try:
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
    from bfcl_eval.constants.executable_backend_config import (
        CLASS_FILE_PATH_MAPPING,
        MULTI_TURN_FUNC_DOC_FILE_MAPPING,
        STATELESS_CLASSES,
    )

    from rollwise.envs.bfcl_exec import call_method, execute, executor_error, hazard, parse_call
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        f"envs/bfcl.py needs bfcl-eval and mpmath ({e}): "
        ".venv/bin/pip install -c constraints.txt mpmath && "
        ".venv/bin/pip install --no-deps -c constraints.txt bfcl-eval"
    ) from e

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
SYSTEM = (
    "Call the functions you need to do what the user asks. When the request is done, reply "
    "without a tool call."
)
GORILLA_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}
# Where BFCL's own ground truth contradicts its docs (multi_turn_*_173 closes ticket
# 'ticket_001', documented as an integer): the type both accept.
ERRATA = {("close_ticket", "ticket_id"): ["integer", "string"]}


@dataclass(frozen=True)
class Entry:
    """One BFCL multi-turn test entry and its ground truth."""

    id: str
    category: str
    turns: list[list[dict]]  # user messages per turn; [] is a miss_func reveal turn
    initial_config: dict
    classes: list[str]
    missed: dict[int, list[str]]  # turn -> names of the functions withheld until then
    ground_truth: list[list[str]]  # BFCL's call strings per turn


def data_dir() -> Path:
    return Path(str(files("bfcl_eval") / "data"))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_entries(category: str) -> list[Entry]:
    """The entries of one category, as shipped in the bfcl-eval wheel (no network)."""
    if category not in CATEGORIES:
        raise ValueError(f"BFCL category {category!r} is not one of {CATEGORIES}")
    name = f"BFCL_v4_multi_turn_{category}.json"
    answers = {
        a["id"]: a["ground_truth"] for a in read_jsonl(data_dir() / "possible_answer" / name)
    }
    return [
        Entry(
            q["id"],
            category,
            q["question"],
            q["initial_config"],
            q["involved_classes"],
            {int(k): v for k, v in q.get("missed_function", {}).items()},
            answers[q["id"]],
        )
        for q in read_jsonl(data_dir() / name)
    ]


@functools.cache
def func_docs(class_name: str) -> tuple[dict, ...]:
    path = data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    return tuple(read_jsonl(path))


def to_schema(gorilla: dict) -> dict:
    """BFCL's parameter schema in JSON-schema types (dict -> object, float -> number, ...)."""
    out = {k: v for k, v in gorilla.items() if k in ("description", "required", "enum")}
    typ = GORILLA_TYPES.get(gorilla.get("type"), gorilla.get("type"))
    if typ:
        out["type"] = typ
    if "properties" in gorilla:
        out["properties"] = {k: to_schema(v) for k, v in gorilla["properties"].items()}
    if "items" in gorilla:
        out["items"] = to_schema(gorilla["items"])
    return out


def to_spec(doc: dict) -> ToolSpec:
    schema = to_schema(doc["parameters"])
    for (name, arg), types in ERRATA.items():
        if name == doc["name"]:
            schema["properties"][arg]["type"] = types
    return ToolSpec(doc["name"], doc["description"], schema)


def long_context(entry_id: str) -> bool:
    """The flag BFCL's checker and inference loop load every instance with, from the id."""
    group = entry_id.rsplit("_", 1)[0]
    return "long_context" in group or "composite" in group


def build_instances(entry: Entry) -> dict[str, object]:
    """Fresh API instances loaded from the entry's initial_config, as BFCL builds them."""
    out = {}
    for name in entry.classes:
        instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)()
        if name not in STATELESS_CLASSES:
            config = copy.deepcopy(entry.initial_config.get(name, {}))
            instance._load_scenario(config, long_context=long_context(entry.id))
        out[name] = instance
    return out


def whitelist(instances: dict[str, object]) -> dict[str, Callable]:
    """Name -> bound method, for the documented public methods only (a later class wins a
    clash of names, as in BFCL)."""
    out = {}
    for class_name, instance in instances.items():
        for doc in func_docs(class_name):
            name = doc["name"]
            if not name.startswith("_") and inspect.isfunction(getattr(type(instance), name, None)):
                out[name] = getattr(instance, name)
    return out


def public_state(instances: dict[str, object]) -> dict[str, dict]:
    """What BFCL's state check compares: every instance's attributes not starting with _."""
    return {
        name: {k: v for k, v in vars(inst).items() if not k.startswith("_")}
        for name, inst in instances.items()
    }


def plain(value: object, path: tuple = ()) -> object:
    """JSON-able, deterministic form of a state (objects by their public attributes; a
    back-reference such as a directory's parent becomes "^")."""
    if any(value is p for p in path):
        return "^"
    if isinstance(value, dict):
        return {str(k): plain(v, (*path, value)) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [plain(v, (*path, value)) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    if hasattr(value, "__dict__") and not isinstance(value, type):
        public = {k: v for k, v in vars(value).items() if not k.startswith("_")}
        return {"__class__": type(value).__name__, **plain(public, (*path, value))}
    return value if isinstance(value, str | int | float | bool | type(None)) else str(value)


@dataclass(frozen=True)
class Expected:
    """The ground truth executed: results per turn, public state after each turn."""

    results: list[list[str]]
    states: list[dict]


def oracle_of(entry: Entry) -> list[list[ToolCall]]:
    methods = whitelist(build_instances(entry))
    return [[parse_call(s, methods) for s in turn] for turn in entry.ground_truth]


def expected_of(entry: Entry) -> Expected:
    instances = build_instances(entry)
    methods = whitelist(instances)
    results, states = [], []
    for turn in oracle_of(entry):
        results.append([execute(methods, c)[0] for c in turn])
        states.append(copy.deepcopy(public_state(instances)))
    return Expected(results, states)


def contains_all(found: list[str], wanted: list[str]) -> bool:
    """Every wanted item among `found`, as a multiset, in any order (BFCL's response check)."""
    left = list(found)
    for item in wanted:
        if item not in left:
            return False
        left.remove(item)
    return True


class BFCLEnv:
    """All entries of the chosen categories; a task is one entry (env_id bfcl_<category>)."""

    oracle_errors_ok = True  # an oracle call may be answered with an error: generate.py

    def __init__(self, categories: Iterable[str] = CATEGORIES, ids: Iterable[str] | None = None):
        keep = set(ids) if ids is not None else None
        self.entries = {
            e.id: e for c in categories for e in load_entries(c) if keep is None or e.id in keep
        }
        self.expected: dict[str, Expected] = {}  # ground truth runs, cached (copies share it)
        self.skipped: dict[str, str] = {}  # entries tasks() leaves out, with the reason
        self.entry: Entry | None = None

    def tasks(self) -> list[Task]:
        """A task per entry whose ground truth we can run; the others, with the reason, are
        left in `self.skipped` (a call BFCL would evaluate as an expression: parse_call)."""
        out, self.skipped = [], {}
        for entry in self.entries.values():
            try:
                out.append(self.task_of(entry))
            except ValueError as e:
                self.skipped[entry.id] = str(e)
        return out

    def task_of(self, entry: Entry) -> Task:
        turns = oracle_of(entry)
        return Task(
            task_id=entry.id,
            env_id=f"bfcl_{entry.category}",
            kind=entry.category,
            prompt=entry.turns[0][-1]["content"],
            oracle=tuple(c for turn in turns for c in turn),
            answer="",  # BFCL checks state and results, not the final text
            split="heldout",
            writes=True,
            target={"turn_calls": [len(turn) for turn in turns]},
        )

    def oracle_turns(self, task: Task) -> list[list[ToolCall]]:
        calls, out = iter(task.oracle), []
        for n in task.target["turn_calls"]:
            out.append([next(calls) for _ in range(n)])
        return out

    def tools(self) -> list[ToolSpec]:
        if self.entry is None:
            return []
        return [
            to_spec(doc)
            for name in self.entry.classes
            for doc in func_docs(name)
            if doc["name"] not in self.hidden
        ]

    def reset(self, task: Task, seed: int) -> list[dict]:
        self.entry = self.entries[task.task_id]
        self.instances = build_instances(self.entry)
        self.methods = whitelist(self.instances)
        self.hidden = {n for names in self.entry.missed.values() for n in names}
        # Hidden functions are left out of the tool list, not out of the executor: BFCL's own
        # ground truth calls one before its reveal (multi_turn_miss_func_49).
        self.specs = {d["name"]: to_spec(d) for c in self.entry.classes for d in func_docs(c)}
        self.turn, self.calls, self.results, self.kinds = 0, [[]], [[]], []
        self.states: list[dict] = []  # public state at the end of each finished turn
        self.last = ""
        return [{"role": "system", "content": SYSTEM}, *self.entry.turns[0]]

    def step(self, call: ToolCall) -> Observation:
        """BFCL's executor's answer where it answers with an error before running anything
        (bfcl_exec); else our schema and hazard checks, then the method."""
        content = executor_error(self.methods, call)
        ok = False
        if content is None:
            error = check_call(self.specs, call.name, call.arguments)
            error = error or hazard(call.name, call.arguments)
            if error is not None:
                content = json.dumps({"error": error})
            else:
                content, ok = call_method(self.methods[call.name], call.arguments)
        self.calls[-1].append(call)
        self.results[-1].append(content)
        self.kinds.append("ok" if ok else "tool_error")
        self.last = content
        return Observation(content, self.kinds[-1])

    def next_turn(self, answer: str | None) -> list[dict] | None:
        """The next user turn, or None after the last. A miss_func reveal turn lists the
        functions it adds, then asks again in BFCL's words."""
        if self.turn + 1 >= len(self.entry.turns):
            return None
        self.states.append(copy.deepcopy(public_state(self.instances)))
        self.turn += 1
        self.calls.append([])
        self.results.append([])
        messages = self.entry.turns[self.turn]
        if self.turn in self.entry.missed:
            added = set(self.entry.missed[self.turn])
            self.hidden -= added
            docs = json.dumps([self.specs[n].to_openai() for n in sorted(added)])
            prompt = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
            messages = [*messages, {"role": "user", "content": f"{docs}\n{prompt}"}]
        return messages

    def fingerprint(self) -> str:
        blob = json.dumps([plain(public_state(self.instances)), self.turn, self.last])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def verify(self, answer: str | None, calls: list[ToolCall]) -> Rubric:
        """BFCL's checks per turn whose ground truth is not empty (module docstring). Criteria:
        answer_correct = share of those turns passing the response check (with a call made in
        the turn), state_correct = share passing the state check, no_side_effects = the final
        state check; success (all three 1.0) is exactly BFCL's verdict."""
        entry = self.entry
        if entry.id not in self.expected:
            self.expected[entry.id] = expected_of(entry)
        want = self.expected[entry.id]
        states = [*self.states, public_state(self.instances)]
        found, responses, state_ok = [], [], []
        for t, gt_turn in enumerate(entry.ground_truth):
            reached = t < len(states)
            found += self.results[t] if reached else []
            if not gt_turn:
                continue
            responded = reached and bool(self.calls[t])
            responses.append(responded and contains_all(found, want.results[t]))
            state_ok.append(reached and states[t] == want.states[t])
        if len(states) < len(entry.turns):  # BFCL fails a conversation cut short
            responses.append(False)
        n_calls, n_gt = len(self.kinds), sum(map(len, entry.ground_truth))
        scores = {
            "answer_correct": sum(responses) / len(responses) if responses else 1.0,
            "state_correct": sum(state_ok) / len(state_ok) if state_ok else 1.0,
            "no_side_effects": float(state_ok[-1]) if state_ok else 1.0,
            "calls_valid": self.kinds.count("ok") / n_calls if n_calls else 1.0,
            "efficiency": min(1.0, n_gt / n_calls) if n_calls else 0.0,
        }
        return Rubric(scores=scores, weights=WEIGHTS)


def replay(env: BFCLEnv, task: Task, turns: list[list[ToolCall]]) -> Rubric:
    """A scripted episode: turn t's calls, then a reply without calls, for every user turn."""
    env.reset(task, seed=0)
    for t, calls in enumerate(turns):
        if t and env.next_turn("") is None:
            break
        for call in calls:
            env.step(call)
    while env.next_turn("") is not None:  # turns the script has no calls for
        pass
    return env.verify("", [c for turn in turns for c in turn])


def make_env() -> BFCLEnv:
    """Factory for params.yaml: `envs.custom: "rollwise.envs.bfcl:make_env"`."""
    return BFCLEnv()
