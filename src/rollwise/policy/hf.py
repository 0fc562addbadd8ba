"""In-process transformers backend (CPU default, also GPU): batched sampling with a KV cache.

Sampling is per row: each prompt brings its own seed, and its tokens are drawn by inverse-CDF
sampling from uniforms of its own generator. A row's sample then depends only on its own prompt
and seed, never on which other prompts share its batch, so a plan sharded over workers (or
batched differently) samples the same episodes.

The distribution sampled from is softmax(logits / T) cut to its top-p nucleus and renormalized
(`sampling_logprobs`), and every returned log-prob is the sampled token's log-prob under exactly
that distribution (vLLM's `--logprobs-mode processed_logprobs` means the same). With top_p = 1
(the default) this is the tempered softmax the trainer recomputes; with top_p < 1 the trainer must
score through `sampling_logprobs` too, or PPO's ratio starts below 1 on every token."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList


@dataclass
class Completion:
    token_ids: list[int]  # generated tokens, up to and including the stop token if reached
    logprobs: list[float]  # log-prob of each generated token under the sampling distribution
    stopped: bool  # ended on the stop token (else hit the token limit)


def nucleus(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """[..., V] mask of the top-p nucleus: token j is kept when the tokens strictly more likely
    than j hold less than top_p of the mass (so the top token always; ties kept together)."""
    probs = logp.exp()  # [..., V]
    ranked = probs.sort(dim=-1, descending=True).values  # [..., V]
    before = ranked.cumsum(dim=-1) - ranked  # [..., V] mass ranked above each slot
    kept = (before < top_p).sum(dim=-1, keepdim=True)  # [..., 1] at least 1
    return probs >= ranked.gather(-1, kept - 1)  # [..., V]


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """[..., V] log-probs of the distribution a row samples from: the tempered softmax, cut to
    its top-p nucleus and renormalized (tokens outside it get -inf)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [..., V]
    if top_p >= 1.0:
        return logp
    cut = logp.masked_fill(~nucleus(logp, top_p), float("-inf"))  # [..., V]
    return torch.log_softmax(cut, dim=-1)  # [..., V]


class RowSampler(LogitsProcessor):
    """Picks each row's next token (inverse CDF with that row's next uniform; argmax when
    `uniforms` is None) and records its log-prob under the distribution it was picked from.
    Returns a one-hot score so greedy search keeps the pick (model.generate keeps the KV cache)."""

    def __init__(
        self,
        uniforms: torch.Tensor | None,
        temperature: float,
        prompt_width: int,
        top_p: float = 1.0,
    ):
        self.uniforms, self.temperature, self.width, self.top_p = (
            uniforms,
            temperature,
            prompt_width,
            top_p,
        )
        self.logps: list[torch.Tensor] = []  # one [B] tensor per generated position

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.uniforms is None:  # greedy: the untempered distribution, its mode
            logp = torch.log_softmax(scores.float(), dim=-1)  # [B, V]
            pick = logp.argmax(dim=-1, keepdim=True)  # [B, 1]
        else:
            k = input_ids.shape[1] - self.width  # tokens generated so far
            logp = sampling_logprobs(scores, self.temperature, self.top_p)  # [B, V]
            cdf = logp.exp().cumsum(dim=-1)  # [B, V]
            u = self.uniforms[:, k : k + 1] * cdf[:, -1:]  # [B, 1]
            pick = torch.searchsorted(cdf, u, right=True).clamp_(max=scores.shape[-1] - 1)  # [B, 1]
        self.logps.append(logp.gather(-1, pick)[:, 0])  # [B]
        return torch.full_like(scores, float("-inf")).scatter_(-1, pick, 0.0)  # [B, V]


def shared_prefixes(prompts: list[list[int]]) -> list[int]:
    """How many leading tokens of each prompt to prefill once for its group (0: none). GRPO's
    samples of a task share their prompt, and tasks of one environment its tool listing; the
    groups are contiguous runs of the sorted prompts, chosen to save the most prefill tokens,
    (size - 1) x the run's common prefix, by dynamic programming over the runs. A cut stops one
    token short of the prompt: the last token's logits start the generation."""
    rows = len(prompts)
    order = sorted(range(rows), key=lambda i: prompts[i])
    common = []  # common[j]: shared leading tokens of order[j] and order[j + 1]
    for a, b in itertools.pairwise(order):
        x, y = prompts[a], prompts[b]
        n, limit = 0, min(len(x), len(y)) - 1
        while n < limit and x[n] == y[n]:
            n += 1
        common.append(n)
    best, start, cut = [0] * (rows + 1), list(range(rows + 1)), [0] * (rows + 1)
    for k in range(1, rows + 1):  # best[k]: the most saved by the first k sorted prompts
        best[k], start[k], cut[k] = best[k - 1], k - 1, 0  # order[k - 1] alone
        shared = None
        for j in range(k - 2, -1, -1):  # the run order[j:k]
            shared = common[j] if shared is None else min(shared, common[j])
            if shared == 0:
                break
            if best[j] + (k - j - 1) * shared > best[k]:
                best[k], start[k], cut[k] = best[j] + (k - j - 1) * shared, j, shared
    cuts, k = [0] * rows, rows
    while k > 0:
        for j in range(start[k], k):
            cuts[order[j]] = cut[k]
        k = start[k]
    return cuts


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


Kv = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [H, n, D] of n tokens


class HFBackend:
    """`generate(prompts, ...)` over token-id prompts: one batched call, each shared prefix (a
    GRPO group's prompt, an environment's tool listing) prefilled once (`shared_prefixes`), and
    inside `keeping()` an episode's next turn prefills only its new tokens."""

    def __init__(self, model, tokenizer, stop_id: int | None = None, share_prefixes: bool = True):
        self.model, self.tokenizer = model.eval(), tokenizer
        self.stop_id = tokenizer.eos_token_id if stop_id is None else stop_id
        self.pad_id = tokenizer.pad_token_id
        self.share_prefixes = share_prefixes  # False: every prompt prefilled whole (the check)
        self.kept: dict[tuple[int, ...], Kv] | None = None  # inside keeping(): tokens -> KV

    @contextmanager
    def keeping(self):
        """Within it, each row's keys and values (its prompt and what it generated) are kept,
        and a later prompt that extends kept tokens prefills only what is new: an episode's next
        turn reads its observation, not its whole history again. The weights must not change
        inside (the engine's run_episodes: one policy). Ended episodes' entries stay until exit
        (at most one per episode); on exit all are dropped."""
        self.kept = {}
        try:
            yield self
        finally:
            self.kept = None

    def _cuts(self, prompts: list[list[int]]) -> tuple[list[int], list[Kv | None]]:
        """(cut, kept KV or None) per prompt: the longest kept run of tokens it extends, else
        its group's shared prefix (a prompt sharing none is a group of its own, so the rest
        region stays as wide as the new tokens). A cut leaves at least one token to run."""
        cuts, kvs = [0] * len(prompts), [None] * len(prompts)
        if not self.share_prefixes:
            return cuts, kvs
        lengths = sorted({len(k) for k in self.kept or {}}, reverse=True)
        for i, p in enumerate(prompts):
            for n in lengths:
                if n < len(p) and (kv := self.kept.get(tuple(p[:n]))) is not None:
                    cuts[i], kvs[i] = n, kv
                    break
        fresh = [i for i, kv in enumerate(kvs) if kv is None]
        shared = shared_prefixes([prompts[i] for i in fresh]) if fresh else []
        for i, c in zip(fresh, shared, strict=True):
            cuts[i] = c or len(prompts[i]) - 1
        return cuts, kvs

    def _prefill(self, prefixes: list[list[int]]) -> Kv:
        """Keys and values ([U, H, W, D] a layer) of left-padded prefixes, pads zeroed (never
        attended; an all-pad row's NaN cannot leak)."""
        width = max(map(len, prefixes))
        ids = torch.full((len(prefixes), width), self.pad_id, dtype=torch.long)  # [U, W]
        mask = torch.zeros_like(ids)  # [U, W]
        for i, p in enumerate(prefixes):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [U, W]
        device = self.model.device
        out = self.model(input_ids=ids.to(device), attention_mask=mask.to(device),
                         position_ids=positions.to(device), use_cache=True)  # fmt: skip
        keep = mask.to(device)[:, None, :, None]  # [U, 1, W, 1]
        return [(layer.keys * keep, layer.values * keep) for layer in out.cache.layers]

    def _layout(self, prompts: list[list[int]], cuts: list[int], kvs: list[Kv | None]):
        """(ids, attention mask, cache) for generate. Each row is [pads][its prefix][pads][the
        rest]: the prefix region's keys and values come from `kvs` (kept from an earlier turn)
        or are computed once per group and copied to its rows; pads are masked and positions
        count real tokens only (generate derives them from the mask), so every row sees exactly
        its own prompt. No prefixes and nothing to keep: left-padded prompts, no cache."""
        rests = [p[c:] for p, c in zip(prompts, cuts, strict=True)]
        width_p, width_r = max(cuts), max(map(len, rests))
        rows = len(prompts)
        ids = torch.full((rows, width_p + width_r), self.pad_id, dtype=torch.long)  # [B, P+R]
        attention = torch.zeros_like(ids)  # [B, P+R]
        for i, (p, c, rest) in enumerate(zip(prompts, cuts, rests, strict=True)):
            ids[i, width_p - c : width_p] = torch.tensor(p[:c], dtype=torch.long)
            ids[i, width_p + width_r - len(rest) :] = torch.tensor(rest, dtype=torch.long)
            attention[i, width_p - c : width_p] = 1
            attention[i, width_p + width_r - len(rest) :] = 1
        if width_p == 0:
            return ids, attention, None if self.kept is None else DynamicCache()
        groups: dict[tuple[int, ...], int] = {}  # a prefix to compute -> its row of _prefill
        for p, c, kv in zip(prompts, cuts, kvs, strict=True):
            if kv is None and c:
                groups.setdefault(tuple(p[:c]), len(groups))
        computed = self._prefill([list(g) for g in groups]) if groups else []
        sources = []  # per row: (kept KV, None) or (None, its group's row), or None (no prefix)
        for p, c, kv in zip(prompts, cuts, kvs, strict=True):
            sources.append(None if not c else (kv, None if kv else groups[tuple(p[:c])]))
        template = computed or next(kv for kv in kvs if kv)  # [U, H, W, D] or [H, n, D]
        cache = DynamicCache()
        for layer, (like, _) in enumerate(template):
            heads, dim = like.shape[-3], like.shape[-1]
            keys = like.new_zeros(rows, heads, width_p, dim)  # [B, H, P, D]
            values = like.new_zeros(rows, heads, width_p, dim)  # [B, H, P, D]
            for i, (c, src) in enumerate(zip(cuts, sources, strict=True)):
                if src is None:
                    continue
                kv, g = src
                k, v = kv[layer] if kv else (t[g, :, -c:] for t in computed[layer])  # [H, c, D]
                keys[i, :, width_p - c :] = k
                values[i, :, width_p - c :] = v
            cache.update(keys, values, layer)
        return ids, attention, cache

    def _keep(self, prompts, cuts, kvs, attention, cache, width: int, outs) -> None:
        """Each row's keys and values for its next turn: its prompt and its generated tokens but
        the last (never fed back). Entries just extended are dropped."""
        for p, c, kv in zip(prompts, cuts, kvs, strict=True):
            if kv is not None:
                self.kept.pop(tuple(p[:c]), None)
        for i, (p, out) in enumerate(zip(prompts, outs, strict=True)):
            fed = len(out.token_ids) - 1
            cols = torch.cat([attention[i].nonzero()[:, 0], torch.arange(width, width + fed)])
            cols = cols.to(self.model.device)  # [n]
            self.kept[tuple(p + out.token_ids[:fed])] = [
                (layer.keys[i].index_select(1, cols), layer.values[i].index_select(1, cols))
                for layer in cache.layers
            ]  # [H, n, D] each

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int | Sequence[int] | None = None,
        top_p: float = 1.0,
    ) -> list[Completion]:
        """Sample (or greedily decode) up to `max_new_tokens` per prompt. Pass one seed per
        prompt for samples that do not depend on the batch (see the module docstring)."""
        cuts, kvs = self._cuts(prompts)
        input_ids, attention, cache = self._layout(prompts, cuts, kvs)  # [B, T], [B, T]
        width = input_ids.shape[1]
        uniforms = None if greedy else row_uniforms(seed, len(prompts), max_new_tokens)  # [B, N]
        device = self.model.device
        sampler = RowSampler(
            None if uniforms is None else uniforms.to(device), temperature, width, top_p
        )
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            **({} if cache is None else {"cache": cache}),  # the prefixes, prefilled
            max_new_tokens=max_new_tokens,
            do_sample=False,  # RowSampler has already chosen: greedy search keeps its pick
            repetition_penalty=1.0,  # no checkpoint default reshapes the distribution first
            logits_processor=LogitsProcessorList([sampler]),
            eos_token_id=self.stop_id,
            pad_token_id=self.pad_id,
        )
        new = out[:, width:].cpu()  # [B, N]
        picked = torch.stack(sampler.logps, dim=1).cpu()  # [B, N]
        outs = [self._cut(new[i].tolist(), picked[i].tolist()) for i in range(len(prompts))]
        if self.kept is not None:
            self._keep(prompts, cuts, kvs, attention, cache, width, outs)
        return outs

    @torch.no_grad()
    def score(
        self, sequences: list[list[int]], temperature: float = 1.0, batch_size: int = 8
    ) -> list[list[float]]:
        """Log-prob of each token of each sequence given the tokens before it under
        softmax(logits / T) (0.0 for the first token): a teacher scoring a student's sampled
        tokens, aligned like the rollout's log-probs."""
        out = []
        for lo in range(0, len(sequences), batch_size):
            part = sequences[lo : lo + batch_size]
            width = max(map(len, part))
            ids = torch.full((len(part), width), self.pad_id, dtype=torch.long)  # [B, T]
            attention = torch.zeros_like(ids)  # [B, T]
            for i, seq in enumerate(part):
                ids[i, : len(seq)] = torch.tensor(seq)
                attention[i, : len(seq)] = 1
            ids, attention = ids.to(self.model.device), attention.to(self.model.device)
            logits = self.model(input_ids=ids, attention_mask=attention).logits[:, :-1]  # [B,T-1,V]
            logits = logits.float() / temperature  # [B, T-1, V]
            picked = logits.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # [B, T-1]
            logp = (picked - logits.logsumexp(dim=-1)).cpu()  # [B, T-1]
            out += [[0.0] + logp[i, : len(seq) - 1].tolist() for i, seq in enumerate(part)]
        return out

    def _cut(self, ids: list[int], logps: list[float]) -> Completion:
        if self.stop_id in ids:
            n = ids.index(self.stop_id) + 1
            return Completion(ids[:n], logps[:n], True)
        return Completion(ids, logps, False)
