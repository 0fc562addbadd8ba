"""Seeded synthetic tool-use suites: each environment is a small SQLite world with tools over it.

Every environment draws a domain (owners with records: customers/orders, patients/visits, ...),
its own database and its own task set. Each task has an oracle call sequence; a task is kept only
if replaying its oracle through the runtime passes the verifier (rejections are counted).
"""

from __future__ import annotations

import json
import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rollwise.types import Task, ToolCall, ToolSpec


@dataclass(frozen=True)
class Domain:
    owner: str  # entity with a unique name, e.g. customer
    record: str  # entity owned by an owner, e.g. order
    item: str  # the record's distinguishing column, e.g. product
    items: tuple[str, ...]
    statuses: tuple[str, ...]


DOMAINS: dict[str, Domain] = {
    "shop": Domain(
        "customer",
        "order",
        "product",
        (
            "lamp",
            "chair",
            "desk",
            "sofa",
            "mirror",
            "rug",
            "clock",
            "vase",
            "shelf",
            "bed",
            "stool",
            "bench",
        ),
        ("pending", "shipped", "delivered"),
    ),
    "clinic": Domain(
        "patient",
        "visit",
        "department",
        (
            "cardiology",
            "dental",
            "radiology",
            "surgery",
            "pediatrics",
            "neurology",
            "oncology",
            "dermatology",
            "urology",
            "psychiatry",
        ),
        ("booked", "confirmed", "completed"),
    ),
    "library": Domain(
        "member",
        "loan",
        "book",
        (
            "atlas",
            "novel",
            "poetry",
            "history",
            "biology",
            "chemistry",
            "physics",
            "cookbook",
            "memoir",
            "thriller",
            "drama",
            "comics",
        ),
        ("active", "returned", "overdue"),
    ),
    "travel": Domain(
        "passenger",
        "booking",
        "destination",
        (
            "rome",
            "oslo",
            "lima",
            "cairo",
            "delhi",
            "seoul",
            "quito",
            "dakar",
            "perth",
            "hanoi",
            "vienna",
            "lagos",
        ),
        ("reserved", "paid", "ticketed"),
    ),
    "garage": Domain(
        "owner",
        "repair",
        "part",
        (
            "brakes",
            "engine",
            "tires",
            "battery",
            "clutch",
            "exhaust",
            "radiator",
            "mirrors",
            "wipers",
            "lights",
        ),
        ("queued", "started", "finished"),
    ),
    "school": Domain(
        "student",
        "enrollment",
        "course",
        (
            "algebra",
            "art",
            "music",
            "geometry",
            "latin",
            "economics",
            "robotics",
            "theater",
            "statistics",
            "geology",
        ),
        ("applied", "accepted", "attending"),
    ),
}

NAMES = (
    "alice bob carol dave erin frank grace heidi ivan judy kevin laura mallory nina oscar peggy "
    "quinn rupert sybil trent ursula victor wendy xavier yvonne zach amber bruno chloe derek "
    "elena fabio gina hugo iris jonas kira leon mona nils olga pablo rosa sven tara umar vera "
    "walter yara zoran aiko bianca cyrus dora emil flora gustav hana igor jade karl lena milo "
    "nora otto petra rafael selma tomas uma viktor wanda ximena yusuf zelda"
).split()
CITIES = (
    "paris tokyo berlin madrid london boston denver austin dublin lisbon prague warsaw zurich "
    "geneva munich milan naples porto seville bergen turku riga tallinn vilnius krakow"
).split()
CANCELLED = "cancelled"
TASK_KINDS = ("city_by_id", "city_by_name", "count", "status", "amount", "cancel")
ORACLE_LENGTH = {
    "city_by_id": 1,
    "city_by_name": 2,
    "count": 2,
    "status": 3,
    "amount": 3,
    "cancel": 3,
}


def domain_tools(d: Domain) -> list[ToolSpec]:
    """The five tools of a domain; the names and arguments differ across domains."""
    oid, rid = f"{d.owner}_id", f"{d.record}_id"

    def spec(name: str, desc: str, arg: str, typ: str) -> ToolSpec:
        schema = {"type": "object", "properties": {arg: {"type": typ}}, "required": [arg]}
        return ToolSpec(name, desc, schema)

    return [
        spec(f"find_{d.owner}", f"Look up a {d.owner} id by name.", "name", "string"),
        spec(f"get_{d.owner}", f"Read a {d.owner} record.", oid, "integer"),
        spec(f"list_{d.record}s", f"List the {d.record}s of a {d.owner}.", oid, "integer"),
        spec(f"get_{d.record}", f"Read one {d.record}.", rid, "integer"),
        spec(f"cancel_{d.record}", f"Cancel one {d.record}.", rid, "integer"),
    ]


def build_database(d: Domain, rng: random.Random, n_owners: int, max_records: int) -> bytes:
    """A fresh SQLite database, serialized; owners have unique names and 1..max_records records."""
    con = sqlite3.connect(":memory:")
    con.execute(f"CREATE TABLE {d.owner}s (id INTEGER PRIMARY KEY, name TEXT UNIQUE, city TEXT)")
    con.execute(
        f"CREATE TABLE {d.record}s (id INTEGER PRIMARY KEY, {d.owner}_id INTEGER, "
        f"{d.item} TEXT, status TEXT, amount INTEGER)"
    )
    owner_ids = rng.sample(range(1, 1000), n_owners)
    record_ids = iter(rng.sample(range(1, 1000), n_owners * max_records))
    for oid, name in zip(owner_ids, rng.sample(NAMES, n_owners), strict=True):
        con.execute(f"INSERT INTO {d.owner}s VALUES (?, ?, ?)", (oid, name, rng.choice(CITIES)))
        for item in rng.sample(d.items, rng.randint(1, max_records)):
            row = (next(record_ids), oid, item, rng.choice(d.statuses), rng.randint(5, 500))
            con.execute(f"INSERT INTO {d.record}s VALUES (?, ?, ?, ?, ?)", row)
    con.commit()
    return con.serialize()


def make_task(kind: str, d: Domain, con: sqlite3.Connection, rng: random.Random) -> dict:
    """One task of `kind` over a random owner (and record): prompt, oracle calls, answer."""
    oid, name, city = rng.choice(con.execute(f"SELECT id, name, city FROM {d.owner}s").fetchall())
    records = con.execute(
        f"SELECT id, {d.item}, status, amount FROM {d.record}s WHERE {d.owner}_id=?", (oid,)
    ).fetchall()
    rid, item, status, amount = rng.choice(records)
    find = ToolCall(f"find_{d.owner}", {"name": name})
    listing = ToolCall(f"list_{d.record}s", {f"{d.owner}_id": oid})
    get_record = ToolCall(f"get_{d.record}", {f"{d.record}_id": rid})
    table = {
        "city_by_id": (
            f"What city does {d.owner} {oid} live in?",
            [ToolCall(f"get_{d.owner}", {f"{d.owner}_id": oid})],
            city,
        ),
        "city_by_name": (
            f"What city does {d.owner} {name} live in?",
            [find, ToolCall(f"get_{d.owner}", {f"{d.owner}_id": oid})],
            city,
        ),
        "count": (f"How many {d.record}s does {name} have?", [find, listing], str(len(records))),
        "status": (
            f"What is the status of the {item} {d.record} of {name}?",
            [find, listing, get_record],
            status,
        ),
        "amount": (
            f"What is the amount of the {item} {d.record} of {name}?",
            [find, listing, get_record],
            str(amount),
        ),
        "cancel": (
            # The answer is the record's id, not a fixed word: a constant answer would be free
            # reward (RL learnt to say "done" without cancelling anything).
            f"Cancel the {item} {d.record} of {name} and reply with its id.",
            [find, listing, ToolCall(f"cancel_{d.record}", {f"{d.record}_id": rid})],
            str(rid),
        ),
    }
    prompt, oracle, answer = table[kind]
    target = {"table": f"{d.record}s", "id": rid, "status": CANCELLED} if kind == "cancel" else {}
    return {
        "kind": kind,
        "prompt": prompt,
        "oracle": oracle,
        "answer": answer,
        "writes": kind == "cancel",
        "target": target,
    }


def generate_environment(env_id: str, domain: str, cfg, rng: random.Random) -> tuple[bytes, list]:
    """Database plus de-duplicated task drafts for one environment."""
    d = DOMAINS[domain]
    state = build_database(d, rng, cfg.owners_per_env, cfg.max_records)
    con = sqlite3.connect(":memory:")
    con.deserialize(state)
    drafts, seen = [], set()
    for _ in range(cfg.tasks_per_env * 4):
        draft = make_task(rng.choice(cfg.task_kinds), d, con, rng)
        if draft["prompt"] not in seen:
            seen.add(draft["prompt"])
            drafts.append(draft)
        if len(drafts) == cfg.tasks_per_env:
            break
    return state, drafts


def generate_suite(cfg, out: Path) -> dict:
    """Write the suite under `out` (catalog.parquet + one folder per env); returns counts.
    With `cfg.custom`, the suite is the user's environment's tasks instead (envs/custom.py);
    with some fault on, the audit table and the fault knobs are written too (envs/faults.py)."""
    from rollwise.envs import faults
    from rollwise.envs.custom import generate_custom
    from rollwise.envs.runtime import SyntheticEnv  # replay oracles through the real runtime

    if cfg.custom:
        return generate_custom(cfg, out)
    rng = random.Random(cfg.seed)
    domains = [cfg.domains[i % len(cfg.domains)] for i in range(cfg.n_envs)]
    heldout_envs = set(rng.sample(range(cfg.n_envs), cfg.heldout_envs))
    rows, rejected, kept = [], 0, []
    for i, domain in enumerate(domains):
        env_id = f"{domain}_{i:03d}"
        state, drafts = generate_environment(env_id, domain, cfg, random.Random(rng.random()))
        env_dir = out / env_id
        env_dir.mkdir(parents=True, exist_ok=True)
        (env_dir / "state.sqlite").write_bytes(state)
        tools = [t.__dict__ for t in domain_tools(DOMAINS[domain])]
        (env_dir / "tools.json").write_text(json.dumps(tools, indent=1))
        (env_dir / "env.json").write_text(json.dumps({"env_id": env_id, "domain": domain}))
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
        rows += [catalog_row(t, domain, i in heldout_envs) for t in tasks]
        kept += tasks
    pd.DataFrame(rows).to_parquet(out / "catalog.parquet")
    counts = {"envs": cfg.n_envs, "tasks": len(rows), "oracle_rejected": rejected}
    if cfg.faults.active:  # after oracle replay: faults never decide which tasks are kept
        audit = faults.assign(kept, cfg.faults)
        faults.write(out, cfg.faults, audit)
        counts["unsolvable"] = sum(r["unsolvable"] for r in audit)
    return counts


def oracle_passes(env, task: Task) -> bool:
    """Replay the oracle (turn by turn where the environment is multi-turn) and verify."""
    env.reset(task, seed=0)
    turns = env.oracle_turns(task) if hasattr(env, "oracle_turns") else [list(task.oracle)]
    for i, calls in enumerate(turns):
        if i:
            env.next_turn("")
        if any(env.step(c).kind != "ok" for c in calls):
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


def catalog_row(t: Task, domain: str, heldout_env: bool) -> dict:
    d = DOMAINS[domain]
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
