"""RL probe: one process, no orchestration: the suite and the warm start (cached), then
`rounds` rounds of the pipeline's own round (rollwise.loop.run_rounds), held-out success every
`--eval-every` rounds. For tuning the RL loop quickly through params overrides; the pipeline
(`make run`) is the reference.

    .venv/bin/python bench/rl_probe.py train.lr=0.0001 rollout.temperature=0.7 rounds=8 \
        [--oracle N] [--out FILE.json]

--oracle N: the control arm. No rollout: N oracle trajectories of the round's train tasks go
through the same trainer with advantage +1, so held-out after R rounds is what the trainer's
lr and step budget can do with a perfect signal, an upper reference for any advantage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    bench_params,
    parse_overrides,
    run_oracle_rounds,
    suite_at,
    warm_start_folder,
)
from bench.provenance import STARTED_AT  # noqa: E402
from rollwise import loop  # noqa: E402
from rollwise.evaluate.full import evaluate_policy, evaluation_tasks, summarize  # noqa: E402
from rollwise.policy.build import load_policy, save_policy  # noqa: E402
from rollwise.policy.hf import HFBackend  # noqa: E402
from rollwise.rollout.engine import Limits  # noqa: E402


def warm_start(p, cache: Path, given: Path | None = None):
    """(suite, model, tokenizer): the pipeline's warm start of `p` (bench/common.py, cached), or
    the `given` model folder (--warm-start: another warm start of the same suite)."""
    suite, _ = suite_at(cache, p.envs)
    return suite, *load_policy(warm_start_folder(p, suite, cache, given))


def heldout(model, tok, suite, p, split: str = "heldout") -> dict:
    """Greedy success on the split, and per task kind: which skill a round moved."""
    tasks = evaluation_tasks(suite, split, p.evaluate.max_tasks)
    limits = Limits(max_context=p.policy.max_context, greedy=True)
    episodes = evaluate_policy(HFBackend(model, tok), tok, suite, tasks, limits)
    return {**summarize(episodes), "by_kind": by_kind(episodes, suite)}


def by_kind(episodes: pd.DataFrame, suite) -> dict[str, float]:
    """Success rate per task kind (the catalog's `kind` of each episode's task)."""
    kinds = episodes["task_id"].map(suite.catalog.set_index("task_id")["kind"])
    return episodes.groupby(kinds)["success"].mean().round(3).to_dict()


TRAIN_STATS = ("approx_kl", "kl_ref", "clip_frac", "entropy")  # per round, from train_round


def round_line(r: int, done) -> dict:
    """A pipeline round's figures (loop.Round)."""
    stats = done.trained.metrics
    return {"round": r, "sample_success": done.rollout.metrics["success_rate"],
            "zero_variance_groups": done.rollout.metrics["zero_variance_groups"],
            **{k: stats.get(k, 0.0) for k in TRAIN_STATS}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*", help="dotted params overrides key=value")
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise" / "probe")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--train-eval", action="store_true", help="greedy success on train too")
    parser.add_argument("--oracle", type=int, default=0, help="N oracle demos a round, no rollout")
    parser.add_argument("--save", type=Path, default=None, help="save the final policy here")
    parser.add_argument("--warm-start", "--warm", dest="warm", type=Path, default=None,
                        help="start from this model folder")  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (1: two probes side by side)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    p = bench_params(parse_overrides(args.overrides))
    args.cache.mkdir(parents=True, exist_ok=True)
    suite, model, tok = warm_start(p, args.cache, args.warm)

    def evaluate(r: int, model=model) -> None:
        curve.append({"round": r, **heldout(model, tok, suite, p)})
        line = {
            "round": r,
            "heldout_success": curve[-1]["success"],
            "by_kind": curve[-1]["by_kind"],
        }
        if args.train_eval:
            curve[-1]["train_success"] = line["train_success"] = heldout(
                model, tok, suite, p, "train"
            )["success"]
        print(json.dumps(line), flush=True)

    curve: list[dict] = []
    rounds: list[dict] = []
    evaluate(0)

    def finished(r: int, line: dict, model) -> None:
        rounds.append(line)
        print(json.dumps(line), flush=True)
        if r % args.eval_every == 0 or r == p.n_rounds:
            evaluate(r, model)

    if args.oracle:
        t0 = time.perf_counter()

        def oracle_done(r: int, model, stats: dict) -> None:
            line = {"round": r, "oracle": args.oracle, "train_s": time.perf_counter() - t0}
            finished(r, {**line, **{k: stats.get(k, 0.0) for k in TRAIN_STATS}}, model)

        run_oracle_rounds(p, suite, model, tok, p.n_rounds, args.oracle, oracle_done)
    else:
        model, _ = loop.run_rounds(
            p,
            suite,
            model,
            tok,
            p.n_rounds,
            on_round=lambda r, done: finished(r, round_line(r, done), done.trained.model),
        )
    if args.save:
        save_policy(model, tok, args.save)
    if args.out:
        args.out.write_text(json.dumps({
            "command": "python bench/rl_probe.py " + " ".join(sys.argv[1:]),
            "git_commit": STARTED_AT,
            "heldout_gain_pts": 100 * (curve[-1]["success"] - curve[0]["success"]),
            "heldout_curve": curve, "rounds": rounds,
        }, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
