"""Benchmark: paired successive halving against full evaluation, on candidate x item pools whose
full matrix is known, so every selector's choice can be checked against full evaluation's.

Pools (each a full (C, I) success matrix; a selector sees only the cells it asks for):
- real: data/eval/matrix.parquet of runs that evaluated every checkpoint on every task
  (`--matrices`; default: the orchestration bench's seeds under .rollwise/bench/ and the series
  `--make-real N` builds: N suites, each with the warm start's SFT checkpoints at every eighth
  of its steps, evaluated on every held-out task by tasks/evaluate.py, method full; their
  matrices are kept in bench/results/halving_pools/, so a later run reuses them).
- fitted: outcome matrices drawn from a 2PL fit to each real matrix (its abilities and items).
- simulated: checkpoint series, C candidates with abilities ~ N(0, spread), items from the priors
  of design.md §4 (spread 0.3: closely matched; 0.8: well separated).

Selectors, per pool: `halving` (params.yaml's defaults: EvaluateConfig) under a cap of
`--budget-frac` of full evaluation per pool (cells_fraction is the mean over pools), run under
`--orders` item orders (halving's seed 0..K-1) whose figures are averaged per pool: on the real
pools one order's cells fraction ranged 0.37-0.43 between seeds 0-3, so a single order measures
the order as much as the method; then at the cells halving actually used in each order, two
baselines: unpaired successive halving (each survivor runs its own random items, eliminated by
mean success, eta 2) and random item subsampling (every candidate on the same random items).
Figures per selector: cells_fraction (cells / full), winner_agreement (the winner is full
evaluation's winner or within 1 point of its full success; the default stop tolerance is that
same point), winner_exact, regret_pts (full success of full's winner minus the chosen one's).

    .venv/bin/python bench/halving.py [--make-real 1] [--sims 100] [--budget-frac 0.6] [--alpha 0.1]
        [--tolerance 0.01] [--orders 4]

The simulated pools use seeds 0..sims-1; the knobs were chosen on other seeds (1000..1199).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from rollwise.config import EvaluateConfig
from rollwise.evaluate.halving import HalvingKnobs, select
from rollwise.evaluate.irt import fit_2pl, prob

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.provenance import STARTED_AT  # noqa: E402

OUT = ROOT / "bench" / "results"


# The real pools' matrices are kept with the results (36 KB each): building one costs ~15
# minutes here, so a later run on another machine reuses them instead of rebuilding.
POOLS = OUT / "halving_pools"


def real_pools(paths: list[Path]) -> list[tuple[str, np.ndarray]]:
    """Full matrices of pipeline runs: candidates x tasks, success as 0/1."""
    pools = []
    for p in paths:
        m = pd.read_parquet(p).pivot_table(index="candidate", columns="task_id", values="success")
        # a run's folder (its data/eval/matrix.parquet), or a kept pool's file name
        name = p.parts[-4] if p.name == "matrix.parquet" else p.stem
        pools.append((f"real:{name}", m.dropna(axis=1).to_numpy(dtype=float)))
    return pools


CHECKPOINTS = 8  # a real pool's candidates: the warm start's run cut in this many equal parts


def make_real(folder: Path, seed: int) -> Path:
    """A real pool: one warm-start SFT run (params.yaml's policy and warmstart, suite seed `seed`,
    through the pipeline's builder, augment suites' demos included) saved at every eighth of its
    steps, so the candidates span the run from barely trained to the warm start the pipeline
    ships (pools of a run's first 200 steps were all near 0% success: nothing to choose), every
    checkpoint on every held-out task (the evaluate stage's code). A pool already built is
    reused: a stopped `--make-real N` resumes at the next seed."""
    import tempfile

    from rollwise.config import load_params
    from rollwise.envs.generate import generate_suite
    from rollwise.envs.runtime import load_suite
    from rollwise.policy.build import build_model, save_policy
    from rollwise.train.warmstart import augment_suites, sft_warm_start, suite_tokenizer
    from tasks.evaluate import evaluate_candidates, user_candidates

    kept = POOLS / f"{folder.name}.parquet"
    if kept.exists():
        return kept
    params = load_params(ROOT / "params.yaml", {"envs.seed": seed, "evaluate.method": "full"})
    generate_suite(params.envs, folder / "data" / "envs")
    suite = load_suite(folder / "data" / "envs")
    with tempfile.TemporaryDirectory() as scratch:  # the warm start's own words and demos
        tok = suite_tokenizer(suite, *augment_suites(params, Path(scratch)))
    model = build_model(tok, params.policy)
    total = params.warmstart.steps
    names = {total * k // CHECKPOINTS: f"sft_{total * k // CHECKPOINTS:03d}"
             for k in range(1, CHECKPOINTS + 1)}  # fmt: skip

    def save(step: int, loss: float) -> None:
        if step + 1 in names:
            save_policy(model, tok, folder / "models" / names[step + 1], {"sft_steps": step + 1})
            print(f"{folder.name}: saved {names[step + 1]} (loss {loss:.3f})", flush=True)

    sft_warm_start(params, suite, on_step=save, base=(model, tok))  # the pipeline's SFT
    found = user_candidates({n: f"models/{n}" for n in names.values()}, folder)
    evaluate_candidates(params, folder, found, folder / "data" / "eval")
    POOLS.mkdir(parents=True, exist_ok=True)
    shutil.copy(folder / "data" / "eval" / "matrix.parquet", kept)
    return kept


def fitted_pools(real: list[tuple[str, np.ndarray]], per: int) -> list[tuple[str, np.ndarray]]:
    """Matrices drawn from the 2PL fitted to each real matrix: same abilities and items."""
    pools = []
    for name, y in real:
        fit = fit_2pl(y)
        p = prob(fit.theta, fit.a, fit.b)  # (C, I)
        for s in range(per):
            draw = np.random.default_rng(1000 + s).random(p.shape) < p  # (C, I)
            pools.append((f"fitted:{name[5:]}:{s}", draw.astype(float)))
    return pools


def simulated_pools(n: int, n_c: int = 8, n_i: int = 300) -> list[tuple[str, np.ndarray]]:
    """Checkpoint series with known abilities; half closely matched, half well separated."""
    pools = []
    for s in range(n):
        rng = np.random.default_rng(s)
        spread = 0.3 if s % 2 == 0 else 0.8
        theta = np.sort(rng.normal(0, spread, n_c))  # (C,)
        a, b = np.exp(rng.normal(0, 0.5, n_i)), rng.normal(0, 1, n_i)  # (I,), (I,)
        y = rng.random((n_c, n_i)) < prob(theta, a, b)  # (C, I)
        pools.append((f"simulated:spread{spread}:{s}", y.astype(float)))
    return pools


def halving_choice(y: np.ndarray, budget: int, knobs: HalvingKnobs) -> tuple[int, int]:
    """(winner row, cells used) of paired successive halving on the pool."""
    names = [f"c{i}" for i in range(y.shape[0])]
    items = [f"t{j}" for j in range(y.shape[1])]

    def run_cells(c: str, its: list[str]) -> list[float]:
        return [y[int(c[1:]), int(it[1:])] for it in its]

    sel = select("halving", names, items, run_cells, budget, knobs)
    return int(sel.winner[1:]), sel.cells_used


def unpaired_choice(y: np.ndarray, budget: int, seed: int, eta: int = 2) -> tuple[int, int]:
    """Successive halving without pairing: the budget split evenly over the rungs; in each rung
    every survivor runs its own fresh random items; keep the top 1/eta by mean success."""
    rng = np.random.default_rng(seed)
    n_c, n_i = y.shape
    order = {c: list(rng.permutation(n_i)) for c in range(n_c)}
    seen: dict[int, list[int]] = {c: [] for c in range(n_c)}
    survivors, rungs = list(range(n_c)), max(1, math.ceil(math.log(n_c, eta)))
    for _ in range(rungs):
        k = max(1, budget // rungs // len(survivors))
        for c in survivors:
            seen[c] += order[c][len(seen[c]) : len(seen[c]) + k]
        mean = {c: y[c, seen[c]].mean() for c in survivors}
        survivors = sorted(survivors, key=lambda c: -mean[c])[: math.ceil(len(survivors) / eta)]
    return survivors[0], sum(len(v) for v in seen.values())


def random_choice(y: np.ndarray, budget: int, seed: int) -> tuple[int, int]:
    """Every candidate on the same random items, as many as the budget allows; best mean wins."""
    n_c, n_i = y.shape
    k = max(1, min(n_i, budget // n_c))
    cols = np.random.default_rng(seed).choice(n_i, k, replace=False)  # (k,)
    return int(np.argmax(y[:, cols].mean(1))), n_c * k


def score(y: np.ndarray, winner: int, cells: int) -> dict:
    mean = y.mean(1)  # (C,) full-evaluation success
    regret = 100 * (mean.max() - mean[winner])
    return {
        "cells_fraction": cells / y.size,
        "winner_exact": bool(winner == int(np.argmax(mean))),
        "winner_agreement": bool(regret <= 1.0 + 1e-9),
        "regret_pts": float(regret),
    }


def mean_score(rows: list[dict]) -> dict:
    """One pool's figures over its item orders: each the mean (agreement: the share of orders
    that agree), the largest cells fraction kept."""
    out = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
    return out | {"cells_fraction_max": max(r["cells_fraction"] for r in rows)}


def aggregate(rows: list[dict]) -> dict:
    keys = ("cells_fraction", "winner_agreement", "winner_exact", "regret_pts")
    out = {k: float(np.mean([r[k] for r in rows])) for k in keys}
    top = max(r["cells_fraction_max"] for r in rows)  # rows are mean_score's
    return out | {"cells_fraction_max": top, "pools": len(rows)}


def plot(per_method: dict[str, dict], ablation: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name, fig_ in per_method.items():
        ax.scatter(fig_["cells_fraction"], fig_["winner_agreement"], s=60, label=name)
    for name, fig_ in ablation.items():
        ax.scatter(fig_["cells_fraction"], fig_["winner_agreement"], s=60, facecolors="none",
                   edgecolors="tab:blue", label=f"halving, {name}")  # fmt: skip
    ax.scatter([1.0], [1.0], marker="*", s=120, color="k", label="full evaluation")
    ax.set_xlabel("cells executed / full evaluation")
    ax.set_ylabel("winner agreement with full (within 1 pt)")
    ax.set_xlim(0, 1.05)
    ax.set_ylim(0.5, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    ax.set_title("Checkpoint selection: cells spent vs agreement with full", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    real = sorted(ROOT.glob(".rollwise/bench/**/seed_*/data/eval/matrix.parquet"))
    real = [p for p in real if "halving_pools" not in p.parts] + sorted(POOLS.glob("*.parquet"))
    parser.add_argument("--matrices", type=Path, nargs="*", default=real)
    parser.add_argument("--make-real", type=int, default=0, metavar="N",
                        help="first build N real pools (seeds 0..N-1)")  # fmt: skip
    parser.add_argument("--sims", type=int, default=100)
    parser.add_argument("--fitted-per-real", type=int, default=4)
    parser.add_argument("--budget-frac", type=float, default=EvaluateConfig().budget_frac)
    parser.add_argument("--alpha", type=float, default=EvaluateConfig().halving.alpha,
                        help="the keep test's level (params evaluate.halving.alpha)")  # fmt: skip
    parser.add_argument(
        "--tolerance",
        type=float,
        default=EvaluateConfig().halving.tolerance,
        help="the stop's indifference zone (params evaluate.halving.tolerance)",
    )
    parser.add_argument(
        "--orders", type=int, default=4, help="item orders (halving seeds 0..K-1) averaged per pool"
    )
    parser.add_argument("--out", type=Path, default=OUT / "halving.json")
    args = parser.parse_args()
    t0 = time.perf_counter()
    made = [make_real(ROOT / ".rollwise" / "bench" / "halving_pools" / f"seed_{s}", s)
            for s in range(args.make_real)]  # fmt: skip
    real = real_pools(sorted({*args.matrices, *made}))
    pools = real + fitted_pools(real, args.fitted_per_real) + simulated_pools(args.sims)
    knobs = HalvingKnobs(**{**EvaluateConfig().halving.model_dump(), "alpha": args.alpha,
                            "tolerance": args.tolerance})  # fmt: skip

    def in_orders(y: np.ndarray, frac: float, k: HalvingKnobs) -> tuple[dict, list[int]]:
        """halving's mean score over the item orders, and the cells each order used."""
        runs = [halving_choice(y, math.floor(frac * y.size), replace(k, seed=o))
                for o in range(args.orders)]  # fmt: skip
        return mean_score([score(y, *r) for r in runs]), [c for _, c in runs]

    rows: dict[str, list[dict]] = {"halving": [], "unpaired_halving": [], "random_subsample": []}
    groups: dict[str, dict[str, list[dict]]] = {}
    for i, (name, y) in enumerate(pools):
        mine, cells = in_orders(y, args.budget_frac, knobs)
        n = args.orders
        results = {  # the baselines at the cells halving used in each order
            "halving": mine,
            "unpaired_halving": mean_score(
                [score(y, *unpaired_choice(y, c, seed=i * n + o)) for o, c in enumerate(cells)]),
            "random_subsample": mean_score(
                [score(y, *random_choice(y, c, seed=i * n + o)) for o, c in enumerate(cells)]),
        }  # fmt: skip
        group = name.split(":")[0] + (":" + name.split(":")[1] if "simulated" in name else "")
        for method, r in results.items():
            rows[method].append(r)
            groups.setdefault(group, {}).setdefault(method, []).append(r)
        print(name, y.shape, json.dumps(results["halving"]), flush=True)
    per_method = {m: aggregate(r) for m, r in rows.items()}
    ablation = {  # what the stop's tolerance and the per-selection cap each bought
        label: aggregate([in_orders(y, frac, k)[0] for _, y in pools])
        for label, k, frac in [
            ("tolerance 0 (the stop needs a win)", replace(knobs, tolerance=0.0), args.budget_frac),
            ("these knobs, cap 0.4", knobs, 0.4),
        ]
    }  # fmt: skip
    plot(per_method, ablation, args.out.with_suffix(".png"))
    real_rows = groups.get("real", {}).get("halving", [])  # the real pools alone (issue 42)
    real_fig = aggregate(real_rows) if real_rows else {}
    result = {
        "command": " ".join(["python bench/halving.py", *sys.argv[1:]]),
        "git_commit": STARTED_AT,
        "cells_fraction": per_method["halving"]["cells_fraction"],
        "cells_fraction_max": per_method["halving"]["cells_fraction_max"],
        "winner_agreement": per_method["halving"]["winner_agreement"],
        "targets": {"cells_fraction": "<= 0.4", "winner_agreement": ">= 0.95"},
        "winner_exact": per_method["halving"]["winner_exact"],
        "regret_pts": per_method["halving"]["regret_pts"],
        "baselines": {m: per_method[m] for m in ("unpaired_halving", "random_subsample")},
        "by_pool_group": {g: {m: aggregate(r) for m, r in ms.items()} for g, ms in groups.items()},
        "pools": len(pools),
        "real_pools": len(real),
        "real_cells_fraction": real_fig.get("cells_fraction"),
        "real_winner_agreement": real_fig.get("winner_agreement"),
        "real_targets": {
            "real_pools": ">= 10",
            "real_cells_fraction": "<= 0.4",
            "real_winner_agreement": ">= 0.95",
        },
        "real_matrices": [os.path.relpath(p, ROOT) for p in sorted({*args.matrices, *made})],
        "ablation": ablation,
        "pool_shapes": {name: list(y.shape) for name, y in pools},
        "budget_frac": args.budget_frac,
        "orders": args.orders,
        "knobs": knobs.__dict__,
        "plot": os.path.relpath(args.out.with_suffix(".png"), ROOT),
        "wall_s": time.perf_counter() - t0,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("cells_fraction", "winner_agreement", "baselines")}))


if __name__ == "__main__":
    main()
