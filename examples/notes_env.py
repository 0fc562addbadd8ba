"""A worked example of bringing your own environment (README, "Bring your own environment").

A notebook of notes held in a plain dict: no SQLite and no generator, only the Environment
protocol (rollwise/envs/protocol.py) plus `tasks()`. To run the whole pipeline on it, name its
factory in params.yaml:

    envs:
      custom: "examples.notes_env:make_env"
"""

from __future__ import annotations

import hashlib
import json

from rollwise.envs.rubric import WEIGHTS, normalize
from rollwise.envs.schema import check_call
from rollwise.types import Observation, Rubric, Task, ToolCall, ToolSpec

NOTES = {
    "door": "code 4521",
    "garden": "water the roses",
    "groceries": "milk and eggs",
    "car": "service in may",
}


def key_schema(**extra: dict) -> dict:
    props = {"key": {"type": "string"}, **extra}
    return {"type": "object", "properties": props, "required": list(props)}


TOOLS = [
    ToolSpec("read_note", "Read the note stored under a key.", key_schema()),
    ToolSpec("write_note", "Replace a note's text.", key_schema(text={"type": "string"})),
]


class NotesEnv:
    """Episodes run on shallow copies of one instance: per-episode state is made in reset."""

    def __init__(self, notes: dict[str, str] | None = None):
        self.notes0 = dict(notes or NOTES)

    def tasks(self) -> list[Task]:
        """Per note: read it (1 call), and overwrite it replying with the old text (2 calls)."""
        out = []
        for i, (key, text) in enumerate(sorted(self.notes0.items())):
            read = ToolCall("read_note", {"key": key})
            write = ToolCall("write_note", {"key": key, "text": "done"})
            split = "heldout" if i == 0 else "train"
            out += [
                Task(f"notes/read_{key}", "notes", "read", f"What does the {key} note say?",
                     (read,), text, split),
                Task(f"notes/clear_{key}", "notes", "clear",
                     f"Change the {key} note to done and reply with its old text.",
                     (read, write), text, split, writes=True, target={"key": key, "text": "done"}),
            ]  # fmt: skip
        return out

    def tools(self) -> list[ToolSpec]:
        return list(TOOLS)

    def reset(self, task: Task, seed: int) -> list[dict]:
        self.task, self.notes, self.kinds, self.last = task, dict(self.notes0), [], ""
        system = "You keep the notes. Call tools, then reply with the answer."
        return [{"role": "system", "content": system}, {"role": "user", "content": task.prompt}]

    def step(self, call: ToolCall) -> Observation:
        error = check_call({t.name: t for t in TOOLS}, call.name, call.arguments)
        if error is None and call.arguments["key"] not in self.notes:
            error = f"not found: {call.arguments['key']}"
        if error is not None:
            obs = Observation(json.dumps({"error": error}), "tool_error")
        elif call.name == "read_note":
            obs = Observation(json.dumps({"text": self.notes[call.arguments["key"]]}))
        else:
            self.notes[call.arguments["key"]] = call.arguments["text"]
            obs = Observation(json.dumps({"key": call.arguments["key"], "saved": True}))
        self.kinds.append(obs.kind)
        self.last = obs.content
        return obs

    def fingerprint(self) -> str:
        blob = json.dumps([sorted(self.notes.items()), self.last])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def verify(self, answer: str | None, calls: list[ToolCall]) -> Rubric:
        """Read from the notes themselves: the target note holds its new text, no other changed."""
        target = self.task.target
        changed = {k for k, v in self.notes.items() if v != self.notes0.get(k)}
        n = len(self.kinds)
        scores = {
            "answer_correct": float(normalize(answer) == normalize(self.task.answer)),
            "state_correct": float(not target or self.notes[target["key"]] == target["text"]),
            "no_side_effects": float(changed <= ({target["key"]} if target else set())),
            "calls_valid": self.kinds.count("ok") / n if n else 1.0,
            "efficiency": min(1.0, len(self.task.oracle) / n) if n else 0.0,
        }
        return Rubric(scores=scores, weights=WEIGHTS)


def make_env() -> NotesEnv:
    """The factory params.yaml names (`envs.custom`): no arguments, one prototype environment."""
    return NotesEnv()
