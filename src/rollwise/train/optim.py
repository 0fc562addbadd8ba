"""Optimizers for the RL trainer. Muon orthogonalizes updates of 2-D hidden weights only
(torch.optim.Muon raises on 1-D params, and embeddings/head are lookups, not linear maps), so
it is paired with AdamW for everything else; each keeps its own learning rate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rollwise.config import TrainConfig, WarmstartConfig

LR_KEY = "lr_param"  # stored in each param group: the TrainConfig field holding its lr


class Optimizers:
    """Several torch optimizers stepped as one; state dicts keyed by name."""

    def __init__(self, parts: dict[str, torch.optim.Optimizer]) -> None:
        self.parts = parts

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for opt in self.parts.values() for g in opt.param_groups]

    def zero_grad(self) -> None:
        for opt in self.parts.values():
            opt.zero_grad()

    def step(self) -> None:
        for opt in self.parts.values():
            opt.step()

    def state_dict(self) -> dict[str, Any]:
        return {name: opt.state_dict() for name, opt in self.parts.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != set(self.parts):
            raise ValueError(
                f"trainer state holds optimizers {sorted(state)}, this run builds "
                f"{sorted(self.parts)}: was train.optimizer changed between rounds?"
            )
        for name, opt in self.parts.items():
            try:
                opt.load_state_dict(state[name])
            except ValueError as e:  # torch: groups of another size
                raise ValueError(
                    f"trainer state's {name} does not fit this run's trainable params ({e}): "
                    "were train.lora or the model changed between rounds?"
                ) from e


def hidden_matrices(model: torch.nn.Module) -> tuple[list, list]:
    """(2-D hidden weights, everything else): embeddings, head, norms and biases go to AdamW."""
    io = {id(model.get_input_embeddings().weight)}
    head = model.get_output_embeddings()
    if head is not None:
        io.add(id(head.weight))
    hidden, rest = [], []
    for p in model.parameters():  # tied weights appear once
        if p.requires_grad:
            (hidden if p.ndim == 2 and id(p) not in io else rest).append(p)
    return hidden, rest


def adamw_knobs(cfg: TrainConfig | WarmstartConfig) -> dict[str, float]:
    """AdamW's settings from params `train` or `warmstart`. Its eps floors the per-weight step's
    denominator: at torch's 1e-8 every weight an RL gradient touches at all moves by about lr,
    noise or not."""
    return {"lr": cfg.lr, "weight_decay": cfg.weight_decay, "eps": cfg.adam_eps}


def adamw(model: torch.nn.Module, cfg) -> Optimizers:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": params, LR_KEY: "lr"}], **adamw_knobs(cfg))
    return Optimizers({"adamw": opt})


def muon(model: torch.nn.Module, cfg) -> Optimizers:
    hidden, rest = hidden_matrices(model)
    parts: dict[str, torch.optim.Optimizer] = {
        "muon": torch.optim.Muon(
            [{"params": hidden, LR_KEY: "muon_lr"}],
            lr=cfg.muon_lr,
            weight_decay=cfg.weight_decay,
            momentum=0.95,
            nesterov=True,
            ns_steps=5,
            adjust_lr_fn="original",  # scale by sqrt(max(1, rows / cols)), as design.md says
        )
    }
    if rest:
        parts["adamw"] = torch.optim.AdamW([{"params": rest, LR_KEY: "lr"}], **adamw_knobs(cfg))
    return Optimizers(parts)


OPTIMIZERS: dict[str, Callable[[torch.nn.Module, Any], Optimizers]] = {
    "adamw": adamw,
    "muon": muon,
}


def make_optimizer(model: torch.nn.Module, cfg) -> Optimizers:
    """The optimizer named by cfg.optimizer over the model's trainable params."""
    return OPTIMIZERS[cfg.optimizer](model, cfg)


def apply_lrs(optimizer: Optimizers, cfg, step: int | None = None) -> None:
    """Set each group's lr from the params (they win over a resumed state's saved lr), scaled
    by the linear warmup at optimizer `step` (counted over the whole run). Why a warmup: Adam's
    first steps are sign steps of size lr on every weight; without one, the first RL round moved
    the policy by approx_kl 0.128 per token, with 16 warmup steps by 0.0008 (bench/rl_probe.py)."""
    warm = cfg.warmup_steps
    scale = min(1.0, (step + 1) / warm) if warm and step is not None else 1.0
    for group in optimizer.param_groups:
        group["lr"] = getattr(cfg, group[LR_KEY]) * scale
