"""Which held-out tasks a capped evaluation runs."""

from __future__ import annotations

from pathlib import Path

from rollwise.config import EnvsConfig
from rollwise.envs.runtime import load_suite
from rollwise.evaluate.full import evaluation_tasks
from tests.helpers import make_suite


def test_a_capped_evaluation_spans_every_environment_and_is_stable(tmp_path: Path):
    cfg = EnvsConfig(seed=0, n_envs=6, tasks_per_env=20, owners_per_env=4, max_records=2,
                     heldout_envs=1, heldout_task_frac=0.3)  # fmt: skip
    make_suite(tmp_path, cfg)
    suite = load_suite(tmp_path)
    heldout = suite.split("heldout")
    picked = evaluation_tasks(suite, "heldout", 24)
    assert len(picked) == 24 and len({t.task_id for t in picked}) == 24
    assert {t.split for t in picked} == {"heldout"}
    # The first 24 in suite order come from the first environments only; the sample does not.
    assert len({t.env_id for t in heldout[:24]}) < len({t.env_id for t in picked})
    assert len({t.env_id for t in picked}) == cfg.n_envs
    assert [t.task_id for t in evaluation_tasks(suite, "heldout", 24)] == [
        t.task_id for t in picked
    ]
    assert len(evaluation_tasks(suite, "heldout", 10_000)) == len(heldout)
