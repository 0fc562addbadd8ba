"""Executes tool calls against an environment's SQLite state. Errors become observations."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rollwise.envs import rubric
from rollwise.envs.generate import CANCELLED, DOMAINS, Domain, domain_tools, load_tasks
from rollwise.types import Observation, Rubric, Task, ToolCall, ToolSpec

JSON_TYPES = {"integer": int, "string": str}


class ToolError(Exception):
    """The policy called a tool wrongly; shown to it as an observation."""


class SyntheticEnv:
    """One generated environment: a fresh in-memory copy of its database per episode."""

    def __init__(self, env_dir: Path):
        meta = json.loads((Path(env_dir) / "env.json").read_text())
        self.env_id: str = meta["env_id"]
        self.domain: Domain = DOMAINS[meta["domain"]]
        self.state0 = (Path(env_dir) / "state.sqlite").read_bytes()
        self.specs = {t.name: t for t in domain_tools(self.domain)}
        d = self.domain
        self.handlers = {  # tool name -> method name (copies of this env share the table)
            f"find_{d.owner}": "_find",
            f"get_{d.owner}": "_get_owner",
            f"list_{d.record}s": "_list",
            f"get_{d.record}": "_get_record",
            f"cancel_{d.record}": "_cancel",
        }
        self.con: sqlite3.Connection | None = None

    def tools(self) -> list[ToolSpec]:
        return list(self.specs.values())

    def reset(self, task: Task, seed: int) -> list[dict]:
        self.con = sqlite3.connect(":memory:", check_same_thread=False)
        self.con.deserialize(self.state0)
        self.task, self.call_kinds, self.last = task, [], ""
        self.rows_before = self.rows()
        system = f"You are the {self.domain.record} desk. Call tools, then reply with the answer."
        return [{"role": "system", "content": system}, {"role": "user", "content": task.prompt}]

    def step(self, call: ToolCall) -> Observation:
        try:
            obs = Observation(json.dumps(self.execute(call), separators=(",", ":")))
        except ToolError as e:
            obs = Observation(json.dumps({"error": str(e)}), "tool_error")
        except Exception as e:  # a broken environment is not the policy's fault
            obs = Observation(
                json.dumps({"error": f"environment: {type(e).__name__}"}), "env_error"
            )
        self.call_kinds.append(obs.kind)
        self.last = obs.content
        return obs

    def fingerprint(self) -> str:
        """Database content plus the latest observation: what the next action depends on."""
        blob = json.dumps(sorted(self.rows().items()), default=str) + self.last
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def verify(self, answer: str | None, calls: list[ToolCall]) -> Rubric:
        return rubric.score(self.task, answer, self.rows_before, self.rows(), self.call_kinds)

    # --- tool semantics -------------------------------------------------------------------
    def rows(self) -> dict[tuple, tuple]:
        d, out = self.domain, {}
        for table in (f"{d.owner}s", f"{d.record}s"):
            for row in self.con.execute(f"SELECT * FROM {table}"):
                out[(table, row[0])] = row
        return out

    def execute(self, call: ToolCall) -> dict | list:
        spec = self.specs.get(call.name)
        if spec is None:
            raise ToolError(f"unknown tool {call.name}")
        (arg,) = spec.parameters["required"]
        if not isinstance(call.arguments, dict) or set(call.arguments) != {arg}:
            raise ToolError(f"{call.name} takes exactly one argument: {arg}")
        value = call.arguments[arg]
        typ = JSON_TYPES[spec.parameters["properties"][arg]["type"]]
        if not isinstance(value, typ) or isinstance(value, bool):
            raise ToolError(f"{arg} must be {spec.parameters['properties'][arg]['type']}")
        return getattr(self, self.handlers[call.name])(value)

    def _one(self, sql: str, value) -> tuple:
        row = self.con.execute(sql, (value,)).fetchone()
        if row is None:
            raise ToolError(f"not found: {value}")
        return row

    def _find(self, name: str) -> dict:
        d = self.domain
        (oid,) = self._one(f"SELECT id FROM {d.owner}s WHERE name=?", name)
        return {f"{d.owner}_id": oid}

    def _get_owner(self, key: int) -> dict:
        d = self.domain
        oid, name, city = self._one(f"SELECT * FROM {d.owner}s WHERE id=?", key)
        return {f"{d.owner}_id": oid, "name": name, "city": city}

    def _get_record(self, key: int) -> dict:
        d = self.domain
        rid, oid, item, status, amount = self._one(f"SELECT * FROM {d.record}s WHERE id=?", key)
        return {
            f"{d.record}_id": rid,
            f"{d.owner}_id": oid,
            d.item: item,
            "status": status,
            "amount": amount,
        }

    def _list(self, oid: int) -> list:
        d = self.domain
        self._one(f"SELECT id FROM {d.owner}s WHERE id=?", oid)
        rows = self.con.execute(
            f"SELECT id, {d.item} FROM {d.record}s WHERE {d.owner}_id=?", (oid,)
        )
        return [{f"{d.record}_id": rid, d.item: item} for rid, item in rows]

    def _cancel(self, rid: int) -> dict:
        d = self.domain
        self._one(f"SELECT id FROM {d.record}s WHERE id=?", rid)
        self.con.execute(f"UPDATE {d.record}s SET status=? WHERE id=?", (CANCELLED, rid))
        return {f"{d.record}_id": rid, "status": CANCELLED}


@dataclass
class Suite:
    """A generated suite on disk: its catalog, tasks by id, and one prototype env per env id."""

    catalog: pd.DataFrame
    tasks: dict[str, Task]
    envs: dict[str, SyntheticEnv]

    def split(self, name: str) -> list[Task]:
        return [t for t in self.tasks.values() if t.split == name]


def load_suite(suite_dir: Path) -> Suite:
    suite_dir = Path(suite_dir)
    catalog_path = suite_dir / "catalog.parquet"
    if not catalog_path.exists():
        raise FileNotFoundError(f"{catalog_path} is missing: run the `generate` stage first")
    catalog = pd.read_parquet(catalog_path)
    envs, tasks = {}, {}
    for env_id in catalog["env_id"].unique():
        envs[env_id] = SyntheticEnv(suite_dir / env_id)
        tasks.update({t.task_id: t for t in load_tasks(suite_dir / env_id)})
    return Suite(catalog, tasks, envs)
