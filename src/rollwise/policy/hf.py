"""In-process transformers backend (CPU default, also GPU): batched sampling with a KV cache.

Sampling is per row: each prompt brings its own seed, and its tokens are drawn by inverse-CDF
sampling from uniforms of its own generator. A row's sample then depends only on its own prompt
and seed, never on which other prompts share its batch, so a plan sharded over workers (or
batched differently) samples the same episodes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList


@dataclass
class Completion:
    token_ids: list[int]  # generated tokens, up to and including the stop token if reached
    logprobs: list[float]  # log-prob of each generated token under the sampling distribution
    stopped: bool  # ended on the stop token (else hit the token limit)


class RowSampler(LogitsProcessor):
    """Draws each row's next token from softmax(logits / T) with that row's next uniform, and
    returns a one-hot score so greedy search keeps it (model.generate keeps the KV cache)."""

    def __init__(self, uniforms: torch.Tensor, temperature: float, prompt_width: int):
        self.uniforms, self.temperature, self.width = uniforms, temperature, prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        k = input_ids.shape[1] - self.width  # tokens generated so far
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)  # [B, V]
        cdf = probs.cumsum(dim=-1)  # [B, V]
        u = self.uniforms[:, k : k + 1] * cdf[:, -1:]  # [B, 1]
        pick = torch.searchsorted(cdf, u, right=True).clamp_(max=scores.shape[-1] - 1)  # [B, 1]
        return torch.full_like(scores, float("-inf")).scatter_(-1, pick, 0.0)  # [B, V]


def row_uniforms(seed: int | Sequence[int] | None, rows: int, steps: int) -> torch.Tensor:
    """[rows, steps] uniforms in [0, 1). A sequence gives one seed per row (batch-independent);
    an int seeds one generator for the whole batch; None uses torch's global RNG."""
    if seed is None:
        return torch.rand(rows, steps)  # [B, N]
    if isinstance(seed, int):
        return torch.rand(rows, steps, generator=torch.Generator().manual_seed(seed))  # [B, N]
    if len(seed) != rows:
        raise ValueError(f"got {len(seed)} seeds for {rows} prompts")
    gens = [torch.Generator().manual_seed(int(s)) for s in seed]
    return torch.stack([torch.rand(steps, generator=g) for g in gens])  # [B, N]


class HFBackend:
    """`generate(prompts, ...)` over token-id prompts; left-padded, one batched call."""

    def __init__(self, model, tokenizer, stop_id: int | None = None):
        self.model, self.tokenizer = model.eval(), tokenizer
        self.stop_id = tokenizer.eos_token_id if stop_id is None else stop_id
        self.pad_id = tokenizer.pad_token_id

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int | Sequence[int] | None = None,
    ) -> list[Completion]:
        """Sample (or greedily decode) up to `max_new_tokens` per prompt. Pass one seed per
        prompt for samples that do not depend on the batch (see the module docstring)."""
        width = max(map(len, prompts))
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # [B, T]
        attention = torch.zeros_like(input_ids)  # [B, T]
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p)
            attention[i, width - len(p) :] = 1
        processors = LogitsProcessorList()
        if not greedy:
            uniforms = row_uniforms(seed, len(prompts), max_new_tokens)  # [B, N]
            processors.append(RowSampler(uniforms.to(self.model.device), temperature, width))
        out = self.model.generate(
            input_ids=input_ids.to(self.model.device),
            attention_mask=attention.to(self.model.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,  # RowSampler has already chosen: greedy search keeps its pick
            logits_processor=processors,
            eos_token_id=self.stop_id,
            pad_token_id=self.pad_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        new = out.sequences[:, width:]  # [B, N]
        logits = torch.stack(out.logits, dim=1).float()  # [B, N, V] raw, before RowSampler
        scale = 1.0 if greedy else temperature
        logp = torch.log_softmax(logits / scale, dim=-1)  # [B, N, V]
        picked = logp.gather(-1, new.unsqueeze(-1))[..., 0].cpu()  # [B, N]
        new = new.cpu()  # [B, N]
        return [self._cut(new[i].tolist(), picked[i].tolist()) for i in range(len(prompts))]

    def _cut(self, ids: list[int], logps: list[float]) -> Completion:
        if self.stop_id in ids:
            n = ids.index(self.stop_id) + 1
            return Completion(ids[:n], logps[:n], True)
        return Completion(ids, logps, False)
