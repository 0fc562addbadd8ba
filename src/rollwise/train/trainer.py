"""One RL round: PPO-clip epochs over the curated episodes with their per-token advantages."""

from __future__ import annotations

import copy
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from rollwise.train.loss import Norm, kl_k3, ppo_clip_loss, tis_weights
from rollwise.train.optim import (  # noqa: F401  (callers import make_optimizer here)
    Optimizers,
    apply_lrs,
    make_optimizer,
)
from rollwise.train.prepare import autocast
from rollwise.train.sft import pad_batch

STATE_FILE = "trainer_state.pt"
log = logging.getLogger(__name__)


def token_advantages(episodes: pd.DataFrame, advantages: pd.DataFrame) -> list[list[float]]:
    """Spread each (episode, turn) advantage over that turn's token span; zero elsewhere. A row's
    optional `token_advantage` (one value per token of its span: credit/tokens.py) is added on
    top, so a token-level term (OPD, fact checks) reaches the loss."""
    if "token_advantage" not in advantages:
        advantages = advantages.assign(token_advantage=None)
    by_episode = {ep: g for ep, g in advantages.groupby("episode_id")}
    columns = ["span_start", "span_end", "advantage", "token_advantage"]
    out = []
    for ep, ids in zip(episodes["episode_id"], episodes["token_ids"], strict=True):
        adv = np.zeros(len(ids), dtype=np.float32)
        turns = by_episode.get(ep, advantages.iloc[:0])  # no turns taken: no advantage rows
        for s, e, a, extra in turns[columns].itertuples(index=False):
            adv[int(s) : int(e)] = a
            if extra is not None:
                adv[int(s) : int(e)] += np.asarray(extra, dtype=np.float32)
        out.append(adv.tolist())
    return out


def training_batch(episodes: pd.DataFrame, advantages: pd.DataFrame) -> list[dict]:
    """Episodes whose advantages are not all zero: ids, policy mask, advantages, and the
    rollout's log-probs (PPO's old policy: the engine samples from the checkpoint we train)."""
    items = []
    for row, adv in zip(episodes.itertuples(), token_advantages(episodes, advantages), strict=True):
        if any(a != 0.0 for a in adv):
            items.append(
                {"ids": list(row.token_ids), "mask": list(row.loss_mask), "adv": adv,
                 "logprobs": list(row.logprobs)}
            )  # fmt: skip
    return items


def tensors(items: list[dict], pad_id: int):
    """Right-padded [B, T] ids and attention; [B, T-1] mask, advantages, old log-probs (the
    trainer's own when recomputed for TIS, else the rollout's) and rollout log-probs, all aligned
    with the next-token targets ids[:, 1:]."""
    ids, attn, mask = pad_batch([(it["ids"], it["mask"]) for it in items], pad_id)  # [B, T] each
    adv = torch.zeros_like(mask)  # [B, T]
    old = torch.zeros_like(mask)  # [B, T]
    rollout = torch.zeros_like(mask)  # [B, T]
    for i, it in enumerate(items):
        adv[i, : len(it["adv"])] = torch.tensor(it["adv"])
        rollout[i, : len(it["logprobs"])] = torch.tensor(it["logprobs"])
        own = it.get("old", it["logprobs"])
        old[i, : len(own)] = torch.tensor(own)
    return ids, attn, mask[:, 1:], adv[:, 1:], old[:, 1:], rollout[:, 1:]


def step_plan(n_items: int, cfg) -> list[list[int]]:
    """Item indices of every optimizer step of the round: cfg.epochs shuffled passes, each split
    into cfg.minibatches chunks. Deterministic in cfg.seed, so a resumed round replays it."""
    rng = random.Random(cfg.seed)
    plan = []
    for _ in range(cfg.epochs):
        order = list(range(n_items))
        rng.shuffle(order)
        size = -(-len(order) // cfg.minibatches)
        plan += [order[lo : lo + size] for lo in range(0, len(order), size)]
    return plan


# Architectures whose logits are exactly the output embedding of the decoder's last hidden
# state (no soft-capping or scale in between): their head may run on the policy's tokens only.
PLAIN_HEAD = {"qwen2", "qwen3", "llama", "mistral"}


def masked_logprobs(model, ids, attn, mask, cfg, temperature: float, prefix: int = 0):
    """Log-prob of each next token and the policy's entropy there ([B, T-1] each, float32; bf16
    autocast on CUDA when cfg.bf16), at the temperature the rollout sampled with. Only the
    positions in `mask` (the policy's tokens) are computed and are meaningful; elsewhere 0. The
    head and softmax run on those positions alone (about a quarter of an episode's tokens) when
    the architecture's head is plain, else on every position. `prefix` > 0: every row starts
    with the same `prefix` tokens (one task's prompt, micro_batches), run once."""
    where = mask.bool()  # [B, T-1]
    with autocast(cfg, ids.device):
        if getattr(model.config, "model_type", None) not in PLAIN_HEAD:
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1][where]  # [N, V]
        else:
            if prefix and len(ids) > 1 and not getattr(model, "is_activation_checkpointing", False):
                hidden = shared_prefix_hidden(model, ids, attn, prefix)  # [B, T, H]
            else:
                hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state
            logits = model.get_output_embeddings()(hidden[:, :-1][where])  # [N, V]
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # [N, V]
    picked = logp_all.gather(-1, ids[:, 1:][where].unsqueeze(-1)).squeeze(-1)  # [N]
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # [N]
    logp = torch.zeros(where.shape, device=ids.device).masked_scatter(where, picked)  # [B, T-1]
    ent = torch.zeros(where.shape, device=ids.device).masked_scatter(where, entropy)  # [B, T-1]
    return logp, ent


def shared_prefix_hidden(model, ids, attn, prefix: int):
    """The decoder's last hidden states ([B, T, H]) of right-padded rows that share their first
    `prefix` tokens: the prefix runs once and its keys and values are repeated for every row, so
    a GRPO group's prompt (most of an episode's tokens) costs one row's compute, forward and
    backward; the gradient reaches it through every row's use. Same numbers as one full pass."""
    from transformers.cache_utils import DynamicCache

    decoder = model.get_decoder()
    cache = DynamicCache(config=model.config)
    head = decoder(input_ids=ids[:1, :prefix], cache=cache, use_cache=True)
    cache.batch_repeat_interleave(len(ids))
    positions = torch.arange(prefix, ids.shape[1], device=ids.device).expand(len(ids), -1)
    tail = decoder(input_ids=ids[:, prefix:], attention_mask=attn, cache=cache,
                   position_ids=positions, use_cache=True)  # fmt: skip
    shared = head.last_hidden_state.expand(len(ids), -1, -1)  # [B, P, H]
    return torch.cat([shared, tail.last_hidden_state], dim=1)  # [B, T, H]


def micro_batches(items: list[dict], size: int) -> list[tuple[list[dict], int]]:
    """(items, shared prefix length) of each micro-batch: items grouped by prompt (the tokens
    before their first policy token; one task's samples share it), each group cut into pieces of
    at most `size`, so masked_logprobs runs a piece's prompt once. A piece of one item: 0.
    Grouping reorders the micro-batches only: the step's loss is normalized by the whole chunk."""
    groups: dict[tuple, list[dict]] = {}
    for it in items:  # an item with no policy token (none reach training) shares nothing
        first = it["mask"].index(1) if 1 in it["mask"] else None
        key = ("own", id(it)) if first is None else tuple(it["ids"][:first])
        groups.setdefault(key, []).append(it)
    out = []
    for prompt, group in groups.items():
        shared = 0 if prompt[:1] == ("own",) else len(prompt)
        for lo in range(0, len(group), size):
            piece = group[lo : lo + size]
            out.append((piece, shared if len(piece) > 1 else 0))
    return out


def on_device(batch: tuple, model) -> tuple:
    """tensors()'s CPU tensors moved to the model's device."""
    device = next(model.parameters()).device
    return tuple(t.to(device) for t in batch)


@torch.no_grad()
def policy_logprobs(model, items: list[dict], cfg, pad_id: int, temperature: float) -> list:
    """The model's log-prob of each policy token (0.0 elsewhere), aligned like the rollout's."""
    found: dict[int, list[float]] = {}
    for part, prefix in micro_batches(items, cfg.micro_batch):
        ids, attn, mask, *_ = on_device(tensors(part, pad_id), model)  # [B, T] / [B, T-1]
        logp, _ = masked_logprobs(model, ids, attn, mask, cfg, temperature, prefix)  # [B, T-1]
        for i, it in enumerate(part):
            found[id(it)] = [0.0] + logp[i, : len(it["ids"]) - 1].tolist()
    return [found[id(it)] for it in items]


def train_round(
    model,
    items: list[dict],
    cfg,
    optimizer: Optimizers,
    pad_id: int,
    ref_model=None,
    temperature: float = 1.0,
    start: int = 0,
    on_step: Callable[[int, list[dict]], None] | None = None,
    steps_before: int | None = None,
) -> dict:
    """The optimizer steps of step_plan from `start` on (a round resumed after a crash), calling
    on_step(steps done, items) after each so the caller can checkpoint; `steps_before` (optimizer
    steps of earlier rounds) places them on the lr warmup (optim.apply_lrs; None: no warmup).
    Log-probs use the rollout's sampling temperature, so the rollout's log-probs are PPO's old
    policy exactly (as verl does). With cfg.tis_cap set, the old policy is recomputed by the
    trainer before the first step (items gain "old"; a resumed round must pass them back) and
    each token's loss is weighted by min(pi_old / pi_rollout, tis_cap)."""
    if cfg.kl_coef > 0 and ref_model is None:
        raise ValueError("train.kl_coef > 0 needs the reference policy (ref_model) it anchors to")
    if not items:
        return {"skipped": 1.0, "episodes": 0.0}
    model.train()
    if cfg.tis_cap is not None and not all("old" in it for it in items):
        if start > 0:
            raise ValueError("resuming with train.tis_cap needs the pre-round old log-probs")
        olds = policy_logprobs(model, items, cfg, pad_id, temperature)
        items = [{**it, "old": old} for it, old in zip(items, olds, strict=True)]
    if cfg.max_kl is not None and start > 0:
        raise ValueError("train.max_kl: a round resumed mid-way has lost its start weights")
    before = trainable_copy(model) if cfg.max_kl is not None else None
    history, skipped, in_a_row = [], 0, 0
    plan = step_plan(len(items), cfg)
    for k in range(start, len(plan)):
        chunk = [items[i] for i in plan[k]]
        apply_lrs(optimizer, cfg, None if steps_before is None else steps_before + k)
        s = optimizer_step(model, chunk, cfg, optimizer, pad_id, ref_model, temperature)
        if s is None:
            skipped, in_a_row = skipped + 1, in_a_row + 1
            log.warning("optimizer step %d skipped: non-finite loss or gradient", k + 1)
            if in_a_row >= cfg.max_nonfinite_steps:
                raise FloatingPointError(
                    f"{in_a_row} optimizer steps in a row had a non-finite loss or gradient "
                    f"(train.max_nonfinite_steps: {cfg.max_nonfinite_steps}); lower train.lr or "
                    "check the rollout's log-probs"
                )
        else:
            history.append(s)
            in_a_row = 0
        if on_step is not None:
            on_step(k + 1, items)
    model.eval()
    stats = (
        {key: sum(h[key] for h in history) / len(history) for key in history[0]} if history else {}
    )
    if before is not None:
        stats |= trust_region(model, before, items, cfg, pad_id, temperature)
    return {**stats, "optimizer_steps": float(len(history)), "nonfinite_steps": float(skipped),
            "episodes": float(len(items)),
            "tokens": float(sum(sum(it["mask"]) for it in items))}  # fmt: skip


TRUST_REGION_TRIES = 4  # shrinks tried before a round's update is undone


def trainable_copy(model) -> list[torch.Tensor]:
    """The trainable weights as they are (the round's start: the trust region's origin)."""
    return [p.detach().clone() for p in model.parameters() if p.requires_grad]


@torch.no_grad()
def round_kl(model, items: list[dict], cfg, pad_id: int, temperature: float) -> float:
    """Mean over the round's policy tokens of the k3 KL(old || now), r - 1 - log r with
    r = pi_now / pi_old, sampled where the old policy sampled them: approx_kl after the fact,
    over every step of the round rather than before each."""
    now = policy_logprobs(model, items, cfg, pad_id, temperature)
    total, count = 0.0, 0
    for it, logp in zip(items, now, strict=True):
        old = torch.tensor(it.get("old", it["logprobs"])[1:])  # [T-1]
        log_ratio = torch.tensor(logp[1:]) - old  # [T-1]
        mask = torch.tensor(it["mask"][1:], dtype=torch.bool)  # [T-1]
        total += float((log_ratio.exp() - 1 - log_ratio)[mask].sum())
        count += int(mask.sum())
    return total / max(count, 1)


@torch.no_grad()
def trust_region(model, before: list[torch.Tensor], items: list[dict], cfg, pad_id: int,
                 temperature: float) -> dict:  # fmt: skip
    """Keep the round's update if its KL is within cfg.max_kl; else move the weights back along
    it to before + scale * (after - before), the scale from KL ~ scale^2 and then halved until
    the KL fits (TRPO's backtracking line search), or 0 (the update undone) after
    TRUST_REGION_TRIES. Why: on SmolLM2 a round whose update reached ~5e-3 approx_kl lost 14-25
    held-out points while rounds near 1.5e-3 gained (docs/experiments); the optimizer's moments
    stay as the full steps left them. With cfg.max_kl_expand > 1 a round inside the region is
    stretched along its update toward the boundary, at most that factor, as TRPO steps to its
    boundary (on SmolLM2 it gained no more than the plain region: docs/experiments)."""
    params = [p for p in model.parameters() if p.requires_grad]
    after = [p.detach().clone() for p in params]

    def move_to(scale: float, measure: bool = True) -> float:
        for p, a, b in zip(params, after, before, strict=True):
            p.copy_(b + scale * (a - b))
        return round_kl(model, items, cfg, pad_id, temperature) if measure else 0.0

    full = kl = round_kl(model, items, cfg, pad_id, temperature)
    scale = 1.0
    if kl < cfg.max_kl and cfg.max_kl_expand > 1.0:
        return stretch(move_to, full, cfg)
    for _ in range(TRUST_REGION_TRIES):
        if kl <= cfg.max_kl:
            break
        scale = 0.95 * math.sqrt(cfg.max_kl / full) if scale == 1.0 else scale / 2
        kl = move_to(scale)
    else:
        if kl > cfg.max_kl:
            move_to(0.0, measure=False)
            scale, kl = 0.0, 0.0
    return {"round_kl_full": full, "round_kl": kl, "trust_scale": scale}


def stretch(move_to, full: float, cfg) -> dict:
    """The update scaled up to 0.95 of the boundary by KL ~ scale^2 (at most max_kl_expand),
    halved toward 1 while the KL measured there is still outside; scale 1 (the full update,
    known to fit) if no stretch does."""
    scale, moved = min(cfg.max_kl_expand, 0.95 * math.sqrt(cfg.max_kl / max(full, 1e-12))), False
    for _ in range(TRUST_REGION_TRIES):
        if scale <= 1.0:
            break
        kl, moved = move_to(scale), True
        if kl <= cfg.max_kl:
            return {"round_kl_full": full, "round_kl": kl, "trust_scale": scale}
        scale = max(1.0, scale / 2)
    if moved:
        move_to(1.0, measure=False)
    return {"round_kl_full": full, "round_kl": full, "trust_scale": 1.0}


def world() -> tuple[int, int]:
    """(rank, world size) under torchrun, (0, 1) otherwise."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce_grads(model) -> None:
    """Sum gradients over ranks in one flat buffer. Losses are normalized by the whole chunk's
    counts, so the sum is exactly the one-process gradient of the concatenated batch."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:  # a rank with no items, or a param its items did not reach
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.flatten() for p in params])  # [P]
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


def optimizer_step(
    model, chunk: list[dict], cfg, optimizer: Optimizers, pad_id: int, ref_model, temperature: float
) -> dict | None:
    """One PPO step over `chunk`, micro-batched and split over DDP ranks; normalized by the whole
    chunk's counts. None: skipped, the loss or gradient was not finite (the NaN guard)."""
    rank, size = world()
    norm = Norm(
        tokens=float(sum(sum(it["mask"]) for it in chunk)),
        seqs=float(len(chunk)),
        horizon=float(max(len(it["ids"]) for it in chunk) - 1),
    )
    stats = {"loss": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "entropy": 0.0, "kl_ref": 0.0}
    if cfg.tis_cap is not None:
        stats |= {"tis_weight": 0.0, "tis_capped": 0.0}
    optimizer.zero_grad()
    for part, prefix in micro_batches(chunk[rank::size], cfg.micro_batch):
        batch = on_device(tensors(part, pad_id), model)  # CPU -> the model's device
        ids, attn, mask, adv, old_logp, rollout_logp = batch  # [B,T] / [B,T-1]
        logp, entropy = masked_logprobs(model, ids, attn, mask, cfg, temperature, prefix)  # [B,T-1]
        weights = None
        share = float(mask.sum()) / norm.tokens
        if cfg.tis_cap is not None:
            weights = tis_weights(old_logp, rollout_logp, cfg.tis_cap)  # [B, T-1]
            n = mask.sum().clamp(min=1)  # []
            stats["tis_weight"] += float((weights * mask).sum() / n) * share
            capped = (weights >= cfg.tis_cap).float()  # [B, T-1]
            stats["tis_capped"] += float((capped * mask).sum() / n) * share
        loss, s = ppo_clip_loss(
            logp, old_logp, adv, mask, cfg.clip_low, cfg.clip_high, norm, cfg.loss_agg, weights
        )
        if ref_model is not None and cfg.kl_coef > 0:
            with torch.no_grad():
                ref_logp, _ = masked_logprobs(ref_model, ids, attn, mask, cfg, temperature, prefix)
            kl = kl_k3(logp, ref_logp, mask, norm, cfg.loss_agg)  # []
            loss = loss + cfg.kl_coef * kl
            stats["kl_ref"] += kl.item()
        loss.backward()
        stats["loss"] += loss.item()
        stats["clip_frac"] += s["clip_frac"] * share
        stats["approx_kl"] += s["approx_kl"] * share
        stats["entropy"] += float((entropy.detach() * mask).sum()) / norm.tokens
    if size > 1:
        all_reduce_grads(model)
        device = next(model.parameters()).device  # NCCL reduces CUDA tensors only
        summed = torch.tensor(list(stats.values()), dtype=torch.float64, device=device)  # [S]
        dist.all_reduce(summed)
        stats = dict(zip(stats, summed.tolist(), strict=True))
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    if not (math.isfinite(stats["loss"]) and math.isfinite(float(grad_norm))):
        optimizer.zero_grad()
        return None
    stats["grad_norm"] = float(grad_norm)
    optimizer.step()
    return stats


@dataclass
class TrainerState:
    """What a resumed run needs beyond the weights: `step` counts optimizer steps over all rounds;
    `round_step` steps done in an unfinished round (0: the round finished), with the pre-round
    old log-probs it used for TIS."""

    step: int = 0
    round_step: int = 0
    old_logprobs: list[list[float]] | None = None


def snapshot(
    optimizer: Optimizers,
    step: int,
    round_step: int = 0,
    old_logprobs: list[list[float]] | None = None,
) -> dict:
    """Optimizer moments, every RNG the trainer may draw from, and the step counters: what the
    next round resumes from (save_state writes it beside a checkpoint; loop.run_round keeps it
    in memory, so both paths resume from the same thing)."""
    return {
        "optimizer": copy.deepcopy(optimizer.state_dict()),
        "step": step,
        "round_step": round_step,
        "old_logprobs": old_logprobs,
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
    }


def restore(state: dict | None, optimizer: Optimizers | None) -> TrainerState:
    """Restore optimizer moments (unless optimizer is None: a new round's fresh LoRA adapters
    have no moments to resume) and RNGs from a snapshot; None (the warm start): nothing."""
    if state is None:
        return TrainerState()
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    if "python_rng" in state:
        random.setstate(state["python_rng"])
        np.random.set_state(state["numpy_rng"])
    return TrainerState(
        step=int(state["step"]),
        round_step=int(state.get("round_step", 0)),
        old_logprobs=state.get("old_logprobs"),
    )


def save_state(
    folder: Path,
    optimizer: Optimizers,
    step: int,
    round_step: int = 0,
    old_logprobs: list[list[float]] | None = None,
) -> None:
    """The snapshot, into the checkpoint folder."""
    write_state(folder, snapshot(optimizer, step, round_step, old_logprobs))


def write_state(folder: Path, state: dict) -> None:
    torch.save(state, Path(folder) / STATE_FILE)


def read_state(folder: Path) -> dict | None:
    """A checkpoint folder's snapshot, None if it has none (a warm start)."""
    path = Path(folder) / STATE_FILE
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)  # a GPU run's, on any box


def load_state(folder: Path, optimizer: Optimizers | None) -> TrainerState:
    """restore() from a checkpoint folder's snapshot, if it has one."""
    return restore(read_state(folder), optimizer)
