"""Stage `warmstart`: the starting policy -> models/round_00/.

Builds a tokenizer and a tiny Qwen2 and SFTs it on oracle trajectories of the train split
(stopped early on purpose: RL needs room), or materializes the user's model (policy.model)."""

from __future__ import annotations

from pathlib import Path

from rollwise.config import Params
from rollwise.envs.runtime import load_suite
from rollwise.train.warmstart import sft_warm_start
from tasks.common import (
    atomic_dir,
    envs_dir,
    log,
    model_dir,
    report_progress,
    require,
    round_dir,
    stage_main,
    write_json,
)


def run(params: Params, root: Path) -> dict:
    from rollwise.policy.build import materialize_model, save_policy

    suite = load_suite(require(envs_dir(root), "generate"))
    initial_schedule_state(root)
    initial_credit_state(root)
    initial_curate_state(root)
    if params.policy.model:
        return materialize_model(
            params.policy.model, model_dir(root, "00"), params.policy.tools_format
        )

    def progress(step: int, loss: float) -> None:
        if step % 25 == 0 or step == params.warmstart.steps - 1:
            report_progress("warmstart", step + 1, params.warmstart.steps, f"loss {loss:.3f}")

    checks: list[dict] = []
    model, tokenizer, losses, n_demos = sft_warm_start(params, suite, progress, checks)
    n_params = sum(p.numel() for p in model.parameters())
    log("warmstart", f"{n_params / 1e6:.2f}M params, vocab {len(tokenizer)}, {n_demos} demos")
    for c in checks:
        log("warmstart", f"step {c['step']}: validation success {c['validation_success']:.3f}")
    with atomic_dir(model_dir(root, "00")) as out:
        save_policy(
            model, tokenizer, out, {"built_from": "policy params", "sft_steps": len(losses)}
        )
    return {
        "params_m": n_params / 1e6,
        "sft_final_loss": losses[-1] if losses else 0.0,
        "demos": n_demos,
        "sft_steps": len(losses),
        **({"validation_success": checks[-1]["validation_success"]} if checks else {}),
    }


def initial_schedule_state(root: Path) -> None:
    """Round 00's scheduler state: nothing observed yet. rollout@01 reads it the way every later
    round reads its predecessor's, so dvc.yaml has one dependency pattern for all rounds."""
    with atomic_dir(round_dir(root, "rollouts", "00")) as out:
        write_json(out / "scheduler_state.json", {"round": 0, "history": {}})


def initial_credit_state(root: Path) -> None:
    """Round 00's credit state: no task tracked, no policy drift. credit@01 reads it the way
    every later round reads its predecessor's (tasks/credit.py, credit/tracker.py)."""
    with atomic_dir(round_dir(root, "advantages", "00")) as out:
        write_json(out / "credit_state.json", {"round": 0, "drift": {"0": 0.0}, "tracker": {}})


def initial_curate_state(root: Path) -> None:
    """Round 00's curated folder: an empty success bank and quarantine list. curate@01 reads it
    the way every later round reads its predecessor's (tasks/curate.py)."""
    from tasks.curate import write_initial_state

    with atomic_dir(round_dir(root, "curated", "00")) as out:
        write_initial_state(out)


def main() -> None:
    stage_main("warmstart", run)


if __name__ == "__main__":
    main()
