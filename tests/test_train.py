"""The PPO-clip loss by hand, and one RL round on synthetic items."""

from __future__ import annotations

import copy
import math

import pandas as pd
import pytest
import torch

from rollwise.config import LoraConfig, PolicyConfig, TrainConfig
from rollwise.train.loss import (
    AGGREGATIONS,
    Norm,
    kl_k3,
    ppo_clip_loss,
    tis_weights,
    token_logprobs,
)
from rollwise.train.optim import apply_lrs, hidden_matrices, make_optimizer
from rollwise.train.prepare import autocast, prepare
from rollwise.train.trainer import (
    load_state,
    policy_logprobs,
    save_state,
    token_advantages,
    train_round,
    training_batch,
)
from tests.helpers import write_train_inputs

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
    norm = Norm(tokens=n, seqs=float(mask.shape[0]), horizon=float(mask.shape[1]))
    loss, stats = ppo_clip_loss(logp, old, adv, mask, CLIP_LOW, CLIP_HIGH, norm)
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


def test_sft_with_muon_steps_both_parts_and_fits_the_demo(model_and_pad):
    """warmstart.optimizer muon: Muon moves the hidden matrices, AdamW the embeddings and
    norms (both must step, or half the model never trains), and the loss falls."""
    from rollwise.config import WarmstartConfig
    from rollwise.train.sft import sft

    model, pad = model_and_pad
    before = snapshot(model)
    demo = ([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 1, 1])
    cfg = WarmstartConfig(steps=60, batch_size=1, optimizer="muon", muon_lr=0.05, lr=0.02)
    losses = sft(model, [demo], cfg, pad)
    after = snapshot(model)
    assert losses[-1] < 0.5 * losses[0]
    assert not torch.equal(
        after["model.layers.0.mlp.up_proj.weight"], before["model.layers.0.mlp.up_proj.weight"]
    )
    assert not torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])


# ------------------------------------------------------------------------------ aggregation

# Token losses of two sequences; 9.0 sits on masked-out positions and must never count.
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])  # [B, T]
AGG_MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])  # [B, T]
AGG_NORM = Norm(tokens=4.0, seqs=2.0, horizon=4.0)
BY_HAND = {
    "token-mean": (1 + 2 + 3 + 4) / 4,  # 2.5
    "seq-mean-token-mean": ((1 + 2 + 3) / 3 + 4 / 1) / 2,  # 3.0
    "seq-mean-token-sum": ((1 + 2 + 3) + 4) / 2,  # 5.0
    "seq-mean-token-sum-norm": ((1 + 2 + 3) / 4 + 4 / 4) / 2,  # 1.25
}


def test_every_aggregation_mode_has_a_hand_computed_case():
    assert set(BY_HAND) == set(AGGREGATIONS)
    assert len(set(BY_HAND.values())) == len(BY_HAND)  # the cases tell the modes apart


@pytest.mark.parametrize("agg", sorted(BY_HAND))
def test_aggregation_by_hand(agg):
    # at ratio 1 the PPO token loss is -A: advantages -PER_TOKEN give token losses PER_TOKEN
    old = torch.zeros_like(PER_TOKEN)
    loss, _ = ppo_clip_loss(old.clone(), old, -PER_TOKEN, AGG_MASK, 0.2, 0.28, AGG_NORM, agg)
    assert float(loss) == pytest.approx(BY_HAND[agg], abs=1e-6)


@pytest.mark.parametrize("agg", sorted(BY_HAND))
def test_aggregation_adds_up_over_micro_batches(agg):
    """Normalized by minibatch counts, the micro-batch losses sum to the whole batch's loss."""
    fn = AGGREGATIONS[agg]
    parts = fn(PER_TOKEN[:1], AGG_MASK[:1], AGG_NORM) + fn(PER_TOKEN[1:], AGG_MASK[1:], AGG_NORM)
    assert float(parts) == pytest.approx(BY_HAND[agg], abs=1e-6)


# ------------------------------------------------------------------------------ TIS


def test_kl_k3_by_hand_and_zero_at_the_reference():
    ref = torch.tensor([[-1.0, -2.0, -0.5]])  # [B, T]
    logp = torch.tensor([[-1.5, -2.0, -0.1]])  # [B, T]
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # [B, T] the third token is not the policy's
    norm = Norm(tokens=2.0, seqs=1.0, horizon=3.0)
    d = torch.tensor([0.5, 0.0])  # ref - logp on the two policy tokens
    want = float((torch.exp(d) - d - 1).sum() / 2)
    assert float(kl_k3(logp, ref, mask, norm, "token-mean")) == pytest.approx(want)
    assert float(kl_k3(ref, ref, mask, norm, "token-mean")) == 0.0


def test_kl_k3_is_bounded_for_a_token_the_policy_dropped():
    """Sampled under the old policy, a token the policy has since pushed down by 100 nats must
    not swamp the batch (or overflow exp): it counts at most KL_TOKEN_MAX, gradient finite."""
    ref = torch.tensor([[-1.0, -1.0]])  # [B, T]
    logp = torch.tensor([[-101.0, -1.2]], requires_grad=True)  # [B, T]
    mask = torch.ones(1, 2)  # [B, T]
    kl = kl_k3(logp, ref, mask, Norm(tokens=2.0, seqs=1.0, horizon=2.0), "token-mean")
    kl.backward()
    small = math.exp(0.2) - 0.2 - 1
    assert float(kl.detach()) == pytest.approx((10.0 + small) / 2)
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 1] != 0


def test_kl_coef_pulls_the_policy_back_to_the_reference(model_and_pad):
    """With zero advantages only the KL term moves the weights: toward the reference model."""
    import copy

    model, pad = model_and_pad
    ref = copy.deepcopy(model).eval()
    policy = copy.deepcopy(model)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    items = [{**it, "adv": [0.0] * len(it["adv"])} for it in synthetic_items([10, 12, 9, 12])]

    def kl_to_ref(m) -> float:
        ids = torch.tensor([it["ids"] for it in items if len(it["ids"]) == 12])  # [B, T]
        with torch.no_grad():
            lp = torch.log_softmax(m(input_ids=ids).logits, -1)  # [B, T, V]
            lr = torch.log_softmax(ref(input_ids=ids).logits, -1)  # [B, T, V]
        return float((lp.exp() * (lp - lr)).sum(-1).mean())

    before = kl_to_ref(policy)
    cfg = TrainConfig(lr=1e-2, epochs=8, kl_coef=1.0)
    stats = train_round(policy, items, cfg, make_optimizer(policy, cfg), pad, ref)
    assert stats["kl_ref"] > 0
    assert kl_to_ref(policy) < 0.9 * before, (before, kl_to_ref(policy))  # 0.78 here
    unanchored = snapshot(policy)
    cfg = TrainConfig(lr=1e-2, epochs=1, kl_coef=0.0)
    train_round(policy, items, cfg, make_optimizer(policy, cfg), pad, ref)
    assert all(torch.equal(v, unanchored[k]) for k, v in snapshot(policy).items())


def test_kl_coef_without_a_reference_is_refused(model_and_pad):
    """A bench or caller that forgets the anchor must not train silently without the KL term."""
    model, pad = model_and_pad
    cfg = TrainConfig(kl_coef=0.2)
    with pytest.raises(ValueError, match=r"train\.kl_coef"):
        train_round(model, synthetic_items([10]), cfg, make_optimizer(model, cfg), pad)


def test_tis_weights_are_the_capped_ratio_without_gradient():
    old = torch.log(torch.tensor([[0.5, 0.9, 0.6]])).requires_grad_(True)  # [1, 3] trainer
    rollout = torch.log(torch.tensor([[0.25, 0.9, 0.1]]))  # [1, 3] engine
    w = tis_weights(old, rollout, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 2.0]]))  # ratios 2, 1, 6 -> cap 2
    assert not w.requires_grad


def test_tis_weights_scale_each_token_loss_and_gradient():
    old, adv, mask = batch()
    weights = torch.rand(old.shape, generator=torch.Generator().manual_seed(3)) * 2  # [B, T]
    norm = Norm(tokens=float(mask.sum()), seqs=3.0, horizon=6.0)
    logp = old.clone().requires_grad_(True)
    loss, _ = ppo_clip_loss(logp, old, adv, mask, CLIP_LOW, CLIP_HIGH, norm, weights=weights)
    loss.backward()
    expected = -(weights * adv * mask).sum() / mask.sum()  # []
    assert float(loss.detach()) == pytest.approx(float(expected), abs=1e-6)
    torch.testing.assert_close(logp.grad, -weights * adv * mask / mask.sum())


# ------------------------------------------------------------------------------ trainer options


def fresh_model():
    from rollwise.policy.build import build_model, train_tokenizer

    tok = train_tokenizer(["the answer is paris"])
    return build_model(tok, TINY), tok.pad_token_id


@pytest.mark.parametrize("agg", sorted(BY_HAND))
def test_micro_batching_does_not_change_the_step_in_any_mode(agg):
    items = synthetic_items([8, 8, 8, 8])
    ends = []
    for micro in (4, 1):
        model, pad = fresh_model()
        run_round(model, pad, items, micro_batch=micro, epochs=1, minibatches=1, loss_agg=agg)
        ends.append(snapshot(model))
    for k in ends[0]:
        torch.testing.assert_close(ends[0][k], ends[1][k], atol=1e-5, rtol=1e-4)


def own_items(model, pad, shift: float = 0.0) -> list[dict]:
    """Items whose rollout log-probs are the model's own, minus `shift` (another engine)."""
    items = synthetic_items([9, 12, 10, 11])
    cfg = TrainConfig(micro_batch=64)
    own = policy_logprobs(model.train(), items, cfg, pad, temperature=1.0)
    return [{**it, "logprobs": [v - shift for v in lp]} for it, lp in zip(items, own, strict=True)]


def test_tis_with_matching_log_probs_changes_nothing():
    model, pad = fresh_model()
    items = own_items(model, pad)
    ends, stats = [], []
    for cap in (None, 2.0):
        model, pad = fresh_model()
        s, _ = run_round(model, pad, items, micro_batch=2, tis_cap=cap)
        ends.append(snapshot(model))
        stats.append(s)
    assert stats[1]["tis_weight"] == pytest.approx(1.0, abs=1e-4)
    assert "tis_weight" not in stats[0]
    for k in ends[0]:
        torch.testing.assert_close(ends[0][k], ends[1][k], atol=1e-5, rtol=1e-4)


def test_tis_caps_the_ratio_to_a_different_engine():
    model, pad = fresh_model()
    items = own_items(model, pad, shift=math.log(3.0))  # pi_train / pi_rollout = 3 everywhere
    stats, changed = run_round(
        model, pad, items, micro_batch=2, tis_cap=2.0, epochs=1, minibatches=1
    )
    assert changed
    assert stats["tis_weight"] == pytest.approx(2.0, abs=1e-4)
    assert stats["tis_capped"] == pytest.approx(1.0)
    # PPO's ratio is against the trainer's recomputed old policy, not the engine's: at the one
    # step it is 1 (nothing clipped) although the engine's ratio is 3
    assert stats["clip_frac"] == 0.0 and stats["approx_kl"] < 1e-6


def test_muon_gets_only_2d_hidden_weights():
    model, _ = fresh_model()
    opt = make_optimizer(model, TrainConfig(optimizer="muon", lr=1e-3, muon_lr=0.02))
    muon = [p for g in opt.parts["muon"].param_groups for p in g["params"]]
    adamw = [p for g in opt.parts["adamw"].param_groups for p in g["params"]]
    names = {id(p): n for n, p in model.named_parameters()}
    assert muon and all(p.ndim == 2 for p in muon)
    assert not any("embed" in names[id(p)] or "lm_head" in names[id(p)] for p in muon)
    assert any("embed" in names[id(p)] for p in adamw)
    assert any(p.ndim == 1 for p in adamw)  # norms (and biases)
    assert {id(p) for p in muon} | {id(p) for p in adamw} == {id(p) for p in model.parameters()}
    assert not {id(p) for p in muon} & {id(p) for p in adamw}
    assert [id(p) for p in muon] == [id(p) for p in hidden_matrices(model)[0]]
    for group in opt.param_groups:
        group["lr"] = 9.0
    apply_lrs(opt, TrainConfig(optimizer="muon", lr=1e-3, muon_lr=0.02))
    assert [g["lr"] for g in opt.parts["muon"].param_groups] == [0.02]
    assert [g["lr"] for g in opt.parts["adamw"].param_groups] == [1e-3]


def test_muon_round_moves_hidden_and_other_weights():
    model, pad = fresh_model()
    stats, changed = run_round(
        model, pad, synthetic_items([10, 12, 9, 12]), micro_batch=2, optimizer="muon"
    )
    assert all(math.isfinite(v) for v in stats.values()), stats
    assert any("mlp" in k for k in changed) and any("embed" in k for k in changed)


# ------------------------------------------------------------------------------ resume


class Crash(Exception):
    pass


def prepared_model(cfg: TrainConfig):
    """A fresh model as the train stage steps it (LoRA adapters drawn from a fixed seed)."""
    model, pad = fresh_model()
    torch.manual_seed(0)
    return prepare(model, cfg, torch.device("cpu")), pad


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"optimizer": "muon", "tis_cap": 2.0, "loss_agg": "seq-mean-token-sum-norm"},
        {"lora": LoraConfig(rank=4, alpha=8.0)},
    ],
)
def test_a_round_resumed_after_a_crash_ends_with_the_same_weights(tmp_path, opts):
    cfg = TrainConfig(lr=1e-2, muon_lr=0.02, epochs=2, minibatches=2, micro_batch=2, **opts)
    model, pad = fresh_model()
    items = own_items(model, pad, shift=0.3)
    model, pad = prepared_model(cfg)
    train_round(model, items, cfg, make_optimizer(model, cfg), pad)
    uninterrupted = snapshot(model)

    model, pad = prepared_model(cfg)
    optimizer = make_optimizer(model, cfg)

    def checkpoint_then_crash(done: int, used: list[dict]) -> None:
        torch.save(model.state_dict(), tmp_path / "weights.pt")
        save_state(tmp_path, optimizer, 10 + done, done, [it.get("old") for it in used])
        if done == 2:
            raise Crash

    with pytest.raises(Crash):
        train_round(model, items, cfg, optimizer, pad, on_step=checkpoint_then_crash)

    model, pad = prepared_model(cfg)  # a new process: fresh model and optimizer
    model.load_state_dict(torch.load(tmp_path / "weights.pt"))
    optimizer = make_optimizer(model, cfg)
    state = load_state(tmp_path, optimizer)
    assert (state.step, state.round_step) == (12, 2)
    if cfg.tis_cap is not None:
        items = [{**it, "old": old} for it, old in zip(items, state.old_logprobs, strict=True)]
    stats = train_round(model, items, cfg, optimizer, pad, start=state.round_step)
    assert stats["optimizer_steps"] == 2
    for k, v in snapshot(model).items():
        assert torch.equal(v, uninterrupted[k]), k


def test_resuming_with_tis_needs_the_pre_round_old_log_probs():
    model, pad = fresh_model()
    cfg = TrainConfig(tis_cap=2.0)
    with pytest.raises(ValueError, match="old log-probs"):
        train_round(model, synthetic_items([8, 8]), cfg, make_optimizer(model, cfg), pad, start=1)


def test_state_restores_every_rng(tmp_path):
    import random

    import numpy as np

    model, _ = fresh_model()
    optimizer = make_optimizer(model, TrainConfig())
    save_state(tmp_path, optimizer, 3)
    draws = (torch.rand(3), random.random(), np.random.rand())
    load_state(tmp_path, optimizer)
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(draws[0], again[0]) and draws[1:] == again[1:]


def test_state_refuses_another_optimizer_kind(tmp_path):
    model, _ = fresh_model()
    save_state(tmp_path, make_optimizer(model, TrainConfig()), 1)
    with pytest.raises(ValueError, match="train.optimizer"):
        load_state(tmp_path, make_optimizer(model, TrainConfig(optimizer="muon")))


# ------------------------------------------------------------------------------ NaN guard


def test_a_non_finite_step_is_skipped_and_logged(caplog):
    model, pad = fresh_model()
    items = synthetic_items([8, 9, 10, 11])
    items[2] = {**items[2], "logprobs": [float("nan")] * 10}  # a broken engine's log-probs
    with caplog.at_level("WARNING"):
        stats, changed = run_round(model, pad, items, epochs=1, minibatches=4)
    assert stats["nonfinite_steps"] == 1 and stats["optimizer_steps"] == 3
    assert changed and all(math.isfinite(v) for v in stats.values()), stats
    assert "non-finite" in caplog.text
    assert all(torch.isfinite(v).all() for v in snapshot(model).values())


def test_non_finite_steps_in_a_row_abort_with_a_clear_error():
    model, pad = fresh_model()
    items = [{**it, "logprobs": [float("nan")] * len(it["ids"])} for it in synthetic_items([8] * 4)]
    before = snapshot(model)
    with pytest.raises(FloatingPointError, match="train.max_nonfinite_steps: 2"):
        run_round(model, pad, items, epochs=1, minibatches=4, max_nonfinite_steps=2)
    assert all(torch.equal(v, before[k]) for k, v in snapshot(model).items())


# ------------------------------------------------------------------------------ DDP


def ddp_worker(rank: int, folder: str, opts: dict, model, pad: int) -> None:
    """One gloo rank of a 2-process run, forked with the model already built (no second import of
    torch and transformers; the tokenizers library stalls when trained after a fork)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/rdv", rank=rank, world_size=2)
    cfg = TrainConfig(**opts)
    stats = train_round(model, synthetic_items([8] * 6), cfg, make_optimizer(model, cfg), pad)
    if rank == 0:
        torch.save((model.state_dict(), stats), f"{folder}/rank0.pt")
    dist.destroy_process_group()


def test_ddp_on_two_gloo_processes_matches_one_process(tmp_path):
    """Each rank trains on its half of every chunk; summed gradients give the one-process step."""
    import torch.multiprocessing as mp

    opts = {"lr": 1e-2, "epochs": 2, "minibatches": 2, "micro_batch": 2}
    model, pad = fresh_model()
    args = (str(tmp_path), opts, model, pad)
    mp.start_processes(ddp_worker, args=args, nprocs=2, start_method="fork")
    ddp_weights, ddp_stats = torch.load(tmp_path / "rank0.pt")
    assert any(not torch.equal(v, ddp_weights[k]) for k, v in snapshot(model).items())

    cfg = TrainConfig(**opts)
    stats = train_round(model, synthetic_items([8] * 6), cfg, make_optimizer(model, cfg), pad)
    for k, v in snapshot(model).items():
        torch.testing.assert_close(ddp_weights[k], v, atol=1e-5, rtol=1e-4)
    assert ddp_stats["loss"] == pytest.approx(stats["loss"], abs=1e-5)
    assert ddp_stats["tokens"] == stats["tokens"]


# ------------------------------------------------------------------------------ GPU switches


def test_gradient_checkpointing_gives_the_same_round():
    """Recomputing activations in backward changes memory, not the update (any device)."""
    items = synthetic_items([9, 12, 10, 11])
    ends, stats = [], []
    for checkpointing in (False, True):
        model, pad = prepared_model(TrainConfig(gradient_checkpointing=checkpointing))
        assert model.is_activation_checkpointing == checkpointing
        s, _ = run_round(model, pad, items, micro_batch=2, gradient_checkpointing=checkpointing)
        ends.append(snapshot(model))
        stats.append(s)
    assert stats[1]["loss"] == pytest.approx(stats[0]["loss"], abs=1e-6)
    for k in ends[0]:
        torch.testing.assert_close(ends[1][k], ends[0][k], atol=1e-6, rtol=1e-5)


def test_bf16_without_cuda_warns_and_trains_in_float32(caplog):
    import warnings

    cfg = TrainConfig(bf16=True)
    with caplog.at_level("WARNING"):
        model, pad = prepared_model(cfg)
    assert "train.bf16 needs CUDA" in caplog.text
    assert next(model.parameters()).dtype == torch.float32
    items = synthetic_items([9, 12, 10, 11])
    s_bf16, _ = run_round(model, pad, items, micro_batch=2, bf16=True)
    model, pad = prepared_model(TrainConfig())
    s_fp32, _ = run_round(model, pad, items, micro_batch=2)
    assert s_bf16 == s_fp32  # the CPU run is exactly the float32 one
    with warnings.catch_warnings():  # torch warns that CUDA is absent here
        warnings.simplefilter("ignore")
        on_gpu = autocast(cfg, torch.device("cuda"))
    assert isinstance(on_gpu, torch.autocast) and on_gpu.fast_dtype == torch.bfloat16
    assert not isinstance(autocast(TrainConfig(), torch.device("cuda")), torch.autocast)


# ------------------------------------------------------------------------------ torchrun


def stage_root(root, items: list[dict]) -> None:
    """A project folder holding what train@01 reads: the round-00 policy, round 01's episodes,
    curator decisions and advantages (the items' token advantages, one turn per episode)."""
    from rollwise.policy.build import build_model, save_policy, train_tokenizer

    tok = train_tokenizer(["the answer is paris"])
    save_policy(build_model(tok, TINY), tok, root / "models" / "round_00")
    write_train_inputs(root, "01", items)


def test_torchrun_launch_with_two_gloo_ranks_matches_one_process(tmp_path):
    """train.world_size 2: the stage relaunches itself under torchrun, rank 0 writes the
    checkpoint; it matches the one-process stage's within float tolerance."""
    from safetensors.torch import load_file

    from rollwise.config import Params
    from tasks import train as stage

    train = {"lr": 1e-2, "epochs": 2, "minibatches": 2, "micro_batch": 2}
    checkpoints, metrics = [], []
    for world_size in (1, 2):
        root = tmp_path / f"ws{world_size}"
        stage_root(root, synthetic_items([8, 9, 10, 11, 12, 8]))
        params = Params(train={**train, "world_size": world_size})
        metrics.append(stage.run(params, root, "01"))
        folder = root / "models" / "round_01"
        checkpoints.append(load_file(folder / "model.safetensors"))
        assert torch.load(folder / "trainer_state.pt", weights_only=False)["step"] == 4
    start = load_file(tmp_path / "ws1" / "models" / "round_00" / "model.safetensors")
    assert any(not torch.equal(start[k], v) for k, v in checkpoints[1].items())
    assert checkpoints[0].keys() == checkpoints[1].keys()
    for k, v in checkpoints[0].items():
        torch.testing.assert_close(checkpoints[1][k], v, atol=1e-5, rtol=1e-4)
    assert metrics[1]["loss"] == pytest.approx(metrics[0]["loss"], abs=1e-5)
    assert metrics[1]["tokens"] == metrics[0]["tokens"]
    assert (metrics[0]["world_size"], metrics[1]["world_size"]) == (1, 2)  # two ranks ran


def test_masked_nll_equals_the_full_logits_loss(model_and_pad):
    from rollwise.train.sft import masked_nll, pad_batch

    model, pad = model_and_pad
    seqs = [([5, 6, 7, 8, 9], [0, 0, 1, 1, 1]), ([5, 6, 7], [0, 1, 1])]
    ids, attn, loss_mask = pad_batch(seqs, pad)  # [2, 5] each
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]  # [2, 4, V]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    full = (nll * loss_mask[:, 1:]).sum() / loss_mask[:, 1:].sum()  # []
    assert torch.allclose(masked_nll(model, ids, attn, loss_mask), full, atol=1e-6)


def test_lr_warmup_is_linear_over_the_runs_first_steps(model_and_pad):
    model, pad = model_and_pad
    cfg = TrainConfig(lr=1e-3, warmup_steps=4)
    opt = make_optimizer(model, cfg)
    lrs = []
    for step in range(6):
        apply_lrs(opt, cfg, step)
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    apply_lrs(opt, cfg)  # no step: the params' lr as it is
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3)
    cfg = TrainConfig(lr=1e-3, warmup_steps=100, epochs=1, minibatches=2)
    train_round(model, synthetic_items([8, 8, 8, 8]), cfg, opt, pad, steps_before=10)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * 12 / 100)  # step 11 of the run
    train_round(model, synthetic_items([8, 8, 8, 8]), cfg, opt, pad)  # run's steps unknown
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3)  # no warmup


@pytest.mark.parametrize("model_type", ["qwen2", "gemma2"])  # the head on policy tokens / on all
def test_masked_logprobs_equal_the_full_logits_ones_on_policy_tokens(model_and_pad, model_type):
    from rollwise.train.trainer import masked_logprobs, tensors

    model, pad = model_and_pad
    ids, attn, mask, *_ = tensors(synthetic_items([9, 12, 10]), pad)  # [B, T] / [B, T-1]
    logits = model(input_ids=ids, attention_mask=attn).logits / 0.7  # [B, T, V]
    want, want_entropy = token_logprobs(logits, ids)  # [B, T-1] each
    real = model.config.model_type
    model.config.model_type = model_type
    try:
        logp, entropy = masked_logprobs(model, ids, attn, mask, TrainConfig(), temperature=0.7)
    finally:
        model.config.model_type = real
    where = mask.bool()
    torch.testing.assert_close(logp[where], want[where], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy[where], want_entropy[where], atol=1e-5, rtol=1e-5)
    assert not logp[~where].any() and not entropy[~where].any()


def test_adam_eps_damps_the_step_of_weights_with_tiny_gradients():
    """At torch's eps a weight whose gradient is 1e-6 moves as far as one whose gradient is 1
    (Adam's step is about lr either way); with train.adam_eps above 1e-6 it barely moves."""
    moved = {}
    for eps in (1e-8, 1e-4):
        model = torch.nn.Linear(2, 1, bias=False)
        torch.nn.init.zeros_(model.weight)
        opt = make_optimizer(model, TrainConfig(lr=1e-3, adam_eps=eps))
        assert [g["eps"] for g in opt.param_groups] == [eps]
        model.weight.grad = torch.tensor([[1.0, 1e-6]])
        opt.step()
        moved[eps] = model.weight.detach().abs()[0]
    assert moved[1e-8][1] > 0.5 * moved[1e-8][0]  # the tiny gradient took about a full step
    assert moved[1e-4][1] < 0.05 * moved[1e-4][0]  # damped: it moves ~1% of the big one's step
    muon = make_optimizer(fresh_model()[0], TrainConfig(optimizer="muon", adam_eps=1e-4))
    assert [g["eps"] for g in muon.parts["adamw"].param_groups] == [1e-4]


def test_balanced_draw_gives_every_kind_its_turn_whatever_the_mix():
    """warmstart.balance_kinds: 90 demos of one kind and 10 of another are drawn 50/50, every
    pass over the kinds names each once, and the draw is seeded."""
    import random

    from rollwise.train.sft import balanced_draw

    strata = ["amount"] * 90 + ["count"] * 10
    picks = balanced_draw(strata, random.Random(0))(100)
    kinds = [strata[i] for i in picks]
    assert kinds.count("count") == kinds.count("amount") == 50
    assert all(set(kinds[k : k + 2]) == {"amount", "count"} for k in range(0, 100, 2))
    assert picks == balanced_draw(strata, random.Random(0))(100)
    assert len({i for i in picks if strata[i] == "count"}) > 5  # members drawn at random


def test_a_shared_prompt_runs_once_with_the_same_logprobs_and_gradients(model_and_pad):
    """micro_batches groups a minibatch by prompt; masked_logprobs then runs the group's prompt
    once and repeats its keys and values: the log-probs, entropies and gradients are those of
    one full pass per row."""
    from rollwise.train.trainer import masked_logprobs, micro_batches, tensors

    model, pad = model_and_pad
    items = synthetic_items([9, 12, 10, 7, 11])
    for it in items[:3]:
        it["ids"][:4] = [7, 8, 9, 10]  # one task's prompt (mask 0 on its 4 tokens)
    pieces = micro_batches(items, size=2)
    assert [(len(p), prefix) for p, prefix in pieces] == [(2, 4), (1, 0), (1, 0), (1, 0)]
    assert [it["ids"][0] for it in pieces[0][0]] == [7, 7] and pieces[1][0][0] is items[2]
    silent = {**items[0], "mask": [0] * len(items[0]["mask"])}  # no policy token: shares nothing
    assert [prefix for _, prefix in micro_batches([silent, items[0], items[1]], 4)] == [0, 4]
    ids, attn, mask, *_ = tensors(items[:3], pad)  # [B, T] / [B, T-1]
    runs = []
    for prefix in (0, 4):
        model.zero_grad()
        logp, entropy = masked_logprobs(model, ids, attn, mask, TrainConfig(), 0.7, prefix)
        (logp.sum() + entropy.sum()).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        runs.append((logp.detach(), entropy.detach(), grads))
    (lp0, e0, g0), (lp1, e1, g1) = runs
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(e1, e0, atol=1e-5, rtol=1e-5)
    assert len(g0) == len(g1) > 0
    for a, b in zip(g0, g1, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_max_kl_shrinks_a_round_into_its_trust_region(model_and_pad):
    """A round whose KL from its old policy exceeds train.max_kl is moved back along its own
    update until the KL measured afterwards fits; a generous max_kl keeps the full update."""
    from rollwise.policy.build import build_model, train_tokenizer
    from rollwise.train.trainer import round_kl

    tok = train_tokenizer(["the answer is paris"])
    items = synthetic_items([10, 12, 9, 12])
    base = build_model(tok, TINY)
    olds = policy_logprobs(base, items, TrainConfig(), tok.pad_token_id, 1.0)
    items = [{**it, "logprobs": old} for it, old in zip(items, olds, strict=True)]  # on-policy
    full_model = copy.deepcopy(base)
    full, _ = run_round(full_model, tok.pad_token_id, items, lr=3e-3, max_kl=10.0)
    assert full["trust_scale"] == 1.0 and full["round_kl"] == full["round_kl_full"] > 1e-4
    assert full["round_kl"] == pytest.approx(round_kl(full_model, items, TrainConfig(), 0, 1.0))

    small = copy.deepcopy(base)
    limit = full["round_kl_full"] / 20
    shrunk, changed = run_round(small, tok.pad_token_id, items, lr=3e-3, max_kl=limit)
    assert shrunk["round_kl_full"] == pytest.approx(full["round_kl_full"], rel=1e-5)
    assert 0 < shrunk["trust_scale"] < 1 and changed
    assert shrunk["round_kl"] <= limit
    assert round_kl(small, items, TrainConfig(), tok.pad_token_id, 1.0) == pytest.approx(
        shrunk["round_kl"], rel=1e-5
    )
    start = dict(base.named_parameters())  # the weights sit on the segment start -> full update
    ends = dict(full_model.named_parameters())
    for name, p in small.named_parameters():
        expected = start[name] + shrunk["trust_scale"] * (ends[name] - start[name])
        torch.testing.assert_close(p, expected, atol=1e-6, rtol=1e-5)

    with pytest.raises(ValueError, match="max_kl"):
        train_round(base, items, TrainConfig(max_kl=1.0), make_optimizer(base, TrainConfig()),
                    tok.pad_token_id, start=1)  # fmt: skip


def test_max_kl_expand_stretches_a_round_toward_its_boundary(model_and_pad):
    """With train.max_kl_expand, a round whose KL is inside the region moves further along its
    own update (scale > 1, at most the factor), the KL measured there still inside; a tight cap
    keeps the stretch at that factor."""
    from rollwise.policy.build import build_model, train_tokenizer
    from rollwise.train.trainer import round_kl

    tok = train_tokenizer(["the answer is paris"])
    items = synthetic_items([10, 12, 9, 12])
    base = build_model(tok, TINY)
    olds = policy_logprobs(base, items, TrainConfig(), tok.pad_token_id, 1.0)
    items = [{**it, "logprobs": old} for it, old in zip(items, olds, strict=True)]
    full_model = copy.deepcopy(base)
    full, _ = run_round(full_model, tok.pad_token_id, items, lr=3e-4, max_kl=10.0)
    limit = full["round_kl_full"] * 4

    stretched = copy.deepcopy(base)
    out, _ = run_round(stretched, tok.pad_token_id, items, lr=3e-4, max_kl=limit, max_kl_expand=5)
    assert 1.0 < out["trust_scale"] <= 5 and full["round_kl_full"] < out["round_kl"] <= limit
    assert round_kl(stretched, items, TrainConfig(), tok.pad_token_id, 1.0) == pytest.approx(
        out["round_kl"], rel=1e-5
    )
    start, ends = dict(base.named_parameters()), dict(full_model.named_parameters())
    for name, p in stretched.named_parameters():
        expected = start[name] + out["trust_scale"] * (ends[name] - start[name])
        torch.testing.assert_close(p, expected, atol=1e-6, rtol=1e-5)

    capped = copy.deepcopy(base)
    out, _ = run_round(capped, tok.pad_token_id, items, lr=3e-4, max_kl=limit, max_kl_expand=1.5)
    assert out["trust_scale"] == 1.5 and out["round_kl"] <= limit
