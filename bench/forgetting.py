"""Forgetting: what one round of the credit bench's RL does to the task kinds it does not train.

bench/credit.py trains and scores long tasks (status, amount, cancel) only, while the guard
(`train.guard.suite: train`) decodes the first train tasks of every kind. This bench takes the
warm start, runs one round of that recipe (GRPO, `--tasks` long train tasks x G, the trainer of
the pipeline) once per variant (extra overrides), and reports greedy success per kind on the
guard's tasks and on the long held-out tasks, before and after. Every variant starts from the
same weights and trains on the same sampled episodes (sampled once, before any update), under
`--orders` minibatch shuffles (train.seed + i): which kind a round breaks depends on it.

    .venv/bin/python bench/forgetting.py warmstart.steps=800 warmstart.stop_at_success=0.5 \
        train.lr=0.0005 train.kl_coef=0.2 train.minibatches=4 rollout.temperature=0.5 \
        credit.reward=success --warm-start <folder> \
        --variants base train.adam_eps=0.0001 train.lr=0.0001 train.kl_coef=0.0
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402
import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import reference_policy  # noqa: E402
from bench.credit import limits_of, long_heldout_tasks, long_tasks, sample, setup  # noqa: E402
from bench.provenance import STARTED_AT  # noqa: E402
from rollwise.config import apply_overrides, read_raw, validate  # noqa: E402
from rollwise.credit import ESTIMATORS, trained_reward  # noqa: E402
from rollwise.evaluate.full import evaluate_policy, evaluation_tasks  # noqa: E402
from rollwise.policy.build import load_policy  # noqa: E402
from rollwise.policy.hf import HFBackend  # noqa: E402
from rollwise.train.trainer import make_optimizer, train_round, training_batch  # noqa: E402


def greedy_by_kind(model, tok, suite, tasks: list, p) -> dict:
    """Greedy success overall and per task kind (percent)."""
    limits = limits_of(p, seed=0, greedy=True)
    episodes = evaluate_policy(HFBackend(model, tok), tok, suite, tasks, limits)
    model.train()
    kinds = episodes["task_id"].map({t.task_id: t.kind for t in tasks})
    by_kind = episodes.groupby(kinds)["success"].mean()
    return {"success": round(100 * float(episodes["success"].mean()), 1),
            "by_kind": {k: round(100 * float(v), 1) for k, v in by_kind.items()}}  # fmt: skip


def worst_untrained(before: dict, after: dict, trained: set[str]) -> tuple[str, float]:
    """The kind outside `trained` whose success (points, by kind) fell most, and by how much."""
    drops = {k: before[k] - v for k, v in after.items() if k not in trained}
    worst = max(drops, key=drops.get)
    return worst, round(drops[worst], 1)


def parse(pairs: list[str]) -> dict:
    return {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in pairs)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--variants", nargs="+", default=["base"],
                        help="'base' or key=value[,key=value] on top of the overrides")  # fmt: skip
    parser.add_argument("--warm-start", type=Path, help="a saved policy folder (else built)")
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise" / "bench" / "credit")
    parser.add_argument("--tasks", type=int, default=128, help="long train tasks in the round")
    parser.add_argument("--guard-tasks", type=int, default=128)
    parser.add_argument("--orders", type=int, default=3, help="shuffles (train.seed + i) a variant")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/forgetting.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    raw, overrides = read_raw(ROOT / "params.yaml"), parse(args.overrides)
    base = validate(apply_overrides(raw, overrides))
    args.cache.mkdir(parents=True, exist_ok=True)
    suite, _, folder = setup(base, args.cache, args.warm_start)
    model, tok = load_policy(folder)
    guard = evaluation_tasks(suite, "train", args.guard_tasks)
    heldout = long_heldout_tasks(suite)
    start = {"guard": greedy_by_kind(model, tok, suite, guard, base),
             "long_heldout": greedy_by_kind(model, tok, suite, heldout, base)}  # fmt: skip
    print(json.dumps({"start": start}), flush=True)
    picked = random.Random(1).sample(long_tasks(suite, "train"), args.tasks)
    g = base.rollout.samples_per_task
    episodes, steps = sample(model, tok, suite, base, picked, g, 1, "forgetting")
    episodes = trained_reward(episodes.assign(policy_version=0), base.credit.reward)
    adv = ESTIMATORS["grpo"](episodes, steps, base.credit.model_copy(update={"method": "grpo"}))
    items = training_batch(episodes, adv)
    long_kinds = {t.kind for t in heldout}
    result = {}
    for variant in args.variants:
        extra = {} if variant == "base" else parse(variant.split(","))
        p = validate(apply_overrides(raw, {**overrides, **extra}))
        result[variant] = []
        for order in range(args.orders):  # train.seed + order: the minibatch shuffle
            model, tok = load_policy(folder)
            cfg = p.train.model_copy(update={"seed": p.train.seed + order})
            optimizer, anchor = make_optimizer(model, cfg), reference_policy(model, cfg)
            stats = train_round(model, items, cfg, optimizer, tok.pad_token_id, anchor,
                                temperature=p.rollout.temperature)  # fmt: skip
            after = greedy_by_kind(model, tok, suite, guard, p)
            worst, drop = worst_untrained(start["guard"]["by_kind"], after["by_kind"], long_kinds)
            result[variant].append({
                "order": order, "guard": after,
                "long_heldout": greedy_by_kind(model, tok, suite, heldout, p),
                "worst_untrained_kind": worst,
                "worst_untrained_drop_pts": drop,
                **{k: round(float(stats[k]), 4) for k in ("approx_kl", "kl_ref", "grad_norm")
                   if k in stats},
            })  # fmt: skip
            print(json.dumps({variant: result[variant][-1]}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python bench/forgetting.py " + " ".join(sys.argv[1:]),
        "git_commit": STARTED_AT,
        "warm_start": str(folder),
        "round_sample_success": round(float(episodes["success"].mean()), 3),
        "start": start,
        "after_one_round": result,
        "worst_untrained_drop_pts": {v: [r["worst_untrained_drop_pts"] for r in runs]
                                     for v, runs in result.items()},
        "long_heldout_after": {v: [r["long_heldout"]["success"] for r in runs]
                               for v, runs in result.items()},
    }, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
