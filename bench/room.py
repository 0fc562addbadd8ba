"""Room for RL: how much of a learning bench's held-out figure sampling already reaches.

GRPO can only amplify successes its groups draw. For the warm start, on the very tasks the
learning benches score, this measures greedy success (what they report), the success of one
sample at the rollout temperature and pass@G (G = rollout.samples_per_task), and so the room:
pass@G minus greedy, the points a policy that always decoded its group's best sample would
gain. A room far above what RL gained says the signal is drawn but not learned from; a room
near zero says no RL method can gain there.

    .venv/bin/python bench/room.py warmstart.steps=800 warmstart.stop_at_success=0.5 \
        rollout.temperature=0.5 --warm-start <folder> [--cache DIR] [--out bench/results/room.json]

Task sets: `credit_long_heldout` (bench/credit.py's long held-out tasks), `curator_heldout`
(bench/curator.py's, at --eval-tasks), `credit_long_train` (a sample of the long train tasks
the credit arms train on) and, with a validation suite (`warmstart.stop_at_success`), the
unseen suite's long tasks and all its tasks (bench/unseen.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.credit import LONG_KINDS, limits_of, long_heldout_tasks, long_tasks, setup  # noqa: E402
from bench.generalization import sampled  # noqa: E402
from bench.provenance import STARTED_AT  # noqa: E402
from bench.unseen import unseen_suite, unseen_tasks  # noqa: E402
from rollwise.config import apply_overrides, read_raw, validate  # noqa: E402
from rollwise.envs.runtime import load_suite  # noqa: E402
from rollwise.evaluate.full import evaluate_policy, evaluation_tasks  # noqa: E402
from rollwise.policy.build import load_policy  # noqa: E402
from rollwise.policy.hf import HFBackend  # noqa: E402


def room(model, tok, suite, tasks: list, p) -> dict:
    """room_figures for the policy's greedy episodes and G samples a task at the rollout's T."""
    limits = limits_of(p, seed=0, greedy=True)
    greedy = evaluate_policy(HFBackend(model, tok), tok, suite, tasks, limits)
    drawn = sampled(model, tok, suite, tasks, p, p.rollout.samples_per_task, p.rollout.temperature)
    return room_figures(greedy, drawn)


def room_figures(greedy: pd.DataFrame, drawn: pd.DataFrame) -> dict:
    """Greedy success, one sample's success, pass@G and their gap (points), per task pooled,
    from one greedy episode and G sampled episodes a task (`task_id`, `success` columns)."""
    per_task = drawn.groupby("task_id")["success"]
    table = pd.DataFrame({
        "greedy": greedy.groupby("task_id")["success"].max().astype(float),
        "rate": per_task.mean().astype(float),
        "hit": per_task.max().astype(bool),
    })  # fmt: skip
    solved_by_sample_only = (table["greedy"] == 0) & table["hit"]
    return {
        "tasks": len(table),
        "greedy": round(100 * table["greedy"].mean(), 1),
        "sampled": round(100 * table["rate"].mean(), 1),
        "pass_at_g": round(100 * table["hit"].mean(), 1),
        "room_pts": round(100 * (table["hit"] - table["greedy"]).mean(), 1),
        # where the room is: tasks greedy fails that a sample solves, and how often it does
        "greedy_missed_sample_solved_pct": round(100 * solved_by_sample_only.mean(), 1),
        "sample_rate_on_those": round(float(table.loc[solved_by_sample_only, "rate"].mean()), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--warm-start", type=Path, help="a saved policy folder (else built)")
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise" / "bench" / "credit")
    parser.add_argument("--eval-tasks", type=int, default=300, help="bench/curator.py's")
    parser.add_argument("--train-tasks", type=int, default=128)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "room.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    overrides = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in args.overrides)}
    p = validate(apply_overrides(read_raw(ROOT / "params.yaml"), overrides))
    args.cache.mkdir(parents=True, exist_ok=True)
    suite, _, folder = setup(p, args.cache, args.warm_start)
    model, tok = load_policy(folder)
    model.eval()
    train_ids = random.Random(0).sample(long_tasks(suite, "train"), args.train_tasks)
    sets = {
        "credit_long_heldout": (suite, long_heldout_tasks(suite)),
        "curator_heldout": (suite, evaluation_tasks(suite, "heldout", args.eval_tasks)),
        "credit_long_train": (suite, [suite.tasks[t] for t in sorted(train_ids)]),
    }  # fmt: skip
    unseen_dir = unseen_suite(p, args.cache, tok)
    if unseen_dir is not None:
        unseen = load_suite(unseen_dir)
        sets["unseen_long"] = (unseen, unseen_tasks(unseen, p, LONG_KINDS))
        sets["unseen_all"] = (unseen, unseen_tasks(unseen, p))
    result: dict = {}
    for name, (task_suite, tasks) in sets.items():
        t0 = time.perf_counter()
        result[name] = room(model, tok, task_suite, tasks, p)
        result[name]["wall_s"] = round(time.perf_counter() - t0, 1)
        print(name, json.dumps(result[name]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python bench/room.py " + " ".join(sys.argv[1:]),
        "git_commit": STARTED_AT,
        "warm_start": str(folder),
        "samples_per_task": p.rollout.samples_per_task,
        "temperature": p.rollout.temperature,
        **result,
    }, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
