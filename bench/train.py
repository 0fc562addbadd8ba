"""Trainer overhead: training tokens/s (train_round: PPO loss, stats, clipping, optimizer step)
over raw forward+backward tokens/s on the same micro-batches, for AdamW and Muon; peak RSS.
The policy is the default tiny Qwen2 of params.yaml; one torch thread.

Then AdamW vs Muon at equal budget: one shared warm start (bench/rl_probe.py's, cached), the
same RL rounds (rollouts, GRPO, PPO steps) with each optimizer at its params.yaml lr, held-out
greedy success with Wilson 95% intervals. A small suite and few rounds, so it fits in minutes.

    .venv/bin/python bench/train.py [--episodes 64] [--length 160] [--repeats 4] [--rounds 4]
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.provenance import STARTED_AT  # noqa: E402
from rollwise.config import PolicyConfig, TrainConfig  # noqa: E402
from rollwise.policy.build import build_model, train_tokenizer  # noqa: E402
from rollwise.train.loss import token_logprobs  # noqa: E402
from rollwise.train.optim import make_optimizer  # noqa: E402
from rollwise.train.trainer import step_plan, tensors, train_round  # noqa: E402

WORDS = "the answer is paris call tool get order status city count cancel amount record".split()


def items(n: int, length: int, vocab: int, seed: int = 0) -> list[dict]:
    """Episodes of varied length: a 24-token prompt, then policy tokens, advantages +-1."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(n):
        m = int(length * (0.6 + 0.8 * k / max(1, n - 1)))
        ids = torch.randint(5, vocab, (m,), generator=g).tolist()
        mask = [0] * 24 + [1] * (m - 24)
        adv = [0.0] * 24 + [1.0 if k % 2 else -1.0] * (m - 24)
        out.append({"ids": ids, "mask": mask, "adv": adv, "logprobs": [-3.0] * m})
    return out


def raw_fwd_bwd(model, batch: list[dict], cfg: TrainConfig, pad: int) -> None:
    """The floor: the same micro-batches through forward and backward, nothing else."""
    for chunk_idx in step_plan(len(batch), cfg):
        chunk = [batch[i] for i in chunk_idx]
        for lo in range(0, len(chunk), cfg.micro_batch):
            ids, attn, mask, *_ = tensors(chunk[lo : lo + cfg.micro_batch], pad)
            logp, _ = token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids)
            (logp * mask).sum().backward()


def timed_pair(raw_fn, train_fn, repeats: int) -> tuple[float, float]:
    """Best process CPU seconds of each, interleaved: on shared cores wall time measures the
    neighbours; one-thread CPU time and alternation keep the two comparable."""
    best = [float("inf"), float("inf")]
    for _ in range(repeats):
        for i, fn in enumerate((raw_fn, train_fn)):
            t0 = time.process_time()
            fn()
            best[i] = min(best[i], time.process_time() - t0)
    return best[0], best[1]


# The held-out comparison's config: params.yaml's policy, lrs and loss, on a smaller suite with a
# shorter warm start and fewer rollouts per round.
HELDOUT_CONFIG = {
    "envs.n_envs": 6, "envs.tasks_per_env": 24, "envs.heldout_envs": 1,
    "envs.heldout_task_frac": 0.3,
    "warmstart.steps": 400, "warmstart.batch_size": 16,
    "schedule.tasks_per_round": 16, "rollout.samples_per_task": 4,
    "train.epochs": 1, "evaluate.max_tasks": 100,
}  # fmt: skip


def relative_change(start, model) -> float:
    """||theta - theta_0|| / ||theta_0|| over all weights: how far the RL rounds moved them."""
    before = torch.cat([p.detach().flatten() for p in start.parameters()])  # [P]
    after = torch.cat([p.detach().flatten() for p in model.parameters()])  # [P]
    return float((after - before).norm() / before.norm())


def heldout_adamw_vs_muon(rounds: int, cache: Path) -> dict:
    """Both optimizers from one warm start, `rounds` rounds of the pipeline each (an arm is
    `train.optimizer`, run through loop.run_rounds), held-out greedy success."""
    from bench.common import arm_params, bench_params, suite_at, warm_start_folder
    from bench.rl_probe import heldout
    from rollwise import loop
    from rollwise.policy.build import load_policy

    p = bench_params({**HELDOUT_CONFIG, "rounds": rounds})
    cache.mkdir(parents=True, exist_ok=True)
    suite, _ = suite_at(cache, p.envs)
    start, tok = load_policy(warm_start_folder(p, suite, cache))
    before = heldout(start, tok, suite, p)
    out: dict = {"config": HELDOUT_CONFIG, "rl_rounds": rounds, "heldout_tasks": before["n"],
                 "warm_start_success": before["success"]}  # fmt: skip
    for name in ("adamw", "muon"):
        q = arm_params(p, {"train.optimizer": name})
        log: list[dict] = []

        def on_round(r: int, done: loop.Round, log=log) -> None:
            log.append({"sample_success": done.rollout.metrics["success_rate"]})

        t0 = time.perf_counter()
        model, _ = loop.run_rounds(q, suite, copy.deepcopy(start), tok, rounds, on_round=on_round)
        after = heldout(model, tok, suite, q)
        out[name] = {
            "lr": q.train.muon_lr if name == "muon" else q.train.lr,
            "heldout_success": after["success"],
            "heldout_success_ci95": [after["success_lo"], after["success_hi"]],
            "gain_pts": 100 * (after["success"] - before["success"]),
            "sample_success_by_round": [row["sample_success"] for row in log],
            "weight_change_rel": relative_change(start, model),
            "rounds_s": time.perf_counter() - t0,
        }
        print(name, json.dumps(out[name]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--length", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4, help="RL rounds per optimizer; 0: skip")
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise" / "probe")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "train.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tok = train_tokenizer([" ".join(WORDS)])
    model = build_model(tok, PolicyConfig())
    batch = items(args.episodes, args.length, len(tok))
    n_tokens = sum(len(it["ids"]) for it in batch)
    result: dict = {"episodes": args.episodes, "tokens_per_pass": n_tokens, "torch_threads": 1,
                    "timing": "best process CPU time of interleaved repeats"}  # fmt: skip
    for name in ("adamw", "muon"):
        cfg = TrainConfig(optimizer=name, epochs=2, minibatches=2, micro_batch=16)
        opt = make_optimizer(model, cfg)
        steps = len(step_plan(len(batch), cfg))
        tokens = n_tokens * cfg.epochs
        raw_fwd_bwd(model, batch, cfg, tok.pad_token_id)  # warm-up
        raw, train = timed_pair(
            lambda cfg=cfg: raw_fwd_bwd(model, batch, cfg, tok.pad_token_id),
            lambda cfg=cfg, opt=opt: train_round(model, batch, cfg, opt, tok.pad_token_id),
            args.repeats,
        )
        model.zero_grad()
        result[name] = {
            "optimizer_steps": steps,
            "raw_fwd_bwd_tokens_per_s": tokens / raw,
            "train_tokens_per_s": tokens / train,
            "train_vs_raw_fwd_bwd_ratio": raw / train,
        }
        print(name, json.dumps(result[name]), flush=True)
    result["train_vs_raw_fwd_bwd_ratio"] = result["adamw"]["train_vs_raw_fwd_bwd_ratio"]
    # peak RSS of the throughput part (the RL rounds below build suites and evaluate too)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.rounds:
        result["heldout_adamw_vs_muon"] = heldout_adamw_vs_muon(args.rounds, args.cache)
    result["command"] = "python bench/train.py " + " ".join(sys.argv[1:])
    result["git_commit"] = STARTED_AT
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("train_vs_raw_fwd_bwd_ratio", "peak_rss_mb")}))


if __name__ == "__main__":
    main()
