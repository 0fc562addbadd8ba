"""Policy-gradient losses. B = sequences in the micro-batch, T = tokens (next-token positions)."""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each next token and the policy's entropy at each position."""
    logp_all = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [B, T, V]
    logp = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # [B, T]
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B, T]
    return logp, entropy


def ppo_clip_loss(
    logp: torch.Tensor,  # [B, T] current policy
    old_logp: torch.Tensor,  # [B, T] policy that sampled (recomputed before the update)
    advantages: torch.Tensor,  # [B, T] per-token advantage
    mask: torch.Tensor,  # [B, T] 1 on the policy's own tokens
    clip_low: float,
    clip_high: float,
    n_tokens: float,  # masked tokens in the whole minibatch: token-mean across micro-batches
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip with separate low/high clip (DAPO's clip-higher), token-mean aggregation."""
    log_ratio = logp - old_logp  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    unclipped = ratio * advantages  # [B, T]
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * advantages  # [B, T]
    per_token = -torch.minimum(unclipped, clipped)  # [B, T]
    loss = (per_token * mask).sum() / n_tokens  # []
    with torch.no_grad():
        was_clipped = ((unclipped - clipped).abs() > 1e-9).float()  # [B, T]
        stats = {
            "clip_frac": float((was_clipped * mask).sum() / mask.sum().clamp(min=1)),
            "approx_kl": float(((ratio - 1 - log_ratio) * mask).sum() / mask.sum().clamp(min=1)),
        }
    return loss, stats


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, n_tokens: float):
    """k3 estimator of KL(pi || ref), token-mean: exp(ref - logp) - (ref - logp) - 1."""
    delta = ref_logp - logp  # [B, T]
    return ((torch.exp(delta) - delta - 1) * mask).sum() / n_tokens  # []
