"""Executes tool calls against an environment's SQLite state. Errors become observations.

Safety: a call's arguments are checked against its tool's JSON schema before a handler runs
(envs/schema.py); SQL takes values only as parameters (table and column names come from the
generator's domains, never from a call); and each episode's database lives in memory behind an
authorizer that allows reading and updating its own tables and nothing else (no ATTACH, PRAGMA
or schema change), so a call cannot reach anything outside its environment's state.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rollwise.envs import faults, rubric
from rollwise.envs.custom import build_env
from rollwise.envs.generate import load_tasks
from rollwise.envs.schema import check_call
from rollwise.envs.spec import (
    CANCELLED,
    CITIES,
    NAMES,
    TIERS,
    TOOL_TEMPLATES,
    Domain,
    EnvSpec,
    total_amount,
)
from rollwise.types import Observation, Rubric, Task, ToolCall, ToolSpec

ALLOWED_SQL = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_TRANSACTION}
TABLE_SQL = {sqlite3.SQLITE_READ, sqlite3.SQLITE_UPDATE}
TRANSIENT = json.dumps({"error": "environment: temporarily unavailable, try again"})


class ToolError(Exception):
    """The policy called a tool wrongly; shown to it as an observation."""


class SyntheticEnv:
    """One generated environment: a fresh in-memory copy of its database per episode."""

    def __init__(self, env_dir: Path, fault_plan: faults.FaultPlan | None = None):
        meta = json.loads((Path(env_dir) / "env.json").read_text())
        self.env_id: str = meta["env_id"]
        self.spec = EnvSpec.from_meta(meta)  # names, tools, schema (the domain's default if none)
        self.domain: Domain = self.spec.entities
        self.keys = self.spec.keys  # canonical argument -> this environment's name
        self.state0 = (Path(env_dir) / "state.sqlite").read_bytes()
        self.specs = {t.name: t for t in self.spec.tools()}
        self.handlers = {  # tool name -> template (copies of this env share the table)
            self.spec.tool_name(t): t for t in self.spec.verbs
        }
        d = self.domain
        self.tables = {f"{d.owner}s", f"{d.record}s"}
        self.faults = fault_plan
        self.withheld: str | None = None  # an unsolvable task's missing tool (set by reset)
        self.con: sqlite3.Connection | None = None

    def tools(self) -> list[ToolSpec]:
        return [t for t in self.specs.values() if t.name != self.withheld]

    def reset(self, task: Task, seed: int) -> list[dict]:
        self.con = sqlite3.connect(":memory:", check_same_thread=False)
        self.con.deserialize(self.state0)
        self.con.set_authorizer(self._authorize)
        self.task, self.seed, self.call_kinds, self.last = task, seed, [], ""
        self.made: list[tuple[ToolCall, Observation]] = []  # what the grounded criterion reads
        self.verified, self.audit = 0, []  # audit: injected faults of this episode only
        self.withheld = self.faults.withheld.get(task.task_id) if self.faults else None
        if self.withheld:
            self.note(-1, "withheld_tool", {"tool": self.withheld})
        self.rows_before = self.rows()
        system = f"You are the {self.domain.record} desk. Call tools, then reply with the answer."
        return [{"role": "system", "content": system}, {"role": "user", "content": task.prompt}]

    def step(self, call: ToolCall) -> Observation:
        try:
            obs = Observation(json.dumps(self.execute(call), separators=(",", ":")))
        except ToolError as e:
            obs = Observation(json.dumps({"error": str(e)}), "tool_error")
        except faults.TransientFault:
            obs = Observation(TRANSIENT, "env_error")
        except Exception as e:  # a broken environment is not the policy's fault
            obs = Observation(
                json.dumps({"error": f"environment: {type(e).__name__}"}), "env_error"
            )
        self.call_kinds.append(obs.kind)
        self.made.append((call, obs))
        self.last = obs.content
        return obs

    def fingerprint(self) -> str:
        """Database content plus the latest observation: what the next action depends on."""
        blob = json.dumps(sorted(self.rows().items()), default=str) + self.last
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def verify(self, answer: str | None, calls: list[ToolCall]) -> Rubric:
        keys = (self.keys["record"], self.keys["owner"])
        grounded = rubric.grounding(self.task, self.made, self.read_at_start, keys)
        rows = self.rows_before, self.rows()
        scored = rubric.score(self.task, answer, *rows, self.call_kinds, grounded)
        if self.faults and self.faults.verifier_flip_q:
            self.verified += 1  # each verification draws anew: re-verifying can disagree
            if draw_for(self, "verify", self.verified) < self.faults.verifier_flip_q:
                self.note(-1, "verdict_flip", {"success": scored.success})
                return faults.flip(scored)
        return scored

    def read_at_start(self, call: ToolCall) -> dict | list | None:
        """A call's true result on the episode's start state (no faults, this episode's
        database untouched): what the grounded criterion compares results with. None when the
        call fails there (a broken oracle: nothing can be read from it)."""
        probe = copy.copy(self)
        probe.faults, probe.withheld = None, None
        probe.con = sqlite3.connect(":memory:")
        probe.con.deserialize(self.state0)
        probe.con.set_authorizer(probe._authorize)
        try:
            return probe.execute(call)
        except Exception:  # ToolError or a broken state: no true result
            return None
        finally:
            probe.con.close()

    def note(self, step: int, fault: str, detail: dict) -> None:
        """One audit row of this episode (envs/faults.py); the rollout may write them apart."""
        row = [self.env_id, self.task.task_id, self.seed, step, fault, json.dumps(detail)]
        self.audit.append(dict(zip(faults.EPISODE_AUDIT_COLUMNS, row, strict=True)))

    def _authorize(self, action: int, arg1, arg2, db, source) -> int:
        """Reads and updates of this environment's tables; nothing else."""
        if action in ALLOWED_SQL or (action in TABLE_SQL and arg1 in self.tables):
            return sqlite3.SQLITE_OK
        return sqlite3.SQLITE_DENY

    # --- tool semantics -------------------------------------------------------------------
    def rows(self) -> dict[tuple, tuple]:
        d, out = self.domain, {}
        for table in (f"{d.owner}s", f"{d.record}s"):
            for row in self.con.execute(f"SELECT * FROM {table}"):
                out[(table, row[0])] = row
        return out

    def execute(self, call: ToolCall) -> dict | list:
        if error := check_call({t.name: t for t in self.tools()}, call.name, call.arguments):
            raise ToolError(error)
        template = self.handlers[call.name]
        values = [call.arguments[a] for a in self.spec.arg_names(template)]  # canonical order
        handler = functools.partial(getattr(self, TOOL_TEMPLATES[template].handler), *values)
        return self.inject(handler) if self.faults else handler()

    def inject(self, handler) -> dict | list:
        """Run a valid call under the fault plan: it may fail before running, return a corrupted
        result, or return a list in another order. Each injection is noted in the audit."""
        step, plan = len(self.call_kinds), self.faults
        if draw_for(self, "flaky", step) < plan.flaky_p:
            if draw_for(self, "wrong", step) >= plan.flaky_wrong:
                self.note(step, "flaky_error", {})
                raise faults.TransientFault
            true = handler()
            wrong = faults.corrupt(true, rng_for(self, "corrupt", step), self.vocab())
            self.note(step, "flaky_wrong", {"true": true})
            return wrong
        result = handler()
        if isinstance(result, list) and len(result) > 1:
            if draw_for(self, "stochastic", step) < plan.stochastic_p:
                self.note(step, "stochastic", {"true": result})
                return faults.rotate(result, rng_for(self, "rotate", step))
        return result

    def vocab(self) -> list[tuple[str, ...]]:
        d = self.domain
        return [tuple(NAMES), tuple(CITIES), d.items, (*d.statuses, CANCELLED), TIERS]

    def _one(self, sql: str, value) -> tuple:
        row = self.con.execute(sql, (value,)).fetchone()
        if row is None:
            raise ToolError(f"not found: {value}")
        return row

    def _find(self, name: str) -> dict:
        d = self.domain
        (oid,) = self._one(f"SELECT id FROM {d.owner}s WHERE name=?", name)
        return {self.keys["owner"]: oid}

    def _get_owner(self, key: int) -> dict:
        d, k = self.domain, self.keys
        oid, name, city, *tier = self._one(f"SELECT * FROM {d.owner}s WHERE id=?", key)
        return {k["owner"]: oid, k["name"]: name, k["city"]: city, **extra(["tier"], tier)}

    def _get_record(self, key: int) -> dict:
        d, k = self.domain, self.keys
        rid, oid, item, status, amount, *priority = self._one(
            f"SELECT * FROM {d.record}s WHERE id=?", key
        )
        return {
            k["record"]: rid,
            k["owner"]: oid,
            d.item: item,
            k["status"]: status,
            "amount": amount,
            **extra(["priority"], priority),
        }

    def _list(self, oid: int, status: str | None = None) -> list:
        d = self.domain
        self._one(f"SELECT id FROM {d.owner}s WHERE id=?", oid)
        rows = self.con.execute(
            f"SELECT id, {d.item}, status FROM {d.record}s WHERE {d.owner}_id=?", (oid,)
        )
        key = self.keys["record"]
        return [{key: rid, d.item: item} for rid, item, s in rows if status in (None, s)]

    def _cancel(self, rid: int) -> dict:
        return self._update(rid, CANCELLED)

    def _update(self, rid: int, status: str) -> dict:
        d = self.domain
        self._one(f"SELECT id FROM {d.record}s WHERE id=?", rid)
        self.con.execute(f"UPDATE {d.record}s SET status=? WHERE id=?", (status, rid))
        return {self.keys["record"]: rid, self.keys["status"]: status}

    def _filter(self, oid: int, status: str) -> list:
        return self._list(oid, status)

    def _total(self, oid: int) -> dict:
        d = self.domain
        self._one(f"SELECT id FROM {d.owner}s WHERE id=?", oid)
        rows = self.con.execute(f"SELECT amount FROM {d.record}s WHERE {d.owner}_id=?", (oid,))
        amounts = [a for (a,) in rows]
        return {"count": len(amounts), "amount": total_amount(amounts)}

    def _owner_of(self, rid: int) -> dict:
        """A join: the record's owner, in one call."""
        d, k = self.domain, self.keys
        oid, name, city = self._one(
            f"SELECT o.id, o.name, o.city FROM {d.record}s r JOIN {d.owner}s o "
            f"ON o.id = r.{d.owner}_id WHERE r.id=?",
            rid,
        )
        return {k["record"]: rid, k["owner"]: oid, k["name"]: name, k["city"]: city}

    # distractors: they work, but no task needs them
    def _count_owners(self) -> dict:
        d = self.domain
        (n,) = self.con.execute(f"SELECT COUNT(*) FROM {d.owner}s").fetchone()
        return {"count": n}

    def _list_items(self) -> list:
        d = self.domain
        rows = self.con.execute(f"SELECT DISTINCT {d.item} FROM {d.record}s ORDER BY {d.item}")
        return [item for (item,) in rows]

    def _in_city(self, city: str) -> list:
        d = self.domain
        rows = self.con.execute(f"SELECT name FROM {d.owner}s WHERE city=? ORDER BY name", (city,))
        return [name for (name,) in rows]


@dataclass
class Suite:
    """A generated suite on disk: its catalog, tasks by id, and one prototype env per env id."""

    catalog: pd.DataFrame
    tasks: dict[str, Task]
    envs: dict[str, SyntheticEnv]

    def split(self, name: str) -> list[Task]:
        return [t for t in self.tasks.values() if t.split == name]


def extra(columns: list[str], values: list) -> dict:
    """The optional columns a schema template adds (none in the default schema)."""
    return dict(zip(columns, values, strict=False))


def draw_for(env: SyntheticEnv, *what: object) -> float:
    """The fault draw of this episode: (faults seed, task, episode seed, what)."""
    return faults.draw(env.faults.seed, env.task.task_id, env.seed, *what)


def rng_for(env: SyntheticEnv, *what: object) -> random.Random:
    return random.Random("/".join(map(str, (env.faults.seed, env.task.task_id, env.seed, *what))))


def load_suite(suite_dir: Path) -> Suite:
    """The suite on disk: synthetic environments (with their fault plan, if any faults were
    injected) or a user's environment named in each env.json (envs/custom.py)."""
    suite_dir = Path(suite_dir)
    catalog_path = suite_dir / "catalog.parquet"
    if not catalog_path.exists():
        raise FileNotFoundError(f"{catalog_path} is missing: run the `generate` stage first")
    catalog = pd.read_parquet(catalog_path)
    plan, envs, tasks, custom = faults.load(suite_dir), {}, {}, {}
    for env_id in catalog["env_id"].unique():
        meta = json.loads((suite_dir / env_id / "env.json").read_text())
        if "custom" in meta:  # one prototype per factory, shared by its env ids
            path = meta["custom"]
            envs[env_id] = custom[path] = custom.get(path) or build_env(path)
        else:
            envs[env_id] = SyntheticEnv(suite_dir / env_id, plan)
        tasks.update({t.task_id: t for t in load_tasks(suite_dir / env_id)})
    return Suite(catalog, tasks, envs)
