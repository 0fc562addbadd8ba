"""HF (bf16, CUDA) against vLLM on one checkpoint: the same greedy tokens, close log-probs.

Prompts are the suite's opening prompts through the model's own template; both backends
decode greedily; token-exactness is the share of prompts whose token ids agree in full, and
log-prob agreement is HF's recomputed log-prob of vLLM's tokens against vLLM's own. Writes
device_agree.json and device_agree.png to --out. Run by scripts/device_check.sh (needs CUDA)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from rollwise.envs.runtime import load_suite
from rollwise.policy.build import load_policy
from rollwise.policy.chat import prompt_ids
from rollwise.policy.hf import HFBackend
from rollwise.policy.vllm import VLLMBackend, endpoint


def rescore(model, prompt: list[int], ids: list[int]) -> list[float]:
    """Log-probs of `ids` after `prompt` under `model` (one forward pass)."""
    seq = torch.tensor([prompt + ids], device=model.device)  # [1, T]
    logits = model(seq).logits[0, len(prompt) - 1 : -1].float()  # [N, V]
    logp = torch.log_softmax(logits, dim=-1)  # [N, V]
    return logp.gather(-1, torch.tensor(ids, device=model.device)[:, None])[:, 0].tolist()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--suite", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=48)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("device_agree: no CUDA device", file=sys.stderr)
        return 2
    model, tok = load_policy(args.model, dtype=torch.bfloat16)
    model = model.to("cuda")
    suite = load_suite(args.suite)
    tasks = sorted(suite.tasks.values(), key=lambda t: t.task_id)[: args.prompts]
    prompts = [prompt_ids(tok, suite.envs[t.env_id].reset(t, 0), suite.envs[t.env_id].tools())
               for t in tasks]  # fmt: skip
    hf = HFBackend(model, tok).generate(prompts, args.new_tokens, greedy=True)
    with endpoint(args.model) as url:
        vl = VLLMBackend(url, tok.eos_token_id).generate(prompts, args.new_tokens, greedy=True)
    same = [a.token_ids == b.token_ids for a, b in zip(hf, vl, strict=True)]
    pairs = [(h, v) for p, c in zip(prompts, vl, strict=True) if c.token_ids
             for h, v in zip(rescore(model, p, c.token_ids), c.logprobs, strict=True)]  # fmt: skip
    diffs = [abs(h - v) for h, v in pairs]
    result = {
        "model": str(args.model),
        "prompts": len(prompts),
        "new_tokens": args.new_tokens,
        "greedy_identical_share": sum(same) / len(same),
        "logprob_abs_diff_mean": sum(diffs) / max(1, len(diffs)),
        "logprob_abs_diff_max": max(diffs, default=0.0),
        "tokens_compared": len(diffs),
        "gpu": torch.cuda.get_device_name(0),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "device_agree.json").write_text(json.dumps(result, indent=1))
    plot(pairs, args.out / "device_agree.png")
    print(json.dumps(result, indent=1))
    return 0


def plot(pairs: list[tuple[float, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.scatter([v for _, v in pairs], [h for h, _ in pairs], s=4, alpha=0.5)
    low = min([0.0, *(min(p) for p in pairs)])
    ax.plot([low, 0], [low, 0], "k--", lw=0.8)
    ax.set_xlabel("vLLM log-prob (sampled token)")
    ax.set_ylabel("HF bf16 log-prob (same token)")
    ax.set_title("SmolLM2-135M: HF vs vLLM")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
