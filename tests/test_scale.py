"""envs/scale.py: one suite at four state sizes holds the same tasks with the same answers,
each oracle verified on its padded state, and the record tables really grow."""

from __future__ import annotations

import sqlite3

import pandas as pd

from rollwise.envs.runtime import load_suite
from rollwise.envs.scale import SCALE_VARIANT_KINDS, scale_suite
from rollwise.envs.spec import EnvSpec
from tests.helpers import SMALL_ENVS, make_suite

SCALES = (8, 64, 512, 4096)
ENVS = SMALL_ENVS.model_copy(
    update={"task_kinds": ["city_by_name", "status", "amount", "cancel", "count"]}
)


def records(env_dir) -> int:
    import json

    spec = EnvSpec.from_meta(json.loads((env_dir / "env.json").read_text()))
    con = sqlite3.connect(":memory:")
    con.deserialize((env_dir / "state.sqlite").read_bytes())
    return con.execute(f"SELECT COUNT(*) FROM {spec.entities.record}s").fetchone()[0]


def test_scale_variants_hold_identical_tasks_and_answers(tmp_path):
    make_suite(tmp_path / "base", ENVS)
    base = pd.read_parquet(tmp_path / "base" / "catalog.parquet")
    assert "count" in set(base["kind"])  # a kind the padding would change is in the base
    tables = {}
    for n in SCALES:
        counts = scale_suite(tmp_path / "base", tmp_path / f"s{n}", n)
        catalog = pd.read_parquet(tmp_path / f"s{n}" / "catalog.parquet")
        assert set(catalog["kind"]) <= SCALE_VARIANT_KINDS and counts["tasks"] == len(catalog) > 0
        folder = tmp_path / f"s{n}"
        tables[n] = pd.concat(
            [
                pd.read_parquet(folder / e / "tasks.parquet")
                for e in sorted(catalog["env_id"].unique())
            ]
        )
        for env_id in catalog["env_id"].unique():
            assert records(tmp_path / f"s{n}" / env_id) == max(n, records(tmp_path / "base" /
                                                                          env_id))  # fmt: skip
    first = tables[SCALES[0]].reset_index(drop=True)
    for n in SCALES[1:]:
        pd.testing.assert_frame_equal(tables[n].reset_index(drop=True), first)
    suite = load_suite(tmp_path / "s4096")  # the scaled suite loads like any other
    assert set(suite.tasks) == set(first["task_id"])


def test_a_listing_grows_with_the_scale_while_the_answer_stays(tmp_path):
    make_suite(tmp_path / "base", ENVS)
    sizes = {}
    for n in (8, 512):
        scale_suite(tmp_path / "base", tmp_path / f"s{n}", n)
        suite = load_suite(tmp_path / f"s{n}")
        task = next(t for t in sorted(suite.tasks.values(), key=lambda t: t.task_id)
                    if t.kind == "status")  # fmt: skip
        env = suite.envs[task.env_id]
        env.reset(task, 0)
        observations = [env.step(c).content for c in task.oracle]
        sizes[n] = (len(observations[1]), task.answer)
    assert sizes[512][0] > 10 * sizes[8][0]  # the owner's listing
    assert sizes[512][1] == sizes[8][1]
