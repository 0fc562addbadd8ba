"""From a loaded policy to what the trainer steps, and back to a plain HF model to save: LoRA
adapters (peft), gradient checkpointing, the device, bf16 autocast, the DDP process group.

bf16 autocast is a CUDA speed/memory knob: asked for without CUDA it logs a warning and the run
trains in float32, so one params.yaml serves a GPU box and the CPU tests. Gradient checkpointing
is honoured on every device: it only trades compute for activation memory, the gradients are the
same.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


def train_device() -> torch.device:
    """This rank's GPU (torchrun's LOCAL_RANK) when CUDA is there, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def init_distributed() -> torch.device:
    """Join torchrun's process group (env:// rendezvous): NCCL on GPUs, gloo on CPU."""
    device = train_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def add_lora(model, lora):
    """Wrap the model in peft LoRA adapters: only the adapters train, the base stays frozen."""
    from peft import LoraConfig, get_peft_model

    from rollwise.policy.build import MODEL_INIT_LOCK

    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    # the lock: a load in another thread must not turn the adapters' init into no-ops meanwhile
    with MODEL_INIT_LOCK, warnings.catch_warnings():  # peft 0.21 reads a deprecated property
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        return get_peft_model(model, config)


def prepare(model, cfg, device: torch.device | None = None):
    """The model the trainer steps: LoRA-wrapped if `lora_for` says so, checkpointed if asked,
    on device."""
    device = device or train_device()
    if cfg.bf16 and device.type != "cuda":
        log.warning("train.bf16 needs CUDA and this run has none: training in float32")
    if cfg.gradient_checkpointing:  # non-reentrant: gradients reach LoRA past frozen inputs
        model.activation_checkpointing_enable({"use_reentrant": False})
    lora = lora_for(model, cfg)
    if lora is not None:
        model = add_lora(model, lora)
    return model.to(device)


def lora_for(model, cfg):
    """The adapters to train: `train.lora` when set; else peft defaults (LoraConfig()) for a
    model above `train.lora_above_m` million parameters, a real model, where full fine-tuning
    keeps AdamW moments of every weight in each checkpoint; else None (full fine-tune)."""
    from rollwise.config import LoraConfig

    if cfg.lora is not None:
        return cfg.lora
    big = sum(p.numel() for p in model.parameters()) > (cfg.lora_above_m or 0) * 1e6
    return LoraConfig() if cfg.lora_above_m is not None and big else None


def is_lora(model) -> bool:
    """Whether `prepare` wrapped the model in LoRA adapters (their moments are new each round)."""
    return hasattr(model, "peft_config")


def export(model):
    """A plain HF model to save and roll out: LoRA adapters merged into the base weights."""
    if hasattr(model, "merge_and_unload"):  # a peft model
        model = model.merge_and_unload()
    if model.is_activation_checkpointing:
        model.activation_checkpointing_disable()
    return model


def autocast(cfg, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast for forward passes on CUDA when cfg.bf16; a no-op otherwise."""
    if cfg.bf16 and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
