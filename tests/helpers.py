"""Small shared builders for unit tests: a tiny generated suite, its tokenizer, a tiny model."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rollwise.config import EnvsConfig, PolicyConfig

# 3 environments x 10 tasks, one environment held out: generates in well under a second.
SMALL_ENVS = EnvsConfig(
    seed=0, n_envs=3, tasks_per_env=10, owners_per_env=4, max_records=2, heldout_envs=1
)
TINY_POLICY = PolicyConfig(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, seed=0)


def make_suite(out: Path, cfg: EnvsConfig = SMALL_ENVS) -> dict:
    from rollwise.envs.generate import generate_suite

    return generate_suite(cfg, Path(out))


def suite_and_tokenizer(out: Path):
    """(Suite, tokenizer) the way the warmstart stage builds them."""
    from rollwise.envs.runtime import load_suite
    from rollwise.train.warmstart import suite_tokenizer

    make_suite(out)
    suite = load_suite(out)
    return suite, suite_tokenizer(suite)


@dataclass(frozen=True)
class ScriptedPolicy:
    suite_dir: Path
    policy_dir: Path
    suite: object  # envs.runtime.Suite
    tokenizer: object
    model: object


@functools.cache
def scripted_policy(policy: PolicyConfig = TINY_POLICY) -> ScriptedPolicy:
    """A tiny policy SFT'd (~10 s, once per test session and model config) on two scripts for
    every train prompt: the task's own oracle, and one fixed turn (the first train task's first
    oracle call, then its answer). Saved with its suite in a temp dir. Torn between the two, at
    temperature 0.7 its multi-turn episodes mix valid calls (ok observations), calls the tool
    rejects and malformed ones, and differ between samples: every engine path runs (fewer steps
    or one script alone left it either babbling or deterministic). Shared: do not change it."""
    import dataclasses

    from rollwise.config import WarmstartConfig
    from rollwise.envs.runtime import load_suite
    from rollwise.policy.build import build_model, save_policy
    from rollwise.train.sft import oracle_sequence, sft
    from rollwise.train.warmstart import suite_tokenizer

    root = Path(tempfile.mkdtemp(prefix="rollwise-scripted-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    make_suite(root / "envs")
    suite = load_suite(root / "envs")
    tok = suite_tokenizer(suite)
    model = build_model(tok, policy)
    train = suite.split("train")
    script = {"oracle": train[0].oracle[:1], "answer": train[0].answer}
    demos = [
        oracle_sequence(dataclasses.replace(t, **script), suite.envs[t.env_id], tok) for t in train
    ] + [oracle_sequence(t, suite.envs[t.env_id], tok) for t in train]
    sft(model, demos, WarmstartConfig(steps=150, batch_size=16, lr=0.02), tok.pad_token_id)
    save_policy(model, tok, root / "round_00")
    return ScriptedPolicy(root / "envs", root / "round_00", suite, tok, model.eval())


def assert_same_episodes(a: list[dict], b: list[dict]) -> None:
    """Episode rows equal field for field; log-probs to 1e-5 (batch shapes change float sums).
    A mismatch names the episode, the field and the first differing position."""
    import torch

    assert [e["episode_id"] for e in a] == [e["episode_id"] for e in b]
    for x, y in zip(a, b, strict=True):
        for key in sorted(x.keys() - {"logprobs", "wall_s"}):
            assert x[key] == y[key], (x["episode_id"], key, first_difference(x[key], y[key]))
        assert torch.allclose(torch.tensor(x["logprobs"]), torch.tensor(y["logprobs"]), atol=1e-5)


def first_difference(x, y) -> str:
    """Where two values part: for sequences, the first differing index and the items there."""
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        i = next(
            (k for k, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y))
        )
        return f"at [{i}] of {len(x)} vs {len(y)}: {x[i : i + 3]} vs {y[i : i + 3]}"
    return f"{x!r:.200} vs {y!r:.200}"


def train_tables(items: list[dict]) -> dict:
    """Round tables from trainer items: {folder kind: (file stem, frame)} of the episodes,
    curator decisions and advantages (one turn per episode, its advantage the item's last)."""
    import pandas as pd

    ids = [f"e{k}" for k in range(len(items))]
    return {
        "rollouts": ("episodes", pd.DataFrame({"episode_id": ids,
                                               "token_ids": [it["ids"] for it in items],
                                               "loss_mask": [it["mask"] for it in items],
                                               "logprobs": [it["logprobs"] for it in items]})),
        "curated": ("decisions", pd.DataFrame({"episode_id": ids, "kept": [True] * len(items)})),
        "advantages": ("advantages", pd.DataFrame({
            "episode_id": ids, "step": [0] * len(items),
            "advantage": [it["adv"][-1] for it in items], "span_start": [4] * len(items),
            "span_end": [len(it["ids"]) for it in items]})),
    }  # fmt: skip


def write_train_inputs(root: Path, r: str, items: list[dict]) -> None:
    """What train@r reads besides its start checkpoint: round r's episodes, curator decisions
    and advantages (train_tables)."""
    for kind, (name, frame) in train_tables(items).items():
        folder = root / "data" / kind / f"round_{r}"
        folder.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(folder / f"{name}.parquet")


def assert_bench_arm_matches(root: Path, rounds: tuple[str, ...] | list[str]) -> None:
    """A pipeline run's folder (dvc repro's or a flow run's worktree) against rollwise.loop's
    in-memory rounds (what every bench arm runs) from its round_00 with its params.yaml: the
    same episodes, advantages and checkpoint weights, round by round."""
    import pandas as pd
    import torch
    from safetensors.torch import load_file

    from rollwise import loop
    from rollwise.config import load_params
    from rollwise.envs.runtime import load_suite
    from rollwise.policy.build import load_policy

    params = load_params(root / "params.yaml")
    model, tok = load_policy(root / "models" / "round_00")
    seen: dict[str, tuple] = {}

    def on_round(r: int, done) -> None:
        weights = {k: v.detach().clone() for k, v in done.trained.model.state_dict().items()}
        seen[f"{r:02d}"] = (done.rollout.episodes, done.credited.advantages, weights)

    suite = load_suite(root / "data" / "envs")
    loop.run_rounds(params, suite, model, tok, params.n_rounds, on_round=on_round)
    for r in rounds:
        episodes, advantages, weights = seen[r]
        disk = pd.read_parquet(root / "data" / "rollouts" / f"round_{r}" / "episodes.parquet")
        assert list(episodes["episode_id"]) == list(disk["episode_id"]), r
        assert [list(t) for t in episodes["token_ids"]] == [list(t) for t in disk["token_ids"]]
        assert list(episodes["reward"]) == list(disk["reward"]), r
        adv = pd.read_parquet(root / "data" / "advantages" / f"round_{r}" / "advantages.parquet")
        pd.testing.assert_frame_equal(
            advantages.reset_index(drop=True)[["episode_id", "step", "advantage"]],
            adv[["episode_id", "step", "advantage"]],
        )
        saved = load_file(root / "models" / f"round_{r}" / "model.safetensors")
        assert saved and all(torch.equal(saved[k], weights[k]) for k in saved), r
