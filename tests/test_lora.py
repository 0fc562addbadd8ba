"""LoRA through peft: only adapter weights train, and the saved checkpoint is a plain HF folder
with the adapters merged in."""

from __future__ import annotations

import pytest
import torch

from rollwise.config import LoraConfig, Params, TrainConfig
from rollwise.policy.build import load_policy, save_policy
from rollwise.train.optim import make_optimizer
from rollwise.train.prepare import export, prepare
from tests.test_train import fresh_model, prepared_model, synthetic_items

LORA = TrainConfig(lr=1e-2, epochs=1, minibatches=1, micro_batch=4,
                   lora=LoraConfig(rank=4, alpha=8.0))  # fmt: skip


def split(model) -> tuple[dict, dict]:
    """(adapter weights, base weights) of a peft model, cloned."""
    named = {k: v.detach().clone() for k, v in model.named_parameters()}
    adapters = {k: v for k, v in named.items() if "lora_" in k}
    return adapters, {k: v for k, v in named.items() if "lora_" not in k}


def one_step(model, pad):
    from rollwise.train.trainer import train_round

    return train_round(model, synthetic_items([9, 12, 10, 11]), LORA, make_optimizer(model, LORA),
                       pad)  # fmt: skip


def test_lora_trains_only_the_adapter_weights():
    model, pad = prepared_model(LORA)
    trainable = {k for k, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in k for k in trainable)
    adapters, base = split(model)
    assert len(adapters) == 2 * 7  # A and B on q, k, v, o, gate, up, down of the one layer
    stats = one_step(model, pad)
    assert stats["optimizer_steps"] == 1
    adapters_after, base_after = split(model)
    assert all(torch.equal(v, base_after[k]) for k, v in base.items())  # bit-identical
    moved = [k for k, v in adapters.items() if not torch.equal(v, adapters_after[k])]
    assert any("lora_B" in k for k in moved)  # B starts at zero: the update leaves zero


def _tokenizer():
    from rollwise.policy.build import train_tokenizer

    return train_tokenizer(["the answer is paris"])


def test_merged_checkpoint_is_a_plain_folder_that_reloads_changed(tmp_path):
    model, pad = fresh_model()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    model = prepare(model, LORA, torch.device("cpu"))
    one_step(model, pad)
    ids = torch.tensor([synthetic_items([10])[0]["ids"]])  # [1, T]
    with torch.no_grad():
        adapted = model(input_ids=ids).logits  # [1, T, V]
    merged = export(model)
    assert not any("lora" in k for k in merged.state_dict())
    save_policy(merged, _tokenizer(), tmp_path)
    assert not (tmp_path / "adapter_config.json").exists()
    reloaded, _ = load_policy(tmp_path)
    weights = reloaded.state_dict()
    assert weights.keys() == start.keys()
    assert any(not torch.equal(weights[k], v) for k, v in start.items())
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, adapted, atol=1e-5, rtol=1e-4)


def test_lora_params_are_validated_by_name():
    p = Params(train={"lora": {"rank": 2, "target_modules": ["q_proj", "v_proj"]}})
    assert p.train.lora.rank == 2 and p.train.lora.alpha == 16.0
    assert Params().train.lora is None  # default: full fine-tune
    with pytest.raises(ValueError, match="rank"):
        Params(train={"lora": {"rank": 0}})
    with pytest.raises(ValueError, match="ranks"):
        Params(train={"lora": {"ranks": 4}})


def test_the_train_stage_saves_a_merged_plain_checkpoint(tmp_path):
    """train@01 with train.lora: models/round_01 holds the base model's tensors, changed, and no
    adapter files; its trainer state counts the steps (no adapter moments carry to round 02)."""
    from safetensors.torch import load_file

    from tasks import train as stage
    from tests.test_train import stage_root

    stage_root(tmp_path, synthetic_items([8, 9, 10, 11]))
    params = Params(train={"lr": 1e-2, "minibatches": 2, "lora": {"rank": 4}})
    metrics = stage.run(params, tmp_path, "01")
    assert metrics["optimizer_steps"] == 4
    start = load_file(tmp_path / "models" / "round_00" / "model.safetensors")
    folder = tmp_path / "models" / "round_01"
    saved = load_file(folder / "model.safetensors")
    assert saved.keys() == start.keys() and not list(folder.glob("adapter*"))
    changed = {k for k, v in saved.items() if not torch.equal(v, start[k])}
    assert any("proj" in k for k in changed) and not any("embed" in k for k in changed)
    assert torch.load(folder / "trainer_state.pt", weights_only=False)["step"] == 4
    load_policy(folder)  # rollout and evaluate load it as any HF folder


def test_a_model_above_lora_above_m_trains_lora_by_default():
    from rollwise.train.prepare import is_lora, lora_for

    model, _ = fresh_model()
    n = sum(p.numel() for p in model.parameters())
    assert lora_for(model, TrainConfig()) is None  # the tiny model: below 50M, full fine-tune
    small_threshold = TrainConfig(lora_above_m=n / 2e6)  # as if it were a real model
    assert lora_for(model, small_threshold) == LoraConfig()  # peft defaults from params
    assert lora_for(model, TrainConfig(lora_above_m=None)) is None  # full fine-tune kept
    assert lora_for(model, TrainConfig(lora_above_m=n / 2e6, lora=LORA.lora)) == LORA.lora
    assert is_lora(prepare(model, small_threshold))
    assert not is_lora(prepare(fresh_model()[0], TrainConfig()))
