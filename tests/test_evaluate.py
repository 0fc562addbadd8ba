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


def test_report_has_a_checkpoint_selection_section():
    """report.md says how the checkpoint was chosen: method, winner and its interval, cells
    against full evaluation, and every rung with who was dropped after it."""
    import numpy as np
    import pandas as pd

    from rollwise.evaluate.candidates import selection
    from rollwise.evaluate.full import wilson
    from rollwise.evaluate.halving import select
    from rollwise.evaluate.report import markdown
    from tests.test_halving import simulate

    y = simulate(2, np.linspace(-0.3, 0.3, 8), 300)  # closely matched: several rungs
    names, items = [f"c{i}" for i in range(8)], [f"t{j}" for j in range(300)]
    chosen = select(
        "halving", names, items, lambda c, its: [y[int(c[1:]), int(t[1:])] for t in its]
    )
    ran = pd.DataFrame([(c.candidate, c.outcome) for c in chosen.cells], columns=["c", "y"])
    rows = []
    for name, g in ran.groupby("c", sort=False):
        lo, hi = wilson(int(g["y"].sum()), len(g))
        rows.append({"candidate": name, "round": None, "n": len(g), "success": g["y"].mean(),
                     "success_lo": lo, "success_hi": hi, "reward": g["y"].mean()})  # fmt: skip
    summary = pd.DataFrame(rows).astype({"round": "Int64"})
    sel = selection(chosen, summary)
    text = markdown(summary, 300, None, (), sel)
    section = text[text.index("## Checkpoint selection") :]
    best = summary.set_index("candidate").loc[chosen.winner]
    assert "Method: paired successive halving" in section and chosen.stopped in section
    assert f"Winner: **{chosen.winner}**, held-out success {100 * best['success']:.1f}% " in section
    assert f"(95% CI {100 * best['success_lo']:.1f}–{100 * best['success_hi']:.1f}%)" in section
    assert f"Cells: {chosen.cells_used} of the {8 * 300} of full evaluation" in section
    table = [line for line in section.splitlines() if line.startswith("| ") and "rung" not in line]
    assert len(table) == len(chosen.rungs) >= 3 and table[0].startswith("| 0 (warm-up) | 8: c0,")
    # The winner ran every rung's new tasks; every other candidate is dropped exactly once (the
    # last rung's others at the end).
    assert sum(sel["rung_items"]) == best["n"]
    dropped = [c for line in table for c in line.split(" | ")[-1].rstrip(" |").split(", ")]
    assert sorted(c for c in dropped if c != "-") == sorted(set(names) - {chosen.winner})
    assert "Winner" not in markdown(summary, 300)  # no selection given: no section


def test_paired_gain_pairs_on_tasks_both_ran_with_an_interval():
    """Halving runs the weaker candidate on fewer tasks: the gain counts only tasks both ran,
    and its 95% interval is the paired mean's (a task's difference is -1, 0 or +1)."""
    import math

    import pandas as pd

    from rollwise.evaluate.report import paired_gain

    first = [0, 0, 1, 1, 0, 1]
    last = [1, 1, 1, 0, 1, 1]
    rows = [
        {"candidate": c, "task_id": f"t{i}", "success": s, "ran": True}
        for c, col in (("round_00", first), ("round_02", last))
        for i, s in enumerate(col)
    ]
    rows += [{"candidate": "round_02", "task_id": "t9", "success": 1, "ran": True},
             {"candidate": "round_00", "task_id": "t9", "success": 0, "ran": False}]  # fmt: skip
    g = paired_gain(pd.DataFrame(rows), "round_00", "round_02")
    d = pd.Series(last) - pd.Series(first)  # +1 +1 0 -1 +1 0: t9 ran for one only
    se = d.std(ddof=1) / math.sqrt(6)
    assert g.tasks == 6 and math.isclose(g.gain_pts, 100 * d.mean())
    assert math.isclose(g.lo, 100 * (d.mean() - 1.96 * se))
    assert math.isclose(g.hi, 100 * (d.mean() + 1.96 * se))
    assert g.lo < 0 < g.gain_pts < g.hi  # 3 up, 1 down on 6 tasks does not exclude 0
