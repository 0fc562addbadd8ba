"""Where the warm start's success comes from: greedy success on train tasks vs held-out tasks of
seen environments vs unseen environments, per task kind. A policy that scores far higher on
train tasks than on held-out tasks of the same environments memorized its demonstrations, and RL
on train tasks cannot be expected to transfer. Reuses bench/rl_probe.py's cached suite and SFT
checkpoint (run the probe with the same overrides first).

    .venv/bin/python bench/generalization.py warmstart.steps=800 [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rl_probe import warm_start  # noqa: E402
from rollwise.config import apply_overrides, read_raw, validate  # noqa: E402
from rollwise.evaluate.full import evaluate_policy, evaluation_tasks  # noqa: E402
from rollwise.policy.hf import HFBackend  # noqa: E402
from rollwise.rollout.engine import Limits  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise" / "probe")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/generalization.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    overrides = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in args.overrides)}
    p = validate(apply_overrides(read_raw(ROOT / "params.yaml"), overrides))
    args.cache.mkdir(parents=True, exist_ok=True)
    suite, model, tok = warm_start(p, args.cache)
    catalog = suite.catalog.set_index("task_id")
    limits = Limits(max_context=p.policy.max_context, greedy=True)
    result: dict = {}
    for split in ("train", "heldout"):
        tasks = evaluation_tasks(suite, split, p.evaluate.max_tasks)
        episodes = evaluate_policy(HFBackend(model, tok), tok, suite, tasks, limits)
        episodes["unseen_env"] = episodes["task_id"].map(catalog["heldout_env"])
        episodes["kind"] = episodes["task_id"].map(catalog["kind"])
        result[split] = {
            "n": len(episodes),
            "success": float(episodes["success"].mean()),
            "by_env": {
                ("unseen_env" if k else "seen_env"): float(v)
                for k, v in episodes.groupby("unseen_env")["success"].mean().items()
            },
            "by_kind": episodes.groupby("kind")["success"].mean().round(3).to_dict(),
        }
        print(split, json.dumps(result[split]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    args.out.write_text(json.dumps({
        "command": "python bench/generalization.py " + " ".join(sys.argv[1:]),
        "git_commit": commit,
        "train_minus_heldout_seen_env_pts": 100 * (
            result["train"]["success"] - result["heldout"]["by_env"].get("seen_env", 0.0)
        ),
        **result,
    }, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
