"""SMITH bench (issue 38): does training one policy to build tools as well as use them raise
held-out use success over use-only training at equal rollouts?

Scripted part (no model, every family): the oracle's build, a build that memorized its three
examples, the sibling family's reference (a tool recalled rather than read from the examples),
and a hostile one, each through `define_tool`: the three reward axes apart
(`scripted_axes`) and what the pool admits of each (`scripted_admitted`).

Learning part, per seed: one warm start (SFT on the joint suite's train demos: build and use),
then `--rounds` rounds (rollwise.loop.run_rounds, the stages' own functions) in each arm, the
same tasks a round and samples a task, so equal rollouts:
- `joint`: build and use tasks (`envs.custom: rollwise.envs.toolsmith:toolsmith`); every
  round's curate step offers the successful builds to the tool pool (admitted on fresh-input
  evidence, envs/tool_pool.py; the pipeline's data/curated/round_NN/tool_pool.json), the bench
  writes each version as `pool_round_NN.json`, and later use episodes call the pool's newest
  admitted version;
- `use_only`: the same use tasks, no build tasks (`...:toolsmith_use_only`).
Held-out use success (greedy, the same held-out use tasks for both arms) before and after;
`joint_minus_use_only_pts` is the median over seeds of the joint arm's final minus the use-only
arm's (target >= +5). Per round: the three axes' mean over build episodes, pool size, verified
share.

    .venv/bin/python bench/smith.py [key=value ...] [--recipe smollm2|tiny] [--seeds 0 1 2] \
        [--rounds 8] [--workers 2] [--work .rollwise/bench/smith] [--out bench/results/smith.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")
import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    arm_params,
    bench_params,
    parse_overrides,
    seeded,
    suite_at,
    warm_start_folder,
)
from bench.learning import RECIPES, heldout_episodes  # noqa: E402
from bench.parallel import run_jobs  # noqa: E402
from bench.provenance import STARTED_AT  # noqa: E402
from rollwise import loop  # noqa: E402
from rollwise.envs.tool_pool import ToolPool  # noqa: E402
from rollwise.envs.toolsmith import AXES, FAMILIES, Toolsmith, make_tasks  # noqa: E402
from rollwise.policy.build import load_policy  # noqa: E402
from rollwise.types import ToolCall  # noqa: E402

ARMS = {"joint": "rollwise.envs.toolsmith:toolsmith",
        "use_only": "rollwise.envs.toolsmith:toolsmith_use_only"}  # fmt: skip
# A define_tool call carries a schema and a function: ~100-150 tokens where a lookup call has 30.
SMITH = {"rollout.max_new_tokens": 192, "evaluate.max_new_tokens": 192}
HOSTILE = "import os\ndef {name}(**kw):\n    return os.listdir('/')\n"


def scripted() -> dict:
    """Each family's oracle, memorized, sibling and hostile builds: the axes apart, admission."""
    env, axes, admitted = Toolsmith(), {}, {}
    for task in make_tasks(per_family=1, kinds=("build",)):
        key = task.env_id.removeprefix("smith-")
        family, name = FAMILIES[key], FAMILIES[key].name
        shown = {json.dumps(e["args"], sort_keys=True): e["out"] for e in task.target["examples"]}
        memorized = (f"import json\ndef {name}(**kw):\n    return {shown!r}"
                     ".get(json.dumps(kw, sort_keys=True))\n")  # fmt: skip
        sibling = FAMILIES[family.sibling].source()  # the pair's other rule: a recalled tool
        schema = family.schema()
        builds = {"oracle": family.source(), "memorized": memorized, "sibling": sibling,
                  "hostile": HOSTILE.format(name=name)}  # fmt: skip
        for label, code in builds.items():
            env.reset(task, seed=0)
            env.step(ToolCall("define_tool", {"schema": schema, "code": code}))
            scores = env.verify("done", []).scores
            axes.setdefault(label, []).append([scores[a] for a in AXES])
            why = ToolPool().admit(key, schema, code, f"scripted {label}")
            admitted.setdefault(label, []).append(why is None)
    return {"scripted_axes": {k: dict(zip(AXES, np.mean(v, axis=0).tolist(), strict=True))
                              for k, v in axes.items()},
            "scripted_admitted": {k: float(np.mean(v)) for k, v in admitted.items()}}  # fmt: skip


def use_success(model, tok, suite, p, n: int) -> tuple[float, list[str]]:
    """Greedy success on the suite's first `n` held-out use tasks (both arms: the same ones)."""
    use = suite.catalog[(suite.catalog["split"] == "heldout") & (suite.catalog["kind"] == "use")]
    ids = set(use["task_id"])
    sub = type(suite)(suite.catalog[suite.catalog["task_id"].isin(ids)],
                      {k: t for k, t in suite.tasks.items() if k in ids}, suite.envs)  # fmt: skip
    episodes = heldout_episodes(model, tok, sub, p, n)
    return float(episodes["success"].mean()), list(episodes["task_id"])


def run_arm(arm: str, seed: int, folder: Path, p, args, work: Path) -> dict:
    """One arm of one seed from the seed's warm start `folder` (a process of its own with
    --workers: everything it needs is in its arguments)."""
    torch.set_num_threads(args.threads)
    cfg = arm_params(p, {**seeded(seed), "envs.custom": ARMS[arm], "rounds": args.rounds})
    suite, _ = suite_at(args.cache, cfg.envs)
    model, tok = load_policy(folder)
    eval_suite, _ = suite_at(args.cache, arm_params(p, {"envs.custom": ARMS["joint"]}).envs)
    start, _ = use_success(model, tok, eval_suite, cfg, args.eval_tasks)
    rounds, t0 = [], time.perf_counter()

    def on_round(r: int, done: loop.Round) -> None:  # the pool: the curate stage's (loop.py)
        done.curated.tools.save(work / f"{arm}_seed{seed}" / f"pool_round_{r:02d}.json")
        m = done.curated.metrics
        rounds.append({"round": r, "sample_success": done.rollout.metrics["success_rate"],
                       **{a: m[a] for a in AXES if a in m}, "submitted": m["tools_submitted"],
                       "admitted": m["tools_admitted"], "pool_built": m["tools_built"],
                       "verified_share": m.get("tools_verified_share"),
                       "wall_s": time.perf_counter() - t0})  # fmt: skip
        print(json.dumps({"arm": arm, "seed": seed, **rounds[-1]}), flush=True)

    model, _ = loop.run_rounds(cfg, suite, model, tok, args.rounds, on_round=on_round)
    end, tasks = use_success(model, tok, eval_suite, cfg, args.eval_tasks)
    return {"arm": arm, "seed": seed, "use_success_start": start, "use_success": end,
            "eval_tasks": len(tasks), "rounds": rounds}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*", help="dotted params overrides key=value")
    parser.add_argument("--recipe", choices=list(RECIPES), default="smollm2")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--eval-tasks", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="torch threads a process")
    parser.add_argument("--workers", type=int, default=1, help="arms run side by side")
    parser.add_argument("--scripted-only", action="store_true", help="no model: part one only")
    parser.add_argument("--work", type=Path, default=ROOT / ".rollwise/bench/smith")
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise/bench/smith/cache")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/smith.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    overrides = {**RECIPES[args.recipe], **SMITH, **parse_overrides(args.overrides)}
    p = bench_params({**overrides, "envs.custom": ARMS["joint"]})
    t0 = time.perf_counter()
    result = {"command": "python bench/smith.py " + " ".join(sys.argv[1:]),
              "git_commit": STARTED_AT, "recipe": args.recipe, "overrides": overrides,
              **scripted()}  # fmt: skip
    jobs = []
    for seed in [] if args.scripted_only else args.seeds:
        cfg = arm_params(p, {**seeded(seed), "warmstart.seed": seed})
        suite, _ = suite_at(args.cache, cfg.envs)
        folder = warm_start_folder(cfg, suite, args.cache)  # one start for both arms
        jobs += [(arm, seed, folder, p, args, args.work) for arm in ARMS]
    runs = run_jobs(run_arm, jobs, args.workers)
    by = {arm: {r["seed"]: r["use_success"] for r in runs if r["arm"] == arm} for arm in ARMS}
    diffs = [100 * (by["joint"][s] - by["use_only"][s]) for s in by["joint"]]
    result |= {"joint_minus_use_only_pts": float(np.median(diffs)) if diffs else None,
               "joint_minus_use_only_pts_by_seed": diffs, "runs": runs,
               "wall_s": time.perf_counter() - t0}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1, default=float))


if __name__ == "__main__":
    main()
