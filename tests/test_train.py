"""The PPO-clip loss by hand, and one RL round on synthetic items."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from rollwise.config import PolicyConfig, TrainConfig
from rollwise.train.loss import ppo_clip_loss, token_logprobs
from rollwise.train.trainer import (
    make_optimizer,
    token_advantages,
    train_round,
    training_batch,
)

CLIP_LOW, CLIP_HIGH = 0.2, 0.28


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(3, 6, generator=g) * 3  # [B, T]
    adv = torch.randn(3, 6, generator=g)  # [B, T]
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 0], [1, 0, 1, 0, 1, 1]]).float()
    return old, adv, mask


def loss_and_grad(logp_value, old, adv, mask, n_tokens=None):
    logp = logp_value.clone().requires_grad_(True)
    n = float(mask.sum()) if n_tokens is None else n_tokens
    loss, stats = ppo_clip_loss(logp, old, adv, mask, CLIP_LOW, CLIP_HIGH, n)
    loss.backward()
    return loss.detach(), logp.grad, stats


def test_ratio_one_is_minus_the_mean_advantage():
    old, adv, mask = batch()
    loss, grad, stats = loss_and_grad(old, old, adv, mask)
    expected = -(adv * mask).sum() / mask.sum()
    assert float(loss) == pytest.approx(float(expected), abs=1e-6)
    # d/dlogp of -ratio*A at ratio 1 is -A / n on masked tokens
    torch.testing.assert_close(grad, -adv * mask / mask.sum())
    assert stats["clip_frac"] == 0.0 and stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)


def test_loss_divides_by_the_given_token_count():
    old, adv, mask = batch()
    loss, _, _ = loss_and_grad(old, old, adv, mask, n_tokens=100.0)
    assert float(loss) == pytest.approx(float(-(adv * mask).sum() / 100.0), abs=1e-6)


def test_clip_high_zeroes_the_gradient_of_positive_advantages():
    old, _, mask = batch()
    adv = torch.ones_like(old)
    loss, grad, stats = loss_and_grad(old + math.log(1.5), old, adv, mask)
    assert torch.all(grad == 0)
    assert float(loss) == pytest.approx(-(1 + CLIP_HIGH), abs=1e-6)  # clipped at 1 + clip_high
    assert stats["clip_frac"] == pytest.approx(1.0)
    # the same ratio with a negative advantage is not clipped: the gradient flows
    _, grad, stats = loss_and_grad(old + math.log(1.5), old, -adv, mask)
    assert torch.all(grad[mask.bool()] > 0)


def test_clip_low_zeroes_the_gradient_of_negative_advantages():
    old, _, mask = batch()
    adv = -torch.ones_like(old)
    loss, grad, _ = loss_and_grad(old + math.log(0.5), old, adv, mask)
    assert torch.all(grad == 0)
    assert float(loss) == pytest.approx(1 - CLIP_LOW, abs=1e-6)
    _, grad, _ = loss_and_grad(old + math.log(0.5), old, -adv, mask)
    assert torch.all(grad[mask.bool()] < 0)


def test_within_the_clip_range_nothing_is_clipped():
    old, adv, mask = batch()
    _, grad, stats = loss_and_grad(old + math.log(1.1), old, adv, mask)
    assert stats["clip_frac"] == 0.0
    torch.testing.assert_close(grad, -1.1 * adv * mask / mask.sum())


def test_masked_tokens_contribute_nothing():
    old, adv, mask = batch()
    logp = old + 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(1))
    loss, grad, stats = loss_and_grad(logp, old, adv, mask)
    off = ~mask.bool()
    wild_logp, wild_adv = logp.clone(), adv.clone()
    wild_logp[off], wild_adv[off] = 5.0, 1e6
    loss2, grad2, stats2 = loss_and_grad(wild_logp, old, wild_adv, mask)
    assert float(loss2) == pytest.approx(float(loss), abs=1e-6)
    assert torch.all(grad2[off] == 0) and torch.all(grad[off] == 0)
    assert stats2 == pytest.approx(stats)


def test_token_logprobs_are_next_token_log_softmax():
    logits = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[1, 2, 3, 4, 5], [6, 0, 1, 2, 3]])
    logp, entropy = token_logprobs(logits, ids)
    assert logp.shape == entropy.shape == (2, 4)
    expected = torch.log_softmax(logits[0, 2], -1)[4]  # position 2 predicts ids[0, 3]
    assert float(logp[0, 2]) == pytest.approx(float(expected), abs=1e-6)
    assert torch.all(entropy > 0) and torch.all(entropy <= math.log(7) + 1e-6)


# ------------------------------------------------------------------------------ trainer

TINY = PolicyConfig(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, max_context=64)


@pytest.fixture
def model_and_pad():
    from rollwise.policy.build import build_model, train_tokenizer

    tok = train_tokenizer(["the answer is paris"])
    return build_model(tok, TINY), tok.pad_token_id


def synthetic_items(lengths: list[int], vocab: int = 900) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    items = []
    for k, n in enumerate(lengths):
        ids = torch.randint(5, vocab, (n,), generator=g).tolist()
        mask = [0] * 4 + [1] * (n - 4)
        sign = 1.0 if k % 2 == 0 else -1.0
        old = [0.0] + [-2.0] * (n - 1)  # the rollout's log-probs (PPO's old policy)
        items.append(
            {"ids": ids, "mask": mask, "adv": [0.0] * 4 + [sign] * (n - 4), "logprobs": old}
        )
    return items


def snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def run_round(model, pad, items, **overrides):
    cfg = TrainConfig(**{"lr": 1e-2, "epochs": 2, **overrides})
    before = snapshot(model)
    stats = train_round(model, items, cfg, make_optimizer(model, cfg), pad)
    changed = [k for k, v in snapshot(model).items() if not torch.equal(v, before[k])]
    return stats, changed


def test_train_round_updates_the_policy(model_and_pad):
    model, pad = model_and_pad
    stats, changed = run_round(model, pad, synthetic_items([10, 12, 9, 12]), micro_batch=8)
    assert changed, "no parameter moved"
    assert all(math.isfinite(v) for v in stats.values()), stats
    assert stats["episodes"] == 4 and stats["tokens"] == 6 + 8 + 5 + 8
    assert stats["grad_norm"] > 0 and stats["entropy"] > 0
    assert stats["optimizer_steps"] == 2 * 4  # epochs x minibatches
    assert not model.training  # left in eval mode


def test_train_round_with_several_micro_batches_of_uneven_length(model_and_pad):
    """Items longer in one micro-batch than in another: old log-probs must still line up."""
    model, pad = model_and_pad
    stats, changed = run_round(model, pad, synthetic_items([6, 6, 20, 20, 7, 15]), micro_batch=2)
    assert changed and all(math.isfinite(v) for v in stats.values()), stats


def test_micro_batching_does_not_change_the_first_step(model_and_pad):
    """One optimizer step per epoch over all items: the same update whatever the micro-batch."""
    from rollwise.policy.build import build_model, train_tokenizer

    tok = train_tokenizer(["the answer is paris"])
    items = synthetic_items([8, 8, 8, 8])  # equal lengths: no padding differences
    ends = []
    for micro in (4, 1):
        model = build_model(tok, TINY)
        run_round(model, tok.pad_token_id, items, micro_batch=micro, epochs=1, minibatches=1)
        ends.append(snapshot(model))
    for k in ends[0]:
        torch.testing.assert_close(ends[0][k], ends[1][k], atol=1e-5, rtol=1e-4)


def test_no_items_skips(model_and_pad):
    model, pad = model_and_pad
    stats, changed = run_round(model, pad, [], micro_batch=2)
    assert stats["skipped"] == 1.0 and not changed


# ------------------------------------------------------------------------------ batches

EPISODES = pd.DataFrame(
    {
        "episode_id": ["a", "b", "c"],
        "token_ids": [list(range(10)), list(range(8)), list(range(6))],
        "loss_mask": [
            [0, 0, 0, 1, 1, 0, 0, 1, 1, 1],
            [0, 0, 1, 1, 1, 0, 1, 1],
            [0, 0, 1, 1, 1, 1],
        ],
        "logprobs": [[-0.5] * 10, [-0.5] * 8, [-0.5] * 6],
    }
)
ADVANTAGES = pd.DataFrame(
    {
        "episode_id": ["a", "a", "b", "b", "c"],
        "step": [0, 1, 0, 1, 0],
        "advantage": [0.5, 0.5, 0.0, 0.0, -1.5],
        "span_start": [3, 7, 2, 6, 2],
        "span_end": [5, 10, 5, 8, 6],
    }
)


def test_token_advantages_fill_the_turn_spans():
    adv = token_advantages(EPISODES, ADVANTAGES)
    assert adv[0] == [0, 0, 0, 0.5, 0.5, 0, 0, 0.5, 0.5, 0.5]
    assert adv[1] == [0.0] * 8
    assert adv[2] == [0, 0, -1.5, -1.5, -1.5, -1.5]


def test_training_batch_excludes_all_zero_advantages():
    items = training_batch(EPISODES, ADVANTAGES)
    assert [it["ids"] for it in items] == [list(range(10)), list(range(6))]
    assert items[0]["mask"] == EPISODES["loss_mask"][0]
    assert items[1]["adv"] == [0, 0, -1.5, -1.5, -1.5, -1.5]


def test_training_batch_skips_episodes_without_turns():
    """An episode that never took a turn (prompt over max_context, failed reset kept with
    drop_env_errors: false) has no advantage rows, hence no signal: it is left out."""
    episodes = pd.concat(
        [
            EPISODES,
            pd.DataFrame(
                {
                    "episode_id": ["d"],
                    "token_ids": [[1, 2, 3]],
                    "loss_mask": [[0, 0, 0]],
                    "logprobs": [[0.0] * 3],
                }
            ),
        ],
        ignore_index=True,
    )
    items = training_batch(episodes, ADVANTAGES)
    assert [it["ids"] for it in items] == [list(range(10)), list(range(6))]


def test_sft_with_zero_steps_leaves_the_built_model(model_and_pad):
    from rollwise.config import WarmstartConfig
    from rollwise.train.sft import sft

    model, pad = model_and_pad
    before = snapshot(model)
    assert sft(model, [([1, 2, 3], [0, 1, 1])], WarmstartConfig(steps=0), pad) == []
    assert all(torch.equal(v, before[k]) for k, v in snapshot(model).items())
