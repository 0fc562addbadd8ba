"""bench/halving.py's real pools: a run's data/eval/matrix.parquet or a kept pool file, named by
its run folder or file; tasks a candidate did not run are dropped, not read as failures."""

from __future__ import annotations

import pandas as pd

from bench.halving import real_pools


def long_matrix(missing: bool) -> pd.DataFrame:
    rows = [{"candidate": c, "task_id": t, "success": float(c == "b" or t == "t0")}
            for c in ("a", "b") for t in ("t0", "t1", "t2")]  # fmt: skip
    return pd.DataFrame(rows[:-1] if missing else rows)


def test_real_pools_from_a_run_folder_and_from_a_kept_file(tmp_path):
    run = tmp_path / "bench" / "seed_3" / "data" / "eval"
    run.mkdir(parents=True)
    long_matrix(missing=False).to_parquet(run / "matrix.parquet")
    long_matrix(missing=True).to_parquet(tmp_path / "seed_7.parquet")
    (name_run, y_run), (name_kept, y_kept) = real_pools(
        [run / "matrix.parquet", tmp_path / "seed_7.parquet"]
    )
    assert (name_run, name_kept) == ("real:seed_3", "real:seed_7")
    assert y_run.tolist() == [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]  # candidates a, b
    assert y_kept.shape == (2, 2)  # b's t2 never ran: that task is dropped for both


def test_a_pools_figures_are_averaged_over_its_item_orders():
    from bench.halving import aggregate, mean_score

    orders = [{"cells_fraction": 0.3, "winner_agreement": True, "winner_exact": True,
               "regret_pts": 0.0},
              {"cells_fraction": 0.5, "winner_agreement": False, "winner_exact": False,
               "regret_pts": 2.0}]  # fmt: skip
    pool = mean_score(orders)
    assert pool["cells_fraction"] == 0.4 and pool["winner_agreement"] == 0.5
    assert pool["cells_fraction_max"] == 0.5 and pool["regret_pts"] == 1.0
    assert aggregate([pool, mean_score(orders[:1])])["cells_fraction_max"] == 0.5
