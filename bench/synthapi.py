"""SynthAPI at CPU scale: does tool/database diversity beat task volume at a fixed budget?

1. Speed: one process generates 1,000 environments x 50 tasks, with every diversity knob on
   (`generate_1000x50_s`, target <= 300 s) and with the default knobs.
2. The sweep: one pool suite with every diversity knob on (entity and tool synonyms, 7 of 9 tool
   templates, a distractor, 3 schema templates, sizes 6..8, 3 amount distributions, 2 amount
   types, all 13 task kinds). Its last `--eval-envs` environments are held out; arm ExT trains on
   E pool environments x T tasks each (E*T equal across arms), so arms differ only in how many
   distinct tool sets, schemas and databases they see. Every arm is trained with the default
   pipeline's warm start (the tiny policy of params `policy`, SFT on oracle trajectories with
   params `warmstart`: same steps and batch, so the same gradient budget) and evaluated greedily
   on the same tasks of the held-out environments. No RL rounds: they did not fit the ~15 minute
   budget on one torch thread (the warm start is the pipeline's first training stage).

    .venv/bin/python bench/synthapi.py [--arms 4x60 12x20 24x10] [--seeds 0] [--steps N]
    # bench/results/synthapi.json (~18 min on 2 cores shared with other jobs):
    .venv/bin/python bench/synthapi.py --steps 160 --batch-size 16 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.provenance import STARTED_AT  # noqa: E402
from rollwise.config import EnvsConfig, read_raw, validate  # noqa: E402
from rollwise.envs.generate import KINDS, generate_suite  # noqa: E402
from rollwise.envs.runtime import Suite, load_suite  # noqa: E402
from rollwise.envs.spec import DISTRACTORS, DOMAINS, TOOL_TEMPLATES  # noqa: E402
from rollwise.evaluate.full import evaluate_policy, summarize, wilson  # noqa: E402
from rollwise.policy.build import build_model  # noqa: E402
from rollwise.policy.hf import HFBackend  # noqa: E402
from rollwise.rollout.engine import Limits  # noqa: E402
from rollwise.train.sft import oracle_sequence, sft  # noqa: E402
from rollwise.train.warmstart import suite_tokenizer  # noqa: E402

DIVERSE = {
    "domains": list(DOMAINS),
    "entity_synonyms": True,
    "tool_synonyms": True,
    "tool_templates": [t for t in TOOL_TEMPLATES if t not in DISTRACTORS],
    "tools_per_env": 7,
    "distractor_tools": 1,
    "schema_templates": 3,
    "owners_min": 6,
    "value_dists": ["uniform", "skewed", "narrow"],
    "amount_types": ["integer", "real"],
    "task_kinds": list(KINDS),
    "heldout_envs": 0,
    "heldout_task_frac": 0.0,
}


def timed_generation(cfg: EnvsConfig) -> tuple[float, dict]:
    out = Path(tempfile.mkdtemp(prefix="synthapi-speed-"))
    try:
        t0 = time.perf_counter()
        counts = generate_suite(cfg, out)
        return time.perf_counter() - t0, counts
    finally:
        shutil.rmtree(out, ignore_errors=True)


def by_hash(tasks: list) -> list:
    return sorted(tasks, key=lambda t: hashlib.sha256(t.task_id.encode()).hexdigest())


def arm_tasks(suite: Suite, pool: list[str], n_envs: int, per_env: int) -> list:
    """The first `n_envs` pool environments holding at least `per_env` tasks, `per_env` each."""
    chosen, out = 0, []
    for env_id in pool:
        tasks = [t for t in suite.tasks.values() if t.env_id == env_id]
        if len(tasks) >= per_env and chosen < n_envs:
            out += by_hash(tasks)[:per_env]
            chosen += 1
    if chosen < n_envs:
        raise SystemExit(f"only {chosen} pool environments hold {per_env} tasks")
    return out


def run_arm(arm: str, suite, pool, heldout, tok, p, seed: int) -> dict:
    n_envs, per_env = map(int, arm.split("x"))
    train = arm_tasks(suite, pool, n_envs, per_env)
    torch.manual_seed(seed)
    model = build_model(tok, p.policy.model_copy(update={"seed": seed}))
    demos = [oracle_sequence(t, suite.envs[t.env_id], tok) for t in train]
    t0 = time.perf_counter()
    sft(model, demos, p.warmstart.model_copy(update={"seed": seed}), tok.pad_token_id)
    t1 = time.perf_counter()
    limits = Limits(
        max_turns=p.evaluate.max_turns,
        max_new_tokens=p.evaluate.max_new_tokens,
        max_context=p.policy.max_context,
        greedy=True,
    )
    episodes = evaluate_policy(HFBackend(model.eval(), tok), tok, suite, heldout, limits)
    summary = summarize(episodes)
    kinds = {t.task_id: t.kind for t in heldout}
    by_kind = episodes.groupby(episodes["task_id"].map(kinds))["success"].mean()
    return {
        "arm": arm,
        "seed": seed,
        "train_envs": n_envs,
        "tasks_per_env": per_env,
        "train_tasks": len(train),
        "distinct_tool_names": len({c.name for t in train for c in t.oracle}),
        "heldout_success": summary["success"],
        "heldout_success_lo": summary["success_lo"],
        "heldout_success_hi": summary["success_hi"],
        "heldout_reward": summary["reward"],
        "heldout_by_kind": by_kind.round(3).to_dict(),
        "sft_s": t1 - t0,
        "eval_s": time.perf_counter() - t1,
    }


def point(arm: str, mine: list[dict], n_tasks: int) -> dict:
    """One point of the curve: means over seeds, and the pooled 95% interval of success."""
    shape = {k: mine[0][k] for k in ("train_envs", "tasks_per_env")}
    means = {k: sum(r[k] for r in mine) / len(mine) for k in ("heldout_success", "heldout_reward")}
    wins = round(sum(r["heldout_success"] for r in mine) * n_tasks)
    lo, hi = wilson(wins, n_tasks * len(mine))
    return {"arm": arm, **shape, **means, "heldout_success_lo": lo, "heldout_success_hi": hi}


def success_of(runs: list[dict], arm: str, seed: int) -> float:
    return next(r["heldout_success"] for r in runs if r["arm"] == arm and r["seed"] == seed)


def verdict(diverse: dict, volume: dict, by_seed: list[float]) -> str:
    """Plain words: a winner only when every seed agrees and the pooled intervals are apart."""
    apart = diverse["heldout_success_lo"] > volume["heldout_success_hi"]
    if all(g > 0 for g in by_seed) and apart:
        return "diversity beats volume at this scale"
    if all(g < 0 for g in by_seed) and volume["heldout_success_lo"] > diverse["heldout_success_hi"]:
        return "volume beats diversity at this scale"
    return "no winner at this scale: the difference is within noise (overlapping 95% intervals)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arms", nargs="+", default=["4x60", "12x20", "24x10"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=None, help="warm-start steps (params')")
    parser.add_argument("--batch-size", type=int, default=None, help="warm-start batch (params')")
    parser.add_argument("--pool-envs", type=int, default=24)
    parser.add_argument("--eval-envs", type=int, default=8)
    parser.add_argument("--eval-tasks", type=int, default=160)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--git-commit", default="unknown", help="when cwd is not a git checkout")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/synthapi.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    p = validate(read_raw(ROOT / "params.yaml"))
    knobs = {"steps": args.steps, "batch_size": args.batch_size}
    knobs = {k: v for k, v in knobs.items() if v is not None}
    p = p.model_copy(update={"warmstart": p.warmstart.model_copy(update=knobs)})
    result: dict = {"command": "python bench/synthapi.py " + " ".join(sys.argv[1:])}
    result["git_commit"] = args.git_commit if STARTED_AT == "unknown" else STARTED_AT
    if not args.skip_speed:
        big = {"n_envs": 1000, "tasks_per_env": 50, "heldout_envs": 20}
        diverse_s, diverse_counts = timed_generation(EnvsConfig(**{**DIVERSE, **big}))
        default_s, default_counts = timed_generation(EnvsConfig(**big))
        result |= {
            "generate_1000x50_s": diverse_s,
            "generate_1000x50_counts": diverse_counts,
            "generate_1000x50_default_knobs_s": default_s,
            "generate_1000x50_default_knobs_counts": default_counts,
            "generate_target_s": 300,
        }
        print(json.dumps({k: v for k, v in result.items() if k.startswith("generate")}), flush=True)

    per_env = max(int(a.split("x")[1]) for a in args.arms)
    n_envs = args.pool_envs + args.eval_envs
    pool_cfg = EnvsConfig(**{**DIVERSE, "n_envs": n_envs, "tasks_per_env": per_env})
    with tempfile.TemporaryDirectory(prefix="synthapi-pool-") as tmp:
        counts = generate_suite(pool_cfg, Path(tmp))
        suite = load_suite(Path(tmp))
        env_ids = sorted(suite.envs, key=lambda e: int(e.rsplit("_", 1)[1]))
        pool, held_envs = env_ids[: args.pool_envs], set(env_ids[args.pool_envs :])
        heldout = by_hash([t for t in suite.tasks.values() if t.env_id in held_envs])
        heldout = heldout[: args.eval_tasks]
        tok = suite_tokenizer(suite)  # vocabulary of every environment, as the warm start does
        runs = [
            run_arm(arm, suite, pool, heldout, tok, p, seed)
            for seed in args.seeds
            for arm in args.arms
        ]
        for run in runs:
            print(json.dumps(run), flush=True)
    curve = [point(arm, [r for r in runs if r["arm"] == arm], len(heldout)) for arm in args.arms]
    diverse = max(curve, key=lambda c: c["train_envs"])
    volume = min(curve, key=lambda c: c["train_envs"])
    gap = 100 * (diverse["heldout_success"] - volume["heldout_success"])
    by_seed = [
        100 * (success_of(runs, diverse["arm"], s) - success_of(runs, volume["arm"], s))
        for s in args.seeds
    ]
    result |= {
        "pool": {"config": pool_cfg.model_dump(), "counts": counts, "eval_envs": sorted(held_envs)},
        "warmstart": p.warmstart.model_dump(),
        "policy": p.policy.model_dump(),
        "eval_tasks": len(heldout),
        "diversity_minus_volume_pts": gap,
        "diversity_minus_volume_pts_by_seed": by_seed,
        "verdict": verdict(diverse, volume, by_seed),
        "diversity_minus_volume_reward_pts": 100
        * (diverse["heldout_reward"] - volume["heldout_reward"]),
        "most_diverse_arm": diverse["arm"],
        "most_voluminous_arm": volume["arm"],
        "curve": curve,
        "runs": runs,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("diversity_minus_volume_pts", "curve")}, indent=1))


if __name__ == "__main__":
    main()
