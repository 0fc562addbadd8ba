"""Stage `warmstart`: the starting policy -> models/round_00/.

Builds a tokenizer and a tiny Qwen2 and SFTs it on oracle trajectories of the train split
(stopped early on purpose: RL needs room), or materializes the user's model (policy.model)."""

from __future__ import annotations

from pathlib import Path

from rollwise import loop
from rollwise.config import Params
from tasks.common import (
    CREDIT_STATE,
    atomic_dir,
    envs_dir,
    log,
    model_dir,
    read_suite,
    report_progress,
    require,
    round_dir,
    stage_main,
    write_json,
)


def run(params: Params, root: Path) -> dict:
    from rollwise.policy.build import load_policy, materialize_model, save_policy

    suite = read_suite(require(envs_dir(root), "generate"))
    initial_states(root)
    base = None
    if params.policy.model:
        spec, out = params.policy.model, model_dir(root, "00")
        made = materialize_model(spec, out, params.policy.tools_format)
        if not params.warmstart.finetune_model:
            return made
        base = load_policy(out)  # SFT'd below, then saved over it

    def progress(step: int, loss: float) -> None:
        if step % 25 == 0 or step == params.warmstart.steps - 1:
            report_progress("warmstart", step + 1, params.warmstart.steps, f"loss {loss:.3f}")

    model, tokenizer, info = loop.warm_start(params, suite, on_step=progress, base=base)
    n_params = sum(p.numel() for p in model.parameters())
    log("warmstart", f"{n_params / 1e6:.2f}M params, vocab {len(tokenizer)}, {info['demos']} demos")
    for c in info["checks"]:
        log("warmstart", f"step {c['step']}: validation success {c['validation_success']:.3f}")
    with atomic_dir(model_dir(root, "00")) as out:
        save_policy(model, tokenizer, out,
                    {"built_from": "policy params", "sft_steps": info["sft_steps"]})  # fmt: skip
    checks = info["checks"]
    return {
        "params_m": n_params / 1e6,
        "sft_final_loss": info["sft_final_loss"],
        "demos": info["demos"],
        "sft_steps": info["sft_steps"],
        **({"validation_success": checks[-1]["validation_success"]} if checks else {}),
    }


def initial_states(root: Path) -> None:
    """Round 00's scheduler, credit and curator states: nothing observed yet (loop.RoundState's
    defaults). Round 01's stages read them the way every later round reads its predecessor's,
    so dvc.yaml has one dependency pattern for all rounds."""
    from rollwise.credit.tracker import to_json
    from rollwise.schedule.history import to_state

    state = loop.RoundState()
    with atomic_dir(round_dir(root, "rollouts", "00")) as out:
        write_json(out / "scheduler_state.json", {**to_state(None, round=0), "history": {}})
    with atomic_dir(round_dir(root, "advantages", "00")) as out:
        write_json(out / CREDIT_STATE, to_json(state.tracker, state.drift, 0))
    with atomic_dir(round_dir(root, "curated", "00")) as out:
        state.bank.to_parquet(out / "success_bank.parquet")
        state.quarantine.to_parquet(out / "quarantine.parquet")


def main() -> None:
    stage_main("warmstart", run)


if __name__ == "__main__":
    main()
