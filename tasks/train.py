"""Stage `train@NN`: one PPO-clip update of policy NN-1 -> models/round_NN/ (+ trainer state).

The batch may have been sampled with an older checkpoint (`rollout.policy_lag: 1`: round NN-2,
while train@NN-1 was training): PPO's old policy is then recomputed by NN-1 and truncated
importance sampling (train.tis_cap, required) weights each token by min(pi_NN-1 / pi_rollout, C).

With train.world_size > 1 the stage relaunches itself under torchrun (`torch.distributed.run`):
each rank trains on its share of every minibatch, rank 0 writes the checkpoint and the metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from rollwise import loop
from rollwise.config import Params
from tasks.common import (
    atomic_dir,
    envs_dir,
    keep_checkpoint,
    load_checkpoint,
    log,
    model_dir,
    read_json,
    read_suite,
    read_table,
    round_batch,
    round_dir,
    stage_main,
    stage_of_model,
    write_json,
)

# Set for the ranks of a torchrun launch: the folder with params.json (in) and metrics.json (out).
LAUNCH_ENV = "ROLLWISE_TRAIN_LAUNCH"
CODE_ROOT = Path(__file__).resolve().parents[1]
GUARD_FILE = "guard.json"  # in models/round_NN: its greedy validation success (train.guard)


def run(params: Params, root: Path, r: str) -> dict:
    if params.train.world_size > 1:
        return launch(params, root, r)
    return train(params, root, r)


def train(params: Params, root: Path, r: str, device=None) -> dict:
    """This process's share of the round (rollwise.loop.train); rank 0 (or the only process)
    saves the checkpoint: the updated weights, or a copy of the start's if train.guard undid
    the update."""
    from rollwise.policy.build import MARKER, load_policy, save_policy
    from rollwise.train.guard import as_record
    from rollwise.train.trainer import read_state, world, write_state

    cfg, prev = params.train, params.rounds[r].start
    concurrent = params.rollout.policy_lag > 0  # rollout@r+1 may be sampling with `prev` now
    model, tokenizer = load_checkpoint(
        model_dir(root, prev), stage_of_model(prev), take=True, concurrent=concurrent
    )
    advantages = read_table(round_dir(root, "advantages", r) / "advantages.parquet", f"credit@{r}")
    episodes, _, _ = round_batch(root, r, with_steps=False)
    ref = None
    if cfg.kl_coef > 0:
        ref = load_policy(model_dir(root, "00"))[0].to(device or next(model.parameters()).device)
    guarded = cfg.guard.tasks > 0 and world()[0] == 0
    with guard_suite(params, root, tokenizer) if guarded else nullcontext() as suite:
        guard = None
        if guarded:
            start, best = start_success(params, root, prev, model, tokenizer, suite)
            guard = loop.guard_check(params, tokenizer, suite, start, best)
        trainer = read_state(model_dir(root, prev))
        done = loop.train(params, model, tokenizer, trainer, episodes, advantages, int(r), ref,
                          guard, device)  # fmt: skip
    metrics, verdict = done.metrics, done.verdict
    if world()[0] != 0:  # a DDP rank > 0: rank 0 writes
        return metrics
    with atomic_dir(model_dir(root, r)) as out:
        if verdict is None or verdict.kept:
            save_policy(done.model, tokenizer, out, {"round": int(r), "from": prev})
            write_state(out, done.trainer)  # kept: always a snapshot
        else:  # the update is undone: this round's checkpoint is its start, moments and all
            shutil.copytree(model_dir(root, prev), out, dirs_exist_ok=True)
            info = {"round": int(r), "from": prev, "reverted": True}
            (out / MARKER).write_text(json.dumps(info, indent=1))
        if verdict is not None:
            write_json(out / GUARD_FILE, as_record(verdict, cfg.guard))
    if verdict is None or verdict.kept:
        keep_checkpoint(model_dir(root, r), done.model, tokenizer)
    else:
        drop = f"{verdict.start:.3f} -> {verdict.after:.3f} (best kept {verdict.best:.3f}, "
        drop += f"max drop {cfg.guard.max_drop} against {cfg.guard.against})"
        log(f"train@{r}", f"guard: validation success {drop}; update undone, round_{r} = {prev}")
    log(f"train@{r}", f"{len(episodes)} episodes, loss {metrics.get('loss', 0):.4f}")
    return metrics


@contextmanager
def guard_suite(params: Params, root: Path, tokenizer) -> Iterator:
    """The suite train.guard validates on: the run's own (`suite: train`) or the warm start's
    validation suite, generated for the round (~1 s) into a scratch folder it needs while open."""
    from rollwise.train.guard import validation_guard_suite

    if params.train.guard.suite == "train":
        yield read_suite(envs_dir(root))
        return
    with tempfile.TemporaryDirectory() as scratch:
        yield validation_guard_suite(params, Path(scratch) / "validation", tokenizer)


def start_success(
    params: Params, root: Path, prev: str, model, tokenizer, suite
) -> tuple[float, float]:
    """Greedy validation success of the round's start and of the best checkpoint kept so far:
    what train@prev recorded for the same task count, else measured now (round_00, or a start
    trained without the guard: then it is the best too)."""
    from rollwise.train.guard import validation_success

    path = model_dir(root, prev) / GUARD_FILE
    if path.exists():
        record = read_json(path, f"train@{prev}")
        same = (record.get("tasks"), record.get("suite", "train"))
        if same == (params.train.guard.tasks, params.train.guard.suite):
            start = float(record["kept_success"])
            return start, float(record.get("best_success", start))
    cfg = params.train.guard
    start = validation_success(model, tokenizer, suite, cfg, loop.greedy_limits(params))
    return start, start


def launch(params: Params, root: Path, r: str) -> dict:
    """Run this stage's ranks under torchrun on this machine; rank 0's metrics come back."""
    import torch

    n = params.train.world_size
    if torch.cuda.is_available() and n > torch.cuda.device_count():
        raise ValueError(f"train.world_size: {n} ranks, one per GPU, but this machine has "
                         f"{torch.cuda.device_count()} GPUs")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="rollwise-train-") as tmp:
        (Path(tmp) / "params.json").write_text(params.model_dump_json())
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={n}", "-m", "tasks.train",
               "--round", r, "--root", str(Path(root).resolve())]  # fmt: skip
        path = os.pathsep.join(filter(None, [str(CODE_ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, LAUNCH_ENV: tmp, "PYTHONPATH": path}
        log(f"train@{r}", f"launching {n} DDP ranks through torchrun")
        done = subprocess.run(cmd, cwd=CODE_ROOT, env=env)
        if done.returncode != 0:
            raise RuntimeError(
                f"train@{r}: torchrun with train.world_size {n} exited {done.returncode}; "
                "the failing rank's error is in the output above"
            )
        return json.loads((Path(tmp) / "metrics.json").read_text())


def rank_main(folder: Path) -> None:
    """One torchrun rank: the launcher's params (overrides included), its share of the round."""
    import torch.distributed as dist

    from rollwise.train.prepare import init_distributed

    parser = argparse.ArgumentParser(prog="tasks.train (torchrun rank)")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--round", required=True)
    args = parser.parse_args()
    params = Params.model_validate_json((folder / "params.json").read_text())
    device = init_distributed()
    try:
        metrics = train(params, args.root, args.round, device)
        if dist.get_rank() == 0:
            write_json(folder / "metrics.json", metrics)
    finally:
        dist.destroy_process_group()


def main() -> None:
    folder = os.environ.get(LAUNCH_ENV)
    if folder:
        rank_main(Path(folder))
    else:
        stage_main("train", run, with_round=True)


if __name__ == "__main__":
    main()
