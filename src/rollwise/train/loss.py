"""Policy-gradient losses. B = sequences in the micro-batch, T = tokens (next-token positions).

A loss is computed per micro-batch but normalized by counts of the whole minibatch (`Norm`), so
gradient accumulation over micro-batches gives the same update as one big batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

KL_LOG_RATIO_MAX, KL_TOKEN_MAX = 20.0, 10.0  # kl_k3's clamps (verl's low_var_kl)


@dataclass(frozen=True)
class Norm:
    """Counts over the whole minibatch (one optimizer step), not the micro-batch."""

    tokens: float  # masked (policy) tokens
    seqs: float  # sequences
    horizon: float  # Dr.GRPO's constant length: the longest target length in the minibatch


def token_mean(per_token: torch.Tensor, mask: torch.Tensor, norm: Norm) -> torch.Tensor:
    """Every policy token weighs the same (DAPO): long episodes count more."""
    return (per_token * mask).sum() / norm.tokens  # []


def seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor, norm: Norm) -> torch.Tensor:
    """Every sequence weighs the same (original GRPO): a token of a short episode counts more."""
    seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [B]
    return seq.sum() / norm.seqs  # []


def seq_mean_token_sum(per_token: torch.Tensor, mask: torch.Tensor, norm: Norm) -> torch.Tensor:
    """Sum over a sequence's tokens, mean over sequences: scale grows with episode length."""
    seq = (per_token * mask).sum(-1)  # [B]
    return seq.sum() / norm.seqs  # []


def seq_mean_token_sum_norm(
    per_token: torch.Tensor, mask: torch.Tensor, norm: Norm
) -> torch.Tensor:
    """Dr.GRPO: token sums divided by one constant length, so no length bias enters the loss."""
    seq = (per_token * mask).sum(-1) / norm.horizon  # [B]
    return seq.sum() / norm.seqs  # []


AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, Norm], torch.Tensor]] = {
    "token-mean": token_mean,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum": seq_mean_token_sum,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each next token and the policy's entropy at each position."""
    logp_all = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [B, T, V]
    logp = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # [B, T]
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B, T]
    return logp, entropy


def tis_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling: min(pi_train / pi_rollout, cap), no gradient. Corrects for
    the rollout engine sampling from a slightly different distribution than the trainer's."""
    with torch.no_grad():
        return torch.exp(old_logp - rollout_logp).clamp(max=cap)  # [B, T]


def ppo_clip_loss(
    logp: torch.Tensor,  # [B, T] current policy
    old_logp: torch.Tensor,  # [B, T] policy before this round's updates
    advantages: torch.Tensor,  # [B, T] per-token advantage
    mask: torch.Tensor,  # [B, T] 1 on the policy's own tokens
    clip_low: float,
    clip_high: float,
    norm: Norm,
    agg: str = "token-mean",
    weights: torch.Tensor | None = None,  # [B, T] per-token weights (TIS), no gradient
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip with separate low/high clip (DAPO's clip-higher), aggregated by `agg`."""
    log_ratio = logp - old_logp  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    unclipped = ratio * advantages  # [B, T]
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * advantages  # [B, T]
    per_token = -torch.minimum(unclipped, clipped)  # [B, T]
    if weights is not None:
        per_token = per_token * weights.detach()  # [B, T]
    loss = AGGREGATIONS[agg](per_token, mask, norm)  # []
    with torch.no_grad():
        was_clipped = ((unclipped - clipped).abs() > 1e-9).float()  # [B, T]
        n = mask.sum().clamp(min=1)  # []
        stats = {
            "clip_frac": float((was_clipped * mask).sum() / n),
            "approx_kl": float(((ratio - 1 - log_ratio) * mask).sum() / n),
        }
    return loss, stats


def kl_k3(
    logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, norm: Norm, agg: str
) -> torch.Tensor:
    """k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1, aggregated like the
    policy loss so the KL coefficient means the same thing in every mode. Clamped as verl's
    low_var_kl is (log-ratio to +-20, each token to <= 10): the samples come from the old policy,
    so a token the policy has since all but dropped gives exp(ref - logp) without bound (one such
    token made a batch's mean 1e5 in bench/rl_probe.py and drowned the policy loss)."""
    delta = (ref_logp - logp).clamp(-KL_LOG_RATIO_MAX, KL_LOG_RATIO_MAX)  # [B, T]
    per_token = (torch.exp(delta) - delta - 1).clamp(max=KL_TOKEN_MAX)  # [B, T] >= 0
    return AGGREGATIONS[agg](per_token, mask, norm)  # []
