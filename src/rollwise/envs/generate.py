"""Seeded synthetic tool-use suites: each environment is a small SQLite world with tools over it.

Every environment draws a domain (owners with records: customers/orders, patients/visits, ...),
its spec (entity and tool names, tool set, schema: envs/spec.py), its own database and its own
task set from task templates (KINDS: 1..4 dependent calls, read-only or state-changing,
conditional). Each task has an oracle call sequence; a task is kept only if replaying its oracle
through the runtime passes the verifier (rejections are counted). A read-only task's answer is
read by its oracle's last call: the rubric's `grounded` criterion checks that an episode made
that read (or an equivalent one), so a constant answer or another record's matching value does
not pass, however skewed an answer domain is (statuses are drawn uniformly per record).
"""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rollwise.config import ParamsError
from rollwise.envs.spec import (
    CANCELLED,
    CITIES,
    DOMAINS,
    NAMES,
    TIERS,
    VALUE_DISTS,
    Domain,
    EnvSpec,
    default_spec,
    draw_spec,
    total_amount,
)
from rollwise.types import Task, ToolCall


@dataclass(frozen=True)
class Pick:
    """What a task is about: an owner and one of its records, drawn as the original generator
    drew them (the kinds below draw more only when they need it)."""

    spec: EnvSpec
    d: Domain
    con: sqlite3.Connection
    rng: random.Random
    oid: int
    name: str
    city: str
    records: list[tuple]  # (id, item, status, amount) of the owner's records
    rid: int
    item: str
    status: str
    amount: int | float

    def find(self) -> ToolCall:
        return self.spec.call("find", self.name)

    def listing(self) -> ToolCall:
        return self.spec.call("list", self.oid)

    def get_record(self) -> ToolCall:
        return self.spec.call("get_record", self.rid)

    def target(self, status: str) -> dict:
        return {"table": f"{self.d.record}s", "id": self.rid, "status": status}

    def column(self, table: str, column: str, key: int):
        return self.con.execute(f"SELECT {column} FROM {table} WHERE id=?", (key,)).fetchone()[0]


# Each builder returns (prompt, oracle calls, answer, write target or {}).
def city_by_id(p: Pick) -> tuple:
    oracle = [p.spec.call("get_owner", p.oid)]
    return f"What city does {p.d.owner} {p.oid} live in?", oracle, p.city, {}


def city_by_name(p: Pick) -> tuple:
    oracle = [p.find(), p.spec.call("get_owner", p.oid)]
    return f"What city does {p.d.owner} {p.name} live in?", oracle, p.city, {}


def count(p: Pick) -> tuple:
    oracle, answer = [p.find(), p.listing()], str(len(p.records))
    return f"How many {p.d.record}s does {p.name} have?", oracle, answer, {}


def status(p: Pick) -> tuple:
    oracle = [p.find(), p.listing(), p.get_record()]
    return f"What is the status of the {p.item} {p.d.record} of {p.name}?", oracle, p.status, {}


def amount(p: Pick) -> tuple:
    oracle, answer = [p.find(), p.listing(), p.get_record()], str(p.amount)
    return f"What is the amount of the {p.item} {p.d.record} of {p.name}?", oracle, answer, {}


def cancel(p: Pick) -> tuple:
    # The answer is the record's id, not a fixed word: a constant answer would be free
    # reward (RL learnt to say "done" without cancelling anything).
    prompt = f"Cancel the {p.item} {p.d.record} of {p.name} and reply with its id."
    oracle = [p.find(), p.listing(), p.spec.call("cancel", p.rid)]
    return prompt, oracle, str(p.rid), p.target(CANCELLED)


def tier(p: Pick) -> tuple:
    answer = p.column(f"{p.d.owner}s", "tier", p.oid)
    oracle = [p.find(), p.spec.call("get_owner", p.oid)]
    return f"What tier is {p.d.owner} {p.name} in?", oracle, answer, {}


def priority(p: Pick) -> tuple:
    answer = str(p.column(f"{p.d.record}s", "priority", p.rid))
    oracle = [p.find(), p.listing(), p.get_record()]
    return f"What is the priority of the {p.item} {p.d.record} of {p.name}?", oracle, answer, {}


def total(p: Pick) -> tuple:
    answer = str(total_amount([r[3] for r in p.records]))
    oracle = [p.find(), p.spec.call("total", p.oid)]
    return f"What is the total amount of the {p.d.record}s of {p.name}?", oracle, answer, {}


def filter_count(p: Pick) -> tuple:
    wanted = p.rng.choice(p.d.statuses)
    answer = str(sum(r[2] == wanted for r in p.records))
    oracle = [p.find(), p.spec.call("filter", p.oid, wanted)]
    return f"How many {wanted} {p.d.record}s does {p.name} have?", oracle, answer, {}


def update(p: Pick) -> tuple:
    new = p.rng.choice([s for s in p.d.statuses if s != p.status])
    prompt = f"Set the {p.item} {p.d.record} of {p.name} to {new} and reply with its id."
    oracle = [p.find(), p.listing(), p.spec.call("update", p.rid, new)]
    return prompt, oracle, str(p.rid), p.target(new)


def record_city(p: Pick) -> tuple:
    """A multi-hop join in one call: the record's owner's city."""
    oracle = [p.spec.call("owner_of", p.rid)]
    return f"What city does the {p.d.owner} of {p.d.record} {p.rid} live in?", oracle, p.city, {}


def conditional(p: Pick) -> tuple:
    """Read, then write only if a condition holds (3 or 4 calls)."""
    wanted = p.rng.choice(p.d.statuses)
    prompt = (
        f"If the {p.item} {p.d.record} of {p.name} is {wanted}, cancel it and reply with its id; "
        "otherwise reply with its status."
    )
    oracle = [p.find(), p.listing(), p.get_record()]
    if p.status != wanted:
        return prompt, oracle, p.status, {}
    return prompt, [*oracle, p.spec.call("cancel", p.rid)], str(p.rid), p.target(CANCELLED)


@dataclass(frozen=True)
class Kind:
    """A task template: the tool templates and columns it needs, its longest oracle, whether it
    may change state, and its builder."""

    tools: tuple[str, ...]
    calls: int
    build: Callable[[Pick], tuple]
    columns: tuple[str, ...] = ()
    writes: bool = False


READ3 = ("find", "list", "get_record")
KINDS: dict[str, Kind] = {
    "city_by_id": Kind(("get_owner",), 1, city_by_id),
    "city_by_name": Kind(("find", "get_owner"), 2, city_by_name),
    "count": Kind(("find", "list"), 2, count),
    "status": Kind(READ3, 3, status),
    "amount": Kind(READ3, 3, amount),
    "cancel": Kind(("find", "list", "cancel"), 3, cancel, writes=True),
    "tier": Kind(("find", "get_owner"), 2, tier, columns=("tier",)),
    "priority": Kind(READ3, 3, priority, columns=("priority",)),
    "total": Kind(("find", "total"), 2, total),
    "filter_count": Kind(("find", "filter"), 2, filter_count),
    "update": Kind(("find", "list", "update"), 3, update, writes=True),
    "record_city": Kind(("owner_of",), 1, record_city),
    "conditional": Kind((*READ3, "cancel"), 4, conditional, writes=True),
}


def feasible_kinds(spec: EnvSpec, cfg) -> list[str]:
    """The kinds of `cfg.task_kinds` this environment's tools and columns can solve in at most
    `cfg.max_calls` calls."""
    return [
        k
        for k in cfg.task_kinds
        if set(KINDS[k].tools) <= spec.verbs.keys()
        and set(KINDS[k].columns) <= set(spec.columns)
        and KINDS[k].calls <= cfg.max_calls
    ]


def build_database(spec: EnvSpec, rng: random.Random, n_owners: int, max_records: int) -> bytes:
    """A fresh SQLite database, serialized; owners have unique names and 1..max_records records.
    Extra columns, the amount type and distribution come from the spec."""
    d, extra = spec.entities, spec.columns
    con = sqlite3.connect(":memory:")
    tier_col = ", tier TEXT" if "tier" in extra else ""
    con.execute(
        f"CREATE TABLE {d.owner}s (id INTEGER PRIMARY KEY, name TEXT UNIQUE, city TEXT{tier_col})"
    )
    amount_type = "REAL" if spec.amount == "real" else "INTEGER"
    priority_col = ", priority INTEGER" if "priority" in extra else ""
    con.execute(
        f"CREATE TABLE {d.record}s (id INTEGER PRIMARY KEY, {d.owner}_id INTEGER, "
        f"{d.item} TEXT, status TEXT, amount {amount_type}{priority_col})"
    )
    owner_ids = rng.sample(range(1, 1000), n_owners)
    record_ids = iter(rng.sample(range(1, 1000), n_owners * max_records))
    draw_amount = VALUE_DISTS[spec.values]
    for oid, name in zip(owner_ids, rng.sample(NAMES, n_owners), strict=True):
        owner = (oid, name, rng.choice(CITIES), *([rng.choice(TIERS)] if tier_col else []))
        con.execute(f"INSERT INTO {d.owner}s VALUES ({', '.join('?' * len(owner))})", owner)
        for item in rng.sample(d.items, rng.randint(1, max_records)):
            row = (next(record_ids), oid, item, rng.choice(d.statuses), draw_amount(rng))
            row = (*row[:4], row[4] / 10) if spec.amount == "real" else row
            row += (rng.randint(1, 5),) if priority_col else ()
            con.execute(f"INSERT INTO {d.record}s VALUES ({', '.join('?' * len(row))})", row)
    con.commit()
    return con.serialize()


def make_task(kind: str, spec: EnvSpec, con: sqlite3.Connection, rng: random.Random) -> dict:
    """One task of `kind` over a random owner (and record): prompt, oracle calls, answer."""
    d = spec.entities
    oid, name, city = rng.choice(con.execute(f"SELECT id, name, city FROM {d.owner}s").fetchall())
    records = con.execute(
        f"SELECT id, {d.item}, status, amount FROM {d.record}s WHERE {d.owner}_id=?", (oid,)
    ).fetchall()
    rid, item, state, value = rng.choice(records)
    pick = Pick(spec, d, con, rng, oid, name, city, records, rid, item, state, value)
    prompt, oracle, answer, target = KINDS[kind].build(pick)
    return {
        "kind": kind,
        "prompt": prompt,
        "oracle": oracle,
        "answer": answer,
        "writes": bool(target),
        "target": target,
    }


def generate_environment(spec: EnvSpec, cfg, rng: random.Random) -> tuple[bytes, list]:
    """Database plus de-duplicated task drafts for one environment (none when no kind of
    `cfg.task_kinds` fits its tools)."""
    state = build_database(spec, rng, spec.owners or cfg.owners_per_env, cfg.max_records)
    con = sqlite3.connect(":memory:")
    con.deserialize(state)
    kinds = feasible_kinds(spec, cfg)
    drafts, seen = [], set()
    for _ in range(cfg.tasks_per_env * 4 if kinds else 0):
        draft = make_task(draw_kind(kinds, cfg, rng), spec, con, rng)
        if draft["prompt"] not in seen:
            seen.add(draft["prompt"])
            drafts.append(draft)
        if len(drafts) == cfg.tasks_per_env:
            break
    return state, drafts


def draw_kind(kinds: list[str], cfg, rng: random.Random) -> str:
    """Uniform over kinds, or first state-changing vs read-only with `cfg.write_share`."""
    if cfg.write_share is None:
        return rng.choice(kinds)
    writes = rng.random() < cfg.write_share
    return rng.choice([k for k in kinds if KINDS[k].writes == writes] or kinds)


def check_knobs(cfg) -> None:
    """Names the params key of a knob the generator cannot honour."""
    unknown = [k for k in cfg.task_kinds if k not in KINDS]
    if unknown:
        raise ParamsError(f"params.yaml: envs.task_kinds: unknown {unknown}; known: {list(KINDS)}")
    unknown = [d for d in cfg.domains if d not in DOMAINS]
    if unknown:
        raise ParamsError(f"params.yaml: envs.domains: unknown {unknown}; known: {list(DOMAINS)}")
    if cfg.owners_min > cfg.owners_per_env:
        raise ParamsError("params.yaml: envs.owners_min: must not exceed envs.owners_per_env")
    if cfg.owners_per_env > len(NAMES):  # owners have unique names
        raise ParamsError(f"params.yaml: envs.owners_per_env: at most {len(NAMES)}")


def generate_suite(cfg, out: Path) -> dict:
    """Write the suite under `out` (catalog.parquet + one folder per env); returns counts.
    With `cfg.custom`, the suite is the user's environment's tasks instead (envs/custom.py);
    with some fault on, the audit table and the fault knobs are written too (envs/faults.py)."""
    from rollwise.envs import faults
    from rollwise.envs.custom import generate_custom
    from rollwise.envs.runtime import SyntheticEnv  # replay oracles through the real runtime

    if cfg.custom:
        return generate_custom(cfg, out)
    check_knobs(cfg)
    rng = random.Random(cfg.seed)
    domains = [cfg.domains[i % len(cfg.domains)] for i in range(cfg.n_envs)]
    heldout_envs = set(rng.sample(range(cfg.n_envs), cfg.heldout_envs))
    rows, rejected, kept = [], 0, []
    for i, domain in enumerate(domains):
        env_id = f"{domain}_{i:03d}"
        spec = draw_spec(cfg, domain, random.Random(f"{cfg.seed}/spec/{i}"))  # its own stream
        state, drafts = generate_environment(spec, cfg, random.Random(rng.random()))
        env_dir = out / env_id
        env_dir.mkdir(parents=True, exist_ok=True)
        (env_dir / "state.sqlite").write_bytes(state)
        tools = [t.__dict__ for t in spec.tools()]
        (env_dir / "tools.json").write_text(json.dumps(tools, indent=1))
        meta = {"env_id": env_id, "domain": domain}
        meta |= {"spec": spec.to_json()} if spec != default_spec(domain) else {}
        (env_dir / "env.json").write_text(json.dumps(meta))
        env = SyntheticEnv(env_dir)
        tasks = []
        for j, draft in enumerate(drafts):
            split = (
                "heldout" if i in heldout_envs or rng.random() < cfg.heldout_task_frac else "train"
            )
            task = Task(task_id=f"{env_id}/t{j:03d}", env_id=env_id, split=split, **draft)
            if oracle_passes(env, task):
                tasks.append(task)
            else:
                rejected += 1
        task_table(tasks).to_parquet(env_dir / "tasks.parquet")
        rows += [catalog_row(t, domain, i in heldout_envs, spec) for t in tasks]
        kept += tasks
    pd.DataFrame(rows).to_parquet(out / "catalog.parquet")
    counts = {"envs": cfg.n_envs, "tasks": len(rows), "oracle_rejected": rejected}
    if cfg.faults.active:  # after oracle replay: faults never decide which tasks are kept
        audit = faults.assign(kept, cfg.faults)
        faults.write(out, cfg.faults, audit)
        counts["unsolvable"] = sum(r["unsolvable"] for r in audit)
    return counts


def oracle_passes(env, task: Task) -> bool:
    """Replay the oracle (turn by turn where the environment is multi-turn) and verify. Every
    call must run cleanly, unless the environment sets `oracle_errors_ok` (BFCL, whose ground
    truth may make calls its executor answers with an error, and whose verdict checks those)."""
    env.reset(task, seed=0)
    turns = env.oracle_turns(task) if hasattr(env, "oracle_turns") else [list(task.oracle)]
    strict = not getattr(env, "oracle_errors_ok", False)
    for i, calls in enumerate(turns):
        if i:
            env.next_turn("")
        kinds = [env.step(c).kind for c in calls]
        if strict and any(k != "ok" for k in kinds):
            return False
    return env.verify(task.answer, list(task.oracle)).success


def task_table(tasks: list[Task]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                **t.__dict__,
                "oracle": json.dumps([c.__dict__ for c in t.oracle]),
                "target": json.dumps(t.target),
            }
            for t in tasks
        ]
    )


def load_tasks(env_dir: Path) -> list[Task]:
    df = pd.read_parquet(env_dir / "tasks.parquet")
    return [
        Task(
            **{
                **row,
                "oracle": tuple(ToolCall(**c) for c in json.loads(row["oracle"])),
                "target": json.loads(row["target"]),
            }
        )
        for row in df.to_dict("records")
    ]


def catalog_row(t: Task, domain: str, heldout_env: bool, spec: EnvSpec | None = None) -> dict:
    d = (spec or default_spec(domain)).entities
    return {
        "env_id": t.env_id,
        "task_id": t.task_id,
        "domain": domain,
        "kind": t.kind,
        "split": t.split,
        "heldout_env": heldout_env,
        "n_calls": len(t.oracle),
        "tools": sorted({c.name for c in t.oracle}),
        "tables": [f"{d.owner}s", f"{d.record}s"],
        "verifier": "rubric_state" if t.writes else "rubric_answer",
        "writes": t.writes,
    }
