"""The pipeline deployment's form in the Prefect UI: a few typed fields for the knobs a user
changes first, a free-form mapping for any other params key, and how they merge."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rollwise.config import ParamsError


def choice(names) -> Any:
    return Literal[tuple(sorted(names))]  # type: ignore[valid-type]


# Form field -> the dotted params key it overrides (None: leave params.yaml's value).
FORM_KEYS = {
    "rounds": "rounds",
    "train_lr": "train.lr",
    "samples_per_task": "rollout.samples_per_task",
    "schedule_method": "schedule.method",
    "credit_method": "credit.method",
}


def form_overrides(form: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The form's typed fields as dotted overrides, merged with the free-form mapping; the same
    key set two ways to two values is an error, not a silent choice."""
    merged = dict(overrides)
    for field, key in FORM_KEYS.items():
        value = form.get(field)
        if value is None:
            continue
        if key in merged and merged[key] != value:
            raise ParamsError(f"{key}: {value!r} in {field} but {merged[key]!r} in overrides")
        merged[key] = value
    return merged


RUN_NAME = Field(
    default=None,
    description="Names the run's worktree .rollwise/runs/NAME/, its git branch "
    "rollwise-runs/NAME and the MLflow run (default: the flow run's name). Reusing a name "
    "resumes that run: stages already recorded there are skipped.",
)
OVERRIDES = Field(
    default={},
    description='Any other params.yaml keys, dotted: {"train.epochs": 4, "envs.n_envs": 12}. '
    "Checked before any stage runs; an unknown key fails the run.",
)
PARAMS_FILE = Field(
    default="params.yaml",
    description="The params file the overrides apply to, relative to the project root.",
)
