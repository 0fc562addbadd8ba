"""rollout.policy_lag 1 (asynchronous rollout): the lag in dvc.yaml's dependencies, TIS on a
batch sampled by an older checkpoint, and the model cache when a rollout and a training stage
share a checkpoint in two threads."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import yaml

from rollwise.config import (
    PolicyConfig,
    TrainConfig,
    apply_overrides,
    read_raw,
    validate,
    write_rounds_file,
)
from rollwise.train.optim import make_optimizer
from rollwise.train.trainer import policy_logprobs, train_round

REPO = Path(__file__).resolve().parents[1]
DVC = str(Path(sys.executable).parent / "dvc")
TINY = PolicyConfig(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, max_context=64)
LAG = {"rollout.policy_lag": 1, "train.tis_cap": 2.0, "rounds": 3}

# ------------------------------------------------------------------------------ dvc.yaml


@pytest.fixture(scope="module")
def lagged_stages(tmp_path_factory: pytest.TempPathFactory):
    """The real dvc.yaml with lagged params, as DVC itself resolves it (no git, no outputs)."""
    from flows.workspace import DvcStages

    root = tmp_path_factory.mktemp("lagged")
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    raw = apply_overrides(read_raw(REPO / "params.yaml"), LAG)
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    write_rounds_file(root, validate(raw))  # what dvc.yaml loops over
    subprocess.run([DVC, "init", "-q", "--no-scm"], cwd=root, check=True, capture_output=True)
    stages = DvcStages(root)
    yield stages
    stages.close()


def deps_of(stages, name: str) -> set[str]:
    from flows.workspace import inside

    with inside(stages.root):  # DVC resolves stage names against the working directory
        return {str(Path(d.def_path)) for d in stages.stage(name).deps}


def test_lagged_rollout_depends_on_the_older_checkpoint_only(lagged_stages):
    assert "models/round_00" in deps_of(lagged_stages, "rollout@02")
    assert "models/round_01" not in deps_of(lagged_stages, "rollout@02")
    assert "models/round_01" in deps_of(lagged_stages, "rollout@03")
    # its chain state still continues from round r-1
    assert "data/rollouts/round_02/scheduler_state.json" in deps_of(lagged_stages, "rollout@03")
    assert "models/round_02" in deps_of(lagged_stages, "train@03")  # train updates r-1


def test_lagged_graph_lets_rollout_run_beside_training(lagged_stages):
    upstream = lagged_stages.upstream()

    def ancestors(name: str) -> set[str]:
        found, todo = set(), [name]
        while todo:
            for u in upstream[todo.pop()] - found:
                found.add(u)
                todo.append(u)
        return found

    for r, nxt in (("01", "02"), ("02", "03")):
        for a, b in ((f"rollout@{nxt}", f"train@{r}"), (f"curate@{nxt}", f"credit@{r}")):
            assert a not in ancestors(b) and b not in ancestors(a), (a, b)  # may overlap
    assert "train@01" in ancestors("rollout@03")  # never more than one version behind
    assert "train@02" not in ancestors("rollout@03")
    assert "train@01" in ancestors("credit@02")  # credit@02 reads train@01's KL


# ------------------------------------------------------------------------------ TIS


def test_tis_corrects_a_batch_sampled_one_version_back():
    """Round r's batch sampled with checkpoint r-2 while train@r-1 trained: the trainer (on r-1)
    recomputes the old policy, TIS weights differ from 1, and none exceeds the cap."""
    from rollwise.policy.build import build_model, train_tokenizer

    tok = train_tokenizer(["the answer is paris"])
    torch.manual_seed(0)
    older = build_model(tok, TINY)
    g = torch.Generator().manual_seed(0)
    items = []
    for k, n in enumerate((9, 12, 10, 11)):
        ids = torch.randint(5, 900, (n,), generator=g).tolist()
        sign = 1.0 if k % 2 == 0 else -1.0
        items.append({"ids": ids, "mask": [0] * 4 + [1] * (n - 4),
                      "adv": [0.0] * 4 + [sign] * (n - 4), "logprobs": [0.0] * n})  # fmt: skip
    sampled = policy_logprobs(older, items, TrainConfig(), tok.pad_token_id, temperature=1.0)
    items = [{**it, "logprobs": lp} for it, lp in zip(items, sampled, strict=True)]
    newer = build_model(tok, TINY)  # round r-1: older trained one round
    newer.load_state_dict(older.state_dict())
    cfg = TrainConfig(lr=3e-2, epochs=2, minibatches=2)
    train_round(newer, items, cfg, make_optimizer(newer, cfg), tok.pad_token_id)

    cap = 1.05
    cfg = TrainConfig(lr=1e-3, epochs=1, minibatches=1, tis_cap=cap)
    stats = train_round(newer, items, cfg, make_optimizer(newer, cfg), tok.pad_token_id)
    assert math.isfinite(stats["tis_weight"])
    assert abs(stats["tis_weight"] - 1.0) > 1e-3  # the lag is seen and corrected
    assert stats["tis_weight"] <= cap + 1e-6  # a mean of weights that are each <= cap
    assert 0.0 < stats["tis_capped"] < 1.0  # some tokens capped, not all


def test_training_refuses_a_lagged_batch_without_tis():
    import pandas as pd

    from rollwise.loop import policy_lag

    episodes = pd.DataFrame({"episode_id": ["r02/t/s0", "bank/r01/t/s1"],
                             "policy_version": [0, 0]})  # fmt: skip
    assert policy_lag(episodes, "01", 2.0) == 1
    assert policy_lag(episodes.iloc[:0], "01", None) == 0
    with pytest.raises(ValueError, match=r"train\.tis_cap"):
        policy_lag(episodes, "01", None)
    banked_only_old = episodes.assign(policy_version=[1, 0])
    assert policy_lag(banked_only_old, "01", None) == 0  # replays keep their own versions


# ------------------------------------------------------------------------------ model cache


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    from rollwise.policy.build import build_model, save_policy, train_tokenizer

    tok = train_tokenizer(["the answer is paris"])
    folder = tmp_path / "models" / "round_01"
    save_policy(build_model(tok, TINY), tok, folder, {"round": 1})
    return folder


def test_a_trainer_never_gets_the_model_a_reader_holds(checkpoint: Path):
    from tasks import common

    common._LOADED.clear()
    reader, _ = common.load_checkpoint(checkpoint, "train@01")
    before = {k: v.clone() for k, v in reader.state_dict().items()}
    trainer, _ = common.load_checkpoint(checkpoint, "train@01", take=True, concurrent=True)
    assert trainer is not reader
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(1.0)  # training in place
    assert all(torch.equal(v, before[k]) for k, v in reader.state_dict().items())
    again, _ = common.load_checkpoint(checkpoint, "train@01")  # the slot was emptied
    assert again is not trainer
    # Stages one at a time (policy_lag 0): the reader is done; no second copy of the model.
    handed, _ = common.load_checkpoint(checkpoint, "train@01", take=True)
    assert handed is again
    common._LOADED.clear()


def test_a_model_nobody_holds_is_handed_over_without_a_copy(checkpoint: Path):
    from rollwise.policy.build import load_policy
    from tasks import common

    model, tok = load_policy(checkpoint)
    common.keep_checkpoint(checkpoint, model, tok)  # what train@r does after saving
    taken, _ = common.load_checkpoint(checkpoint, "train@01", take=True)
    assert taken is model
    assert common._LOADED == {}
    mine, _ = common.load_checkpoint(checkpoint, "rollout@02")  # a reader after the take
    assert mine is not taken
    common._LOADED.clear()


def test_concurrent_readers_and_a_trainer_never_share(checkpoint: Path):
    from rollwise.policy.build import load_policy
    from tasks import common

    model, tok = load_policy(checkpoint)
    common.keep_checkpoint(checkpoint, model, tok)
    got: dict[str, object] = {}
    barrier = threading.Barrier(3)

    def load(name: str, take: bool) -> None:
        barrier.wait()
        got[name] = common.load_checkpoint(checkpoint, "train@01", take=take, concurrent=True)[0]

    threads = [threading.Thread(target=load, args=(n, n == "trainer"))
               for n in ("trainer", "reader1", "reader2")]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got["trainer"] is not got["reader1"] and got["trainer"] is not got["reader2"]
    common._LOADED.clear()
