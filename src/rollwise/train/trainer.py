"""One RL round: PPO-clip epochs over the curated episodes with their per-token advantages."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.nn.utils.rnn import pad_sequence

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
    """Episodes whose advantages are not all zero; each with ids, policy mask, advantages."""
    items = []
    for row, adv in zip(episodes.itertuples(), token_advantages(episodes, advantages), strict=True):
        if any(a != 0.0 for a in adv):
            items.append({"ids": list(row.token_ids), "mask": list(row.loss_mask), "adv": adv})
    return items


def tensors(items: list[dict], pad_id: int):
    ids, attn, mask = pad_batch([(it["ids"], it["mask"]) for it in items], pad_id)  # [B, T] each
    adv = torch.zeros_like(mask)  # [B, T]
    for i, it in enumerate(items):
        adv[i, : len(it["adv"])] = torch.tensor(it["adv"])
    return ids, attn, mask[:, 1:], adv[:, 1:]  # targets are next tokens: [B, T-1]


@torch.no_grad()
def score(model, items: list[dict], pad_id: int, micro: int) -> list[torch.Tensor]:
    """Log-probs of each item's tokens under `model`, before any update (PPO's old policy)."""
    out = []
    for lo in range(0, len(items), micro):
        ids, attn, _, _ = tensors(items[lo : lo + micro], pad_id)
        logp, _ = token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids)  # [B, T-1]
        lengths = [len(it["ids"]) - 1 for it in items[lo : lo + micro]]
        out += [logp[i, :n] for i, n in enumerate(lengths)]  # unpadded: [T_i - 1] each
    return out


def train_round(model, items: list[dict], cfg, optimizer, pad_id: int, ref_model=None) -> dict:
    """cfg.epochs passes; each pass is one optimizer step over all items (micro-batched)."""
    if not items:
        return {"skipped": 1.0, "episodes": 0.0}
    old = score(model, items, pad_id, cfg.micro_batch)
    ref = score(ref_model, items, pad_id, cfg.micro_batch) if ref_model is not None else None
    n_tokens = float(sum(sum(it["mask"]) for it in items))
    rng = random.Random(cfg.seed)
    model.train()
    history = []
    for _ in range(cfg.epochs):
        order = list(range(len(items)))
        rng.shuffle(order)
        optimizer.zero_grad()
        stats = {"loss": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "entropy": 0.0, "kl_ref": 0.0}
        for lo in range(0, len(order), cfg.micro_batch):
            idx = order[lo : lo + cfg.micro_batch]
            ids, attn, mask, adv = tensors([items[i] for i in idx], pad_id)  # [B, T-1] (ids [B, T])
            old_logp = pad_sequence([old[i] for i in idx], batch_first=True)  # [B, T-1]
            logp, entropy = token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids)
            loss, s = ppo_clip_loss(
                logp, old_logp, adv, mask, cfg.clip_low, cfg.clip_high, n_tokens
            )
            if ref is not None and cfg.kl_coef > 0:
                ref_logp = pad_sequence([ref[i] for i in idx], batch_first=True)  # [B, T-1]
                kl = kl_k3(logp, ref_logp, mask, n_tokens)  # []
                loss = loss + cfg.kl_coef * kl
                stats["kl_ref"] += float(kl)
            loss.backward()
            share = float(mask.sum()) / n_tokens
            stats["loss"] += loss.item()
            stats["clip_frac"] += s["clip_frac"] * share
            stats["approx_kl"] += s["approx_kl"] * share
            stats["entropy"] += float((entropy.detach() * mask).sum()) / n_tokens
        stats["grad_norm"] = float(
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        )
        optimizer.step()
        history.append(stats)
    model.eval()
    last = history[-1]
    return {**last, "episodes": float(len(items)), "tokens": n_tokens}


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
