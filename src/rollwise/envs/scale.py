"""The same tasks at other state sizes (issue 38's scale knob): a generated suite copied with
each environment's record table padded to `records` rows, every task kept whose answer cannot
depend on the padding, and each kept task's oracle replayed and verified on the padded state.

Padding rows belong to the task owners' own records (so listing a customer's orders grows with
the scale: direct tool calls see it all, a code action keeps it in a variable), with fresh ids
(from 1000 up), items no task names (`lamp7`: a known item plus a number) and the status
`cancelled`, which no read task asks about. Kinds that count or sum an owner's records would
change their answer, so they are left out of the scaled suites (all of them, at every scale)."""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
from pathlib import Path

import pandas as pd

from rollwise.envs.generate import load_tasks, oracle_passes, task_table
from rollwise.envs.spec import CANCELLED, VALUE_DISTS, EnvSpec

SCALE_VARIANT_KINDS = frozenset(
    {"city_by_id", "city_by_name", "status", "amount", "cancel", "tier", "priority",
     "filter_count", "update", "record_city", "conditional"}
)  # fmt: skip
FIRST_PAD_ID = 1000


def pad_state(state: bytes, spec: EnvSpec, records: int, rng: random.Random) -> bytes:
    """`state` with its record table padded to `records` rows (unchanged if it has as many)."""
    d = spec.entities
    con = sqlite3.connect(":memory:")
    con.deserialize(state)
    owners = [oid for (oid,) in con.execute(f"SELECT id FROM {d.owner}s ORDER BY id")]
    (have,) = con.execute(f"SELECT COUNT(*) FROM {d.record}s").fetchone()
    draw = VALUE_DISTS[spec.values]
    for k in range(max(0, records - have)):
        amount = draw(rng) / 10 if spec.amount == "real" else draw(rng)
        row = (FIRST_PAD_ID + k, owners[k % len(owners)], f"{rng.choice(d.items)}{k}", CANCELLED,
               amount, *([rng.randint(1, 5)] if "priority" in spec.columns else []))  # fmt: skip
        con.execute(f"INSERT INTO {d.record}s VALUES ({', '.join('?' * len(row))})", row)
    con.commit()
    return con.serialize()


def scale_suite(src: Path, out: Path, records: int, seed: int = 0) -> dict:
    """Write `src`'s suite at `records` rows per record table under `out`; returns counts. Every
    kept task's oracle must pass on the padded state (else ValueError: the padding changed an
    answer), so the scaled suites of one base suite hold the same tasks with the same answers."""
    from rollwise.envs.runtime import SyntheticEnv  # replay oracles through the real runtime

    src, out = Path(src), Path(out)
    shutil.copytree(src, out, dirs_exist_ok=True)
    catalog = pd.read_parquet(src / "catalog.parquet")
    catalog = catalog[catalog["kind"].isin(SCALE_VARIANT_KINDS)].reset_index(drop=True)
    for i, env_id in enumerate(sorted(catalog["env_id"].unique())):
        env_dir = out / env_id
        spec = EnvSpec.from_meta(json.loads((env_dir / "env.json").read_text()))
        state = (src / env_id / "state.sqlite").read_bytes()
        rng = random.Random(f"{seed}/scale/{records}/{i}")
        (env_dir / "state.sqlite").write_bytes(pad_state(state, spec, records, rng))
        tasks = [t for t in load_tasks(src / env_id) if t.kind in SCALE_VARIANT_KINDS]
        env = SyntheticEnv(env_dir)
        broken = [t.task_id for t in tasks if not oracle_passes(env, t)]
        if broken:
            raise ValueError(f"padding to {records} records changed the answers of {broken}")
        task_table(tasks).to_parquet(env_dir / "tasks.parquet")
    for env_dir in out.iterdir():  # environments left without a task
        if env_dir.is_dir() and env_dir.name not in set(catalog["env_id"]):
            shutil.rmtree(env_dir)
    catalog.to_parquet(out / "catalog.parquet")
    return {"records": records, "envs": catalog["env_id"].nunique(), "tasks": len(catalog)}
