"""One frozen model per params.yaml section. Unknown keys or bad values fail before any work,
with an error that names the key path (e.g. `params.yaml: train.lr: Input should be ...`)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from rollwise.config.base import SEED, Section  # noqa: F401  (re-exported)
from rollwise.config.learning import (  # noqa: F401  (every section, by its name here too)
    BaseEstimator,
    ConCalConfig,
    CosirConfig,
    CreditConfig,
    EvaluateConfig,
    FactsConfig,
    GiGPOConfig,
    GuardConfig,
    HalvingConfig,
    IAPOConfig,
    LoraConfig,
    OPDConfig,
    SpoCreditConfig,
    TrainConfig,
)
from rollwise.config.sampling import (  # noqa: F401
    BandConfig,
    CostConfig,
    CurateConfig,
    DapoConfig,
    EnvSchedConfig,
    EnvsConfig,
    FaultsConfig,
    MemoryConfig,
    PolicyConfig,
    RolloutConfig,
    SandboxConfig,
    ScheduleConfig,
    SpoSamplingConfig,
    WarmstartConfig,
)

# What dvc.yaml's foreach iterates: `rounds` resolved, written from params.yaml (write_rounds_file)
ROUNDS_FILE = "rounds.yaml"


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

    @model_validator(mode="after")
    def meta_needs_managed_skills(self) -> Params:
        """The meta-agent retires and demotes skills: an append-only bank never does."""
        m = self.rollout.memory
        if m.meta_tasks and m.skills != "managed":
            raise ValueError(
                f"rollout.memory.meta_tasks: {m.meta_tasks} needs rollout.memory.skills: "
                f"managed (it is {m.skills!r}): the meta-agent updates a managed skill bank"
            )
        return self

    @model_validator(mode="after")
    def skill_demos_need_direct_calls(self) -> Params:
        """A skill is a tool call; code mode's demos are code (no skill function there yet)."""
        if self.warmstart.skill_demos and self.rollout.action_mode != "direct":
            raise ValueError(
                f"warmstart.skill_demos: {self.warmstart.skill_demos} needs "
                f"rollout.action_mode: direct (it is {self.rollout.action_mode!r})"
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
