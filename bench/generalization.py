"""Where the warm start's success comes from: greedy success on train tasks vs held-out tasks of
seen environments vs unseen environments, per task kind. A policy that scores far higher on
train tasks than on held-out tasks of the same environments memorized its demonstrations, and RL
on train tasks cannot be expected to transfer. Reuses bench/rl_probe.py's cached suite and SFT
checkpoint (run the probe with the same overrides first).

    .venv/bin/python bench/generalization.py warmstart.steps=800 [--out FILE.json] \
        [--samples 8 --temperature 0.7] [--warm-start models/round_00]

With --samples K it also samples K episodes per task (at the rollout's temperature): per kind,
the sampled success and pass@K, which bounds what RL's group sampling can find and amplify: a
kind with pass@K near 0 gives GRPO no success to learn from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.provenance import STARTED_AT  # noqa: E402
from bench.rl_probe import by_kind, warm_start  # noqa: E402
from rollwise.config import apply_overrides, read_raw, validate  # noqa: E402
from rollwise.evaluate.full import evaluate_policy, evaluation_tasks  # noqa: E402
from rollwise.policy.hf import HFBackend  # noqa: E402
from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes  # noqa: E402


def sampled(model, tok, suite, tasks, p, k: int, temperature: float) -> pd.DataFrame:
    """K sampled episodes per task, one row each, as a rollout round would draw them."""
    specs = [
        EpisodeSpec(f"s/{t.task_id}/{i}", t, clone_env(suite.envs[t.env_id]), group=t.task_id,
                    sample=i, seed=i)
        for t in tasks for i in range(k)
    ]  # fmt: skip
    limits = Limits(max_context=p.policy.max_context, temperature=temperature,
                    max_new_tokens=p.evaluate.max_new_tokens)  # fmt: skip
    return pd.DataFrame(run_episodes(specs, HFBackend(model, tok), tok, limits)[0])


def pass_at_k(episodes: pd.DataFrame, by: str | None = None) -> dict:
    per_task = episodes.groupby(["task_id", *([by] if by else [])])["success"]
    solved = per_task.max().astype(float)
    if by is None:
        return {"success": float(episodes["success"].mean()), "pass_at_k": float(solved.mean())}
    return {
        kind: {"success": round(float(rows["success"].mean()), 3),
               "pass_at_k": round(float(solved.xs(kind, level=by).mean()), 3)}
        for kind, rows in episodes.groupby(by)
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise" / "probe")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/generalization.json")
    parser.add_argument("--samples", type=int, default=0, help="K sampled episodes per task")
    parser.add_argument("--temperature", type=float, default=None, help="default: the rollout's")
    parser.add_argument("--warm-start", type=Path, help="a saved policy folder instead of the SFT")
    parser.add_argument("--splits", nargs="+", choices=["train", "heldout"],
                        default=["train", "heldout"])  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    overrides = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in args.overrides)}
    p = validate(apply_overrides(read_raw(ROOT / "params.yaml"), overrides))
    args.cache.mkdir(parents=True, exist_ok=True)
    suite, model, tok = warm_start(p, args.cache, args.warm_start)
    catalog = suite.catalog.set_index("task_id")
    limits = Limits(max_context=p.policy.max_context, greedy=True,
                    max_new_tokens=p.evaluate.max_new_tokens)  # fmt: skip
    result: dict = {}
    for split in args.splits:
        tasks = evaluation_tasks(suite, split, p.evaluate.max_tasks)
        episodes = evaluate_policy(HFBackend(model, tok), tok, suite, tasks, limits)
        episodes["unseen_env"] = episodes["task_id"].map(catalog["heldout_env"])
        result[split] = {
            "n": len(episodes),
            "success": float(episodes["success"].mean()),
            "by_env": {
                ("unseen_env" if k else "seen_env"): float(v)
                for k, v in episodes.groupby("unseen_env")["success"].mean().items()
            },
            "by_kind": by_kind(episodes, suite),
        }
        if args.samples:
            temperature = args.temperature or p.rollout.temperature
            drawn = sampled(model, tok, suite, tasks, p, args.samples, temperature)
            drawn["kind"] = drawn["task_id"].map(catalog["kind"])
            result[split]["sampled"] = {
                "k": args.samples, "temperature": temperature, **pass_at_k(drawn),
                "by_kind": pass_at_k(drawn, "kind"),
            }  # fmt: skip
        print(split, json.dumps(result[split]), flush=True)
    args.out.write_text(json.dumps({
        "command": "python bench/generalization.py " + " ".join(sys.argv[1:]),
        "git_commit": STARTED_AT,
        "train_minus_heldout_seen_env_pts": 100 * (
            result["train"]["success"] - result["heldout"]["by_env"].get("seen_env", 0.0)
        ) if len(result) == 2 else None,
        **result,
    }, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
