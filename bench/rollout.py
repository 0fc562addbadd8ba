"""Benchmark: how close the rollout engine comes to raw batched generation, and what batching buys
over a naive loop. One torch thread (the machine's cores are shared).

Setup (once): a small synthetic suite, its tokenizer and the default tiny Qwen2 (params `policy`
defaults), SFT'd briefly on oracle trajectories so that episodes are multi-turn (tool calls,
observations, answers). The plan: 64 episodes (BATCH train tasks, one sample each, seeded).

- engine: run_episodes on the plan, batch 64 (all live episodes in one generate call per turn);
  tokens/s = generated (policy) tokens / wall. Its backend is wrapped to record every generate
  call: the prompts and how many decode steps the call ran (its longest completion).
- raw: the limit. For every recorded call, `model.generate` alone on the same left-padded
  prompts, forced to the same number of decode steps (min_new_tokens = max_new_tokens), sampling
  with transformers' own sampler; no per-row seeds, no log-probs, no parsing, no tools, no
  observations. Its tokens/s counts the same generated tokens as the engine's, so
  engine_vs_raw_generate_ratio = raw wall / engine wall for the same decode work (target >= 0.85).
- sequential: the same plan one episode at a time (run_episodes on each spec alone: batch 1).
  Sampling is per episode, so it must produce the engine's episodes token for token (checked).
  speedup_vs_sequential = sequential wall / engine wall.
Engine and raw run back to back `--repeats` times; the ratio is the median.

    .venv/bin/python bench/rollout.py [--repeats 3] [--sft-steps 200]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "rollout.json"
sys.path.insert(0, str(ROOT))

from bench.provenance import STARTED_AT  # noqa: E402
from rollwise.config import EnvsConfig, PolicyConfig, WarmstartConfig  # noqa: E402
from rollwise.envs.generate import generate_suite  # noqa: E402
from rollwise.envs.runtime import load_suite  # noqa: E402
from rollwise.policy.build import build_model  # noqa: E402
from rollwise.policy.hf import HFBackend  # noqa: E402
from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes  # noqa: E402
from rollwise.train.sft import oracle_sequence, sft  # noqa: E402
from rollwise.train.warmstart import suite_tokenizer  # noqa: E402

BATCH = 64
SUITE = EnvsConfig(n_envs=4, tasks_per_env=40, heldout_envs=0, heldout_task_frac=0.0)
LIMITS = Limits(max_turns=6, max_new_tokens=48, max_context=512, temperature=0.7, seed=0,
                batch_size=BATCH)  # fmt: skip


class Recording:
    """A backend that records each generate call: (prompts, decode steps it ran)."""

    def __init__(self, backend):
        self.backend, self.calls = backend, []

    def generate(self, prompts, max_new_tokens, *args, **kwargs):
        outs = self.backend.generate(prompts, max_new_tokens, *args, **kwargs)
        self.calls.append(([list(p) for p in prompts], max(len(o.token_ids) for o in outs)))
        return outs


def build(work: Path, sft_steps: int):
    """(suite, tokenizer, model): the default tiny policy, briefly SFT'd on oracle demos."""
    generate_suite(SUITE, work / "envs")
    suite = load_suite(work / "envs")
    tok = suite_tokenizer(suite)
    model = build_model(tok, PolicyConfig())
    demos = [oracle_sequence(t, suite.envs[t.env_id], tok) for t in suite.split("train")]
    sft(model, demos, WarmstartConfig(steps=sft_steps, batch_size=32, lr=3e-3), tok.pad_token_id)
    return suite, tok, model.eval()


def plan(suite) -> list[EpisodeSpec]:
    tasks = suite.split("train")[:BATCH]
    return [
        EpisodeSpec(f"b/{t.task_id}", t, clone_env(suite.envs[t.env_id]), t.task_id, 0, i)
        for i, t in enumerate(tasks)
    ]


def engine_run(suite, tok, model) -> tuple[float, list[dict], Recording]:
    backend = Recording(HFBackend(model, tok))
    t0 = time.perf_counter()
    episodes, _ = run_episodes(plan(suite), backend, tok, LIMITS)
    return time.perf_counter() - t0, episodes, backend


@torch.no_grad()
def raw_run(tok, model, calls) -> float:
    """model.generate on each recorded call's prompts, for exactly its decode steps."""
    wall = 0.0
    for prompts, steps in calls:
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)  # [B, T]
        attention = torch.zeros_like(ids)  # [B, T]
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            attention[i, width - len(p) :] = 1
        t0 = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=attention, do_sample=True,
                       temperature=LIMITS.temperature, top_k=0, max_new_tokens=steps,
                       min_new_tokens=steps, pad_token_id=tok.pad_token_id)  # fmt: skip
        wall += time.perf_counter() - t0
    return wall


def sequential_run(suite, tok, model) -> tuple[float, list[dict]]:
    backend = HFBackend(model, tok)
    t0 = time.perf_counter()
    episodes = [run_episodes([spec], backend, tok, LIMITS)[0][0] for spec in plan(suite)]
    return time.perf_counter() - t0, episodes


def same_tokens(a: list[dict], b: list[dict]) -> bool:
    return [e["token_ids"] for e in a] == [e["token_ids"] for e in b]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sft-steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rollwise-bench-") as tmp:
        t0 = time.perf_counter()
        suite, tok, model = build(Path(tmp), args.sft_steps)
        setup_s = time.perf_counter() - t0
        engine_run(suite, tok, model)  # warm-up: first-call costs out of the measurements
        rows = []
        for _ in range(args.repeats):
            engine_s, episodes, recording = engine_run(suite, tok, model)
            raw_s = raw_run(tok, model, recording.calls)
            tokens = sum(e["generated_tokens"] for e in episodes)
            rows.append({"engine_s": engine_s, "raw_generate_s": raw_s, "generated_tokens": tokens,
                         "engine_vs_raw_generate_ratio": raw_s / engine_s})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        sequential_s, sequential = sequential_run(suite, tok, model)
    engine_s = statistics.median(r["engine_s"] for r in rows)
    tokens = rows[0]["generated_tokens"]
    result = {
        "command": " ".join(["python bench/rollout.py", *sys.argv[1:]]),
        "git_commit": STARTED_AT,
        "engine_vs_raw_generate_ratio": statistics.median(
            r["engine_vs_raw_generate_ratio"] for r in rows
        ),
        "speedup_vs_sequential": sequential_s / engine_s,
        "targets": {"engine_vs_raw_generate_ratio": 0.85},
        "engine_tokens_per_s": tokens / engine_s,
        "raw_generate_tokens_per_s": tokens / statistics.median(r["raw_generate_s"] for r in rows),
        "sequential_tokens_per_s": tokens / sequential_s,
        "sequential_episodes_equal_batched": same_tokens(episodes, sequential),
        "episodes": len(episodes),
        "generated_tokens": tokens,
        "generate_calls": len(recording.calls),
        "decode_steps": sum(steps for _, steps in recording.calls),
        "turns": dict(sorted(Counter(e["turns"] for e in episodes).items())),
        "terminations": dict(Counter(e["termination"] for e in episodes)),
        "tool_calls": sum(e["tool_calls"] for e in episodes),
        "limits": dataclasses.asdict(LIMITS),
        "model": PolicyConfig().model_dump(),
        "sft_steps": args.sft_steps,
        "setup_s": setup_s,
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": load,  # the cores are shared: other processes were running
        "runs": rows,
        "sequential_s": sequential_s,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("engine_vs_raw_generate_ratio",
                                               "speedup_vs_sequential")}))  # fmt: skip


if __name__ == "__main__":
    main()
