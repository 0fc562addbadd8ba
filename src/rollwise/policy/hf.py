"""In-process transformers backend (CPU default, also GPU): batched sampling with a KV cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Completion:
    token_ids: list[int]  # generated tokens, up to and including the stop token if reached
    logprobs: list[float]  # log-prob of each generated token under the sampling distribution
    stopped: bool  # ended on the stop token (else hit the token limit)


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
        seed: int | None = None,
    ) -> list[Completion]:
        if seed is not None:
            torch.manual_seed(seed)
        width = max(map(len, prompts))
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # [B, T]
        attention = torch.zeros_like(input_ids)  # [B, T]
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p)
            attention[i, width - len(p) :] = 1
        sampling = {} if greedy else {"temperature": temperature, "top_k": 0, "top_p": 1.0}
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=max_new_tokens,
            do_sample=not greedy,
            eos_token_id=self.stop_id,
            pad_token_id=self.pad_id,
            output_logits=True,
            return_dict_in_generate=True,
            **sampling,
        )
        new = out.sequences[:, width:]  # [B, N]
        logits = torch.stack(out.logits, dim=1).float()  # [B, N, V]
        scale = 1.0 if greedy else temperature
        logp = torch.log_softmax(logits / scale, dim=-1).gather(-1, new.unsqueeze(-1))[
            ..., 0
        ]  # [B, N]
        return [self._cut(new[i].tolist(), logp[i].tolist()) for i in range(len(prompts))]

    def _cut(self, ids: list[int], logps: list[float]) -> Completion:
        if self.stop_id in ids:
            n = ids.index(self.stop_id) + 1
            return Completion(ids[:n], logps[:n], True)
        return Completion(ids, logps, False)
