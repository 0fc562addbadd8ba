"""Stage `train@NN`: one PPO-clip update of policy NN-1 -> models/round_NN/ (+ trainer state)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from rollwise.config import Params
from tasks.common import (
    atomic_dir,
    keep_checkpoint,
    load_checkpoint,
    log,
    model_dir,
    read_table,
    round_dir,
    stage_main,
)
from tasks.credit import kept_episodes
from tasks.rollout import stage_of_model


def run(params: Params, root: Path, r: str) -> dict:
    import torch

    from rollwise.policy.build import load_policy, save_policy
    from rollwise.train.optim import apply_lrs, make_optimizer
    from rollwise.train.trainer import load_state, save_state, train_round, training_batch

    prev = params.rounds[r]
    seed = params.train.seed * 1000 + int(r)
    # Every RNG the trainer state saves is seeded, so a rerun writes byte-identical outputs.
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    model, tokenizer = load_checkpoint(model_dir(root, prev), stage_of_model(prev), take=True)
    advantages = read_table(round_dir(root, "advantages", r) / "advantages.parquet", f"credit@{r}")
    items = training_batch(kept_episodes(root, r), advantages)
    optimizer = make_optimizer(model, params.train)
    step = load_state(model_dir(root, prev), optimizer).step
    apply_lrs(optimizer, params.train)  # the params' lrs win over the saved ones
    ref = load_policy(model_dir(root, "00"))[0] if params.train.kl_coef > 0 else None
    metrics = train_round(
        model, items, params.train, optimizer, tokenizer.pad_token_id, ref,
        temperature=params.rollout.temperature,
    )  # fmt: skip
    with atomic_dir(model_dir(root, r)) as out:
        save_policy(model, tokenizer, out, {"round": int(r), "from": prev})
        save_state(out, optimizer, step + int(metrics.get("optimizer_steps", 0)))
    keep_checkpoint(model_dir(root, r), model, tokenizer)
    log(f"train@{r}", f"{len(items)} episodes with signal, loss {metrics.get('loss', 0):.4f}")
    return metrics


def main() -> None:
    stage_main("train", run, with_round=True)


if __name__ == "__main__":
    main()
