"""params.yaml's sections for learning and choosing: credit assignment, training and
evaluation."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from rollwise.config.base import SEED, Section


class GiGPOConfig(Section):
    """GiGPO's knobs (verl-agent names); ConCal reuses them, replacing only the step returns.
    Source: Feng et al. 2025, Group-in-Group Policy Optimization for LLM Agent Training."""

    gamma: float = Field(0.95, ge=0, le=1, description="Discount of the per-turn returns.")
    omega: float = Field(1.0, ge=0, description="Weight of the anchor-state (step) advantage.")
    norm: Literal["mean_std_norm", "mean_norm"] = Field(
        "mean_norm", description="Normalization at both levels: mean_norm or mean_std_norm."
    )


class ConCalConfig(Section):
    """ConCal: GiGPO with continuation values calibrated across visits that share a transition;
    rollwise's design (design.md §4, docs/credit.md)."""

    pool_cap: float = Field(
        0.75, ge=0, le=1, description="Most of a visit's value a shared-transition pool replaces."
    )
    episode_term: Literal["outcome", "calibrated"] = Field(
        "calibrated",
        description="A^E from each turn's calibrated outcome, or outcome: the episode's reward.",
    )


class IAPOConfig(Section):
    """IAPO: the episode's advantage routed over a typed graph of which action used which
    observation; rollwise's design (design.md §4)."""

    floor: float = Field(
        0.25, ge=0, le=1, description="Routing weight of turns off the support / failure route."
    )


class CosirConfig(Section):
    """CoSIR (credit/cosir.py): a team message's advantage adds weight x its surprisal drop."""

    weight: float = Field(
        1.0, ge=0, description="Advantage per bit of surprisal of the correct decision removed."
    )


class SpoCreditConfig(Section):
    """The per-task Beta tracker of spo and spo_pp (data/advantages/round_NN/credit_state.json).
    Source: Single-stream Policy Optimization (SPO), 2025."""

    prior_p: float = Field(0.5, gt=0, lt=1, description="Success estimate of a task never seen.")
    prior_n: float = Field(2.0, gt=0, description="Pseudo-count behind that prior.")
    rho_min: float = Field(
        0.875, gt=0, le=1, description="Decay clip, low end; rho = 2^(-KL / d_half)."
    )
    rho_max: float = Field(0.96, gt=0, le=1, description="Decay clip, high end.")
    d_half: float = Field(
        0.02, gt=0, description="Policy KL (train's approx_kl, summed) at which old evidence "
        "counts half.",
    )  # fmt: skip

    @field_validator("rho_max")
    @classmethod
    def ordered(cls, v: float, info) -> float:
        if v < info.data.get("rho_min", 0.0):
            raise ValueError("rho_max must be >= rho_min")
        return v


BaseEstimator = Literal["grpo", "rloo", "gigpo", "concal", "iapo", "spo", "spo_pp"]


class OPDConfig(Section):
    """opd / opdvr (credit/opd.py): the teacher's per-token log-ratio on the student's sampled
    tokens, added to `base`'s advantages with no mixing weight."""

    teacher: str | None = Field(
        None, description="A policy folder (a stronger checkpoint, same tokenizer)."
    )
    base: BaseEstimator = Field(
        "grpo", description="The estimator whose advantages the token term joins."
    )


class FactsConfig(Section):
    """farca (credit/facts.py): a check of each value the policy asserts, on that value's tokens,
    weighted by its reliability (counterfactual evidence attribution)."""

    base: BaseEstimator | Literal["opd", "opdvr"] = Field(
        "grpo", description="The estimator the fact term joins (opd and opdvr included)."
    )
    coef: float = Field(
        0.5, ge=0, description="Per-token signal of a fully reliable judgment (+ supported, - not)."
    )
    weighted: bool = Field(
        True, description="False: every judgment counts fully (the unweighted baseline)."
    )
    trials: int = Field(4, ge=1, description="Re-checks per side of the counterfactual.")
    flip_rate: float = Field(
        0.0, ge=0, le=0.5, description="Noisy checker: each check's verdict flips this often."
    )
    seed: int = Field(0, description="The noisy checker's seed.")


class CreditConfig(Section):
    """Credit assignment (credit/): one estimator per method, one signature."""

    method: Literal[
        "grpo",
        "rloo",
        "gigpo",
        "concal",
        "iapo",
        "spo",
        "spo_pp",
        "raft",
        "opd",
        "opdvr",
        "farca",
        "cosir",
    ] = Field(
        "grpo",
        description="grpo (Shao et al. 2024, DeepSeekMath), rloo (Ahmadian et al. 2024, Back to "
        "Basics), gigpo (Feng et al. 2025), concal, iapo, spo (Single-stream Policy "
        "Optimization, 2025) or spo_pp; concal, iapo and spo_pp are rollwise's designs. raft "
        "(Dong et al. 2023: advantage 1 on verified successes, 0 else: fine-tuning on the "
        "round's own successes). opd "
        "(on-policy distillation: the teacher's per-token log-ratio), opdvr (the same gated by "
        "the episode's verified success: OPDVR), farca (per-value fact checks weighted by their "
        "reliability: FARCA) add token terms to a base estimator; cosir scores team messages "
        "by the surprisal they remove (CoSIR).",
    )
    reward: Literal["rubric", "success"] = Field(
        "rubric",
        description="What the estimator sees as the reward: rubric (the verifier's weighted "
        "partial credit) or success.",
    )
    std_norm: bool = Field(
        True,
        description="grpo, iapo: divide by the group's std; false gives Dr.GRPO's unscaled "
        "advantages (Liu et al. 2025, Understanding R1-Zero-Like Training).",
    )
    eps: float = Field(1e-6, gt=0, description="Added to the std.")
    gigpo: GiGPOConfig = Field(GiGPOConfig(), description="gigpo and concal.")
    concal: ConCalConfig = Field(ConCalConfig(), description="concal.")
    iapo: IAPOConfig = Field(IAPOConfig(), description="iapo.")
    spo: SpoCreditConfig = Field(SpoCreditConfig(), description="spo and spo_pp.")
    cosir: CosirConfig = Field(CosirConfig(), description="cosir (team episodes only).")
    opd: OPDConfig = Field(OPDConfig(), description="opd and opdvr (and farca over them).")
    facts: FactsConfig = Field(FactsConfig(), description="farca.")


class LoraConfig(Section):
    """LoRA adapters through peft (train/prepare.py); merged into the weights at every checkpoint,
    so models/round_NN stays a plain HF folder. Source: Hu et al. 2021, LoRA: Low-Rank
    Adaptation of Large Language Models."""

    rank: int = Field(8, ge=1, description="Adapter rank.")
    alpha: float = Field(16.0, gt=0, description="The update is scaled by alpha / rank.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input.")
    target_modules: str | list[str] = Field(
        "all-linear", description="peft's target_modules; all-linear: every linear but the head."
    )


class GuardConfig(Section):
    """Collapse guard (train/guard.py): undo a round whose update lowered greedy success on
    `tasks` validation tasks by more than `max_drop` below its reference (round_NN is then its
    start)."""

    tasks: int = Field(0, ge=0, description="Validation tasks; 0: the guard is off.")
    max_drop: float = Field(
        0.05, ge=0, le=1, description="Largest drop in success allowed (a share: 0.05 is 5 points)."
    )
    against: Literal["start", "best"] = Field(
        "best",
        description="best: below the best checkpoint the run kept (no slow slide); start: below "
        "the round's start.",
    )
    suite: Literal["train", "validation"] = Field(
        "train",
        description="train: the suite's train tasks; validation: the warm start's validation "
        "suite, in environments no stage trains on (needs warmstart.stop_at_success).",
    )


class TrainConfig(Section):
    """The policy-gradient update (train/): clipped surrogate over the round's advantages."""

    lr: float = Field(1e-4, gt=0, description="AdamW's learning rate.")
    epochs: int = Field(2, ge=1, description="Passes over the round's episodes.")
    minibatches: int = Field(4, ge=1, description="Optimizer steps per epoch.")
    micro_batch: int = Field(64, ge=1, description="Sequences per forward pass (accumulated).")
    clip_low: float = Field(
        0.2,
        ge=0,
        description="Ratio clip below 1. Source: Schulman et al. 2017, Proximal Policy "
        "Optimization Algorithms.",
    )
    clip_high: float = Field(
        0.28, ge=0, description="Ratio clip above 1 (clip-higher). Source: Yu et al. 2025, DAPO."
    )
    grad_clip: float = Field(1.0, gt=0, description="Gradient norm clip.")
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="> 0: k3 KL to the warm start (round_00), clamped as verl's low_var_kl. "
        "Source: Schulman 2020, Approximating KL Divergence.",
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW's decoupled weight decay.")
    adam_eps: float = Field(
        1e-8, gt=0, description="AdamW's eps; above an RL gradient's size it damps noise."
    )
    seed: int = Field(0, description=SEED)
    loss_agg: Literal[
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = Field(
        "token-mean",
        description="How token losses become one number (train/loss.py AGGREGATIONS, verl's "
        "names); token-mean is DAPO's token-level loss.",
    )
    tis_cap: float | None = Field(
        None,
        gt=0,
        description="Truncated importance sampling cap C: weight min(pi_train / pi_rollout, C); "
        "null: off. Source: Yao et al. 2025, Your Efficient RL Framework Secretly Brings You "
        "Off-Policy RL Training.",
    )
    optimizer: Literal["adamw", "muon"] = Field(
        "adamw",
        description="adamw, or muon: Muon on the 2-D hidden weights (muon_lr), AdamW on the "
        "rest (lr). Source: Jordan et al. 2024.",
    )
    muon_lr: float = Field(1e-3, gt=0, description="Muon's lr; `lr` stays AdamW's.")
    warmup_steps: int = Field(
        0, ge=0, description="Linear lr warmup over the run's first optimizer steps (all rounds)."
    )
    max_nonfinite_steps: int = Field(
        3, ge=1, description="A non-finite loss skips its step; this many in a row abort."
    )
    lora: LoraConfig | None = Field(
        None, description="LoRA adapters (below); null: full fine-tune, or LoRA above lora_above_m."
    )
    lora_above_m: float | None = Field(
        50.0,
        ge=0,
        description="With lora null, a model above this many million parameters (a real one) "
        "trains LoRA adapters with the defaults; null: full fine-tuning whatever the size.",
    )
    bf16: bool = Field(False, description="bf16 autocast on CUDA; without CUDA a warning, float32.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward: less memory, more compute."
    )
    world_size: int = Field(
        1, ge=1, description="> 1: DDP ranks launched through torchrun (gloo on CPU, NCCL on GPU)."
    )
    max_kl: float | None = Field(
        None,
        gt=0,
        description="A round's trust region: after its steps, the mean per-token KL (k3) from "
        "the round's old policy on its own tokens; above max_kl the update is shrunk along its "
        "own direction (backtracking) until inside, or undone. null: off. Source: Schulman et "
        "al. 2015, Trust Region Policy Optimization (its line search).",
    )
    max_kl_expand: float = Field(
        1.0,
        ge=1,
        description="With max_kl set, a round whose KL is inside the region is stretched along "
        "its own update toward the boundary, at most this factor (TRPO steps to its boundary); "
        "1: never stretched.",
    )
    guard: GuardConfig = Field(GuardConfig(), description="Collapse guard (below).")


class HalvingConfig(Section):
    """Paired successive halving (evaluate/halving.py HalvingKnobs documents each field): warm-up
    on a shared core of items, then rounds that keep the best 1/eta. Source: Jamieson &
    Talwalkar 2016, Non-stochastic Best Arm Identification and Hyperparameter Optimization;
    the paired 2PL variant is rollwise's (design.md §4)."""

    warmup_frac: float = Field(0.1, gt=0, le=1, description="Share of items in the warm-up.")
    round_frac: float = Field(0.05, gt=0, le=1, description="Share of items added a round.")
    eta: int = Field(2, ge=2, description="Each round keeps 1/eta of the candidates.")
    alpha: float = Field(
        0.1, gt=0, lt=1, description="A paired test at this level keeps a close candidate."
    )
    stop_alpha: float = Field(
        0.02,
        gt=0,
        lt=1,
        description="Stop once, at this level, no survivor can beat the leader by `tolerance`.",
    )
    tolerance: float = Field(
        0.01,
        ge=0,
        lt=1,
        description="A difference in success not worth more cells (0.01: one point of tasks).",
    )
    seed: int = Field(0, description=SEED)


class EvaluateConfig(Section):
    """Every round's checkpoint (and `candidates`) on the held-out tasks; picks one to ship."""

    split: Literal["heldout", "train"] = Field("heldout", description="Tasks evaluated on.")
    max_tasks: int = Field(400, ge=1, description="Most tasks evaluated.")
    max_turns: int = Field(6, ge=1, description="Most policy turns an episode.")
    max_new_tokens: int = Field(48, ge=1, description="Most tokens a reply.")
    action_mode: Literal["direct", "code"] | None = Field(
        None,
        description="The interface evaluated in: direct <tool_call> turns or code actions; null: "
        "the rollout's (rollout.action_mode). Setting the other one evaluates a policy across "
        "interfaces (ProgAgent's comparison).",
    )
    method: Literal["full", "halving"] = Field(
        "halving",
        description="halving: paired successive halving, far fewer cells (weaker checkpoints run "
        "fewer tasks); full: every checkpoint on every task.",
    )
    budget_frac: float = Field(
        0.6, gt=0, le=1, description="halving: cap on cells, a share of full evaluation."
    )
    halving: HalvingConfig = Field(HalvingConfig(), description="method: halving.")
    candidates: dict[str, str] = Field(
        {}, description="Extra candidates beside every round's checkpoint: name -> HF model folder."
    )

    @field_validator("candidates")
    @classmethod
    def candidate_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not re.fullmatch(r"[A-Za-z0-9._-]+", name) or name.startswith("round_"):
                raise ValueError(f"candidate name {name!r}: letters, digits, . _ - only, and "
                                 "not round_* (the pipeline's own checkpoints)")  # fmt: skip
        return v
