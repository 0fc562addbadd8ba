"""One RL round: PPO-clip epochs over the curated episodes with their per-token advantages."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from rollwise.train.loss import kl_k3, ppo_clip_loss, token_logprobs
from rollwise.train.sft import pad_batch

STATE_FILE = "trainer_state.pt"


def token_advantages(episodes: pd.DataFrame, advantages: pd.DataFrame) -> list[list[float]]:
    """Spread each (episode, turn) advantage over that turn's token span; zero elsewhere."""
    by_episode = {ep: g for ep, g in advantages.groupby("episode_id")}
    out = []
    for ep, ids in zip(episodes["episode_id"], episodes["token_ids"], strict=True):
        adv = np.zeros(len(ids), dtype=np.float32)
        turns = by_episode.get(ep, advantages.iloc[:0])  # no turns taken: no advantage rows
        for s, e, a in turns[["span_start", "span_end", "advantage"]].to_numpy():
            adv[int(s) : int(e)] = a
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
    """Right-padded [B, T] ids and attention; [B, T-1] mask, advantages and old log-probs, all
    aligned with the next-token targets ids[:, 1:]."""
    ids, attn, mask = pad_batch([(it["ids"], it["mask"]) for it in items], pad_id)  # [B, T] each
    adv = torch.zeros_like(mask)  # [B, T]
    old = torch.zeros_like(mask)  # [B, T]
    for i, it in enumerate(items):
        adv[i, : len(it["adv"])] = torch.tensor(it["adv"])
        old[i, : len(it["logprobs"])] = torch.tensor(it["logprobs"])
    return ids, attn, mask[:, 1:], adv[:, 1:], old[:, 1:]


def train_round(
    model, items: list[dict], cfg, optimizer, pad_id: int, ref_model=None, temperature: float = 1.0
) -> dict:
    """cfg.epochs passes over the items, each split into cfg.minibatches optimizer steps.
    Log-probs use the rollout's sampling temperature, so the rollout's log-probs are PPO's old
    policy exactly (as verl does)."""
    if not items:
        return {"skipped": 1.0, "episodes": 0.0}
    rng = random.Random(cfg.seed)
    model.train()
    history = []
    for _ in range(cfg.epochs):
        order = list(range(len(items)))
        rng.shuffle(order)
        size = -(-len(order) // cfg.minibatches)
        for lo in range(0, len(order), size):
            chunk = [items[i] for i in order[lo : lo + size]]
            history.append(
                optimizer_step(model, chunk, cfg, optimizer, pad_id, ref_model, temperature)
            )
    model.eval()
    stats = {k: sum(h[k] for h in history) / len(history) for k in history[0]}
    return {**stats, "optimizer_steps": float(len(history)), "episodes": float(len(items)),
            "tokens": float(sum(sum(it["mask"]) for it in items))}  # fmt: skip


def optimizer_step(
    model, chunk: list[dict], cfg, optimizer, pad_id: int, ref_model, temperature: float
) -> dict:
    """One PPO step over `chunk`, micro-batched; token-mean over the whole chunk."""
    n_tokens = float(sum(sum(it["mask"]) for it in chunk))
    stats = {"loss": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "entropy": 0.0, "kl_ref": 0.0}
    optimizer.zero_grad()
    for lo in range(0, len(chunk), cfg.micro_batch):
        ids, attn, mask, adv, old_logp = tensors(chunk[lo : lo + cfg.micro_batch], pad_id)
        logits = model(input_ids=ids, attention_mask=attn).logits / temperature  # [B, T, V]
        logp, entropy = token_logprobs(logits, ids)  # [B, T-1] each
        loss, s = ppo_clip_loss(logp, old_logp, adv, mask, cfg.clip_low, cfg.clip_high, n_tokens)
        if ref_model is not None and cfg.kl_coef > 0:
            with torch.no_grad():
                ref_logits = ref_model(input_ids=ids, attention_mask=attn).logits  # [B, T, V]
            ref_logp, _ = token_logprobs(ref_logits / temperature, ids)  # [B, T-1]
            kl = kl_k3(logp, ref_logp, mask, n_tokens)  # []
            loss = loss + cfg.kl_coef * kl
            stats["kl_ref"] += kl.item()
        loss.backward()
        share = float(mask.sum()) / n_tokens
        stats["loss"] += loss.item()
        stats["clip_frac"] += s["clip_frac"] * share
        stats["approx_kl"] += s["approx_kl"] * share
        stats["entropy"] += float((entropy.detach() * mask).sum()) / n_tokens
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    stats["grad_norm"] = float(grad_norm)
    optimizer.step()
    return stats


def make_optimizer(model, cfg) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def save_state(folder: Path, optimizer, step: int) -> None:
    state = {"optimizer": optimizer.state_dict(), "step": step, "torch_rng": torch.get_rng_state()}
    torch.save(state, Path(folder) / STATE_FILE)


def load_state(folder: Path, optimizer) -> int:
    """Restore optimizer moments from the previous round, if it left any; returns its step."""
    path = Path(folder) / STATE_FILE
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"])
