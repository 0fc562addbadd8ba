"""Stage `warmstart`: the starting policy -> models/round_00/.

Builds a tokenizer and a tiny Qwen2 and SFTs it on oracle trajectories of the train split
(stopped early on purpose: RL needs room), or takes the user's local model folder as is."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from rollwise.config import FaultsConfig, Params
from rollwise.envs.runtime import Suite, load_suite
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
    from rollwise.policy.build import save_policy

    suite = load_suite(require(envs_dir(root), "generate"))
    initial_schedule_state(root)
    initial_credit_state(root)
    initial_curate_state(root)
    if params.policy.model:
        return copy_user_model(Path(params.policy.model), model_dir(root, "00"))

    def progress(step: int, loss: float) -> None:
        if step % 25 == 0 or step == params.warmstart.steps - 1:
            report_progress("warmstart", step + 1, params.warmstart.steps, f"loss {loss:.3f}")

    model, tokenizer, losses, n_demos = sft_warm_start(params, suite, progress)
    with atomic_dir(model_dir(root, "00")) as out:
        save_policy(
            model, tokenizer, out, {"built_from": "policy params", "sft_steps": len(losses)}
        )
    return {
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "sft_final_loss": losses[-1] if losses else 0.0,
        "demos": n_demos,
    }


def sft_warm_start(params: Params, suite: Suite, on_step=None) -> tuple:
    """(model, tokenizer, losses, demos): a tokenizer and tiny Qwen2 built from `suite` and its
    augment suites, SFT on their train oracles. The stage and the learning benches share it, so
    a bench's warm start is the pipeline's round_00 (same demos, same tokenizer)."""
    from rollwise.policy.build import build_model
    from rollwise.train.sft import oracle_sequence, sft

    with tempfile.TemporaryDirectory() as scratch:
        demo_suites = [suite, *augment_suites(params, Path(scratch))]
        tokenizer = suite_tokenizer(*demo_suites)
        model = build_model(tokenizer, params.policy)
        train = [
            oracle_sequence(t, s.envs[t.env_id], tokenizer)
            for s in demo_suites
            for t in s.split("train")
        ]
    n_params = sum(p.numel() for p in model.parameters())
    log("warmstart", f"{n_params / 1e6:.2f}M params, vocab {len(tokenizer)}, {len(train)} demos")
    losses = sft(model, train, params.warmstart, tokenizer.pad_token_id, on_step=on_step)
    return model, tokenizer, losses, len(train)


def augment_suites(params: Params, scratch: Path) -> list[Suite]:
    """`warmstart.augment_suites` more suites from the generator with other seeds (fresh
    databases and tasks; all their tasks are demos). On the default suite alone SFT memorized
    its demos' answers instead of reading the observations (bench/results/generalization.json:
    54% train vs 18% held-out tasks of the same environments). The evaluation's environments and
    held-out tasks are untouched: these are other environments."""
    from rollwise.envs.generate import generate_suite

    if params.envs.custom and params.warmstart.augment_suites:
        raise ValueError("warmstart.augment_suites needs the synthetic suite (envs.custom is set)")
    suites = []
    for k in range(1, params.warmstart.augment_suites + 1):
        cfg = params.envs.model_copy(
            update={"seed": params.envs.seed + 7919 * k, "heldout_envs": 0,
                    "heldout_task_frac": 0.0, "faults": FaultsConfig()}
        )  # fmt: skip
        generate_suite(cfg, scratch / f"augment_{k}")
        suites.append(load_suite(scratch / f"augment_{k}"))
    return suites


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


def suite_tokenizer(*suites: Suite):
    """Word-level vocabulary from the suites' text (vocabulary only: held-out tasks teach nothing
    here, but their words must be tokens so unseen environments are not [UNK] soup)."""
    from rollwise.policy.build import train_tokenizer
    from rollwise.train.sft import oracle_texts

    scratch = train_tokenizer([])
    texts = [ERROR_WORDS]
    for suite, task in ((s, t) for s in suites for t in s.tasks.values()):
        env = suite.envs[task.env_id]
        msgs = env.reset(task, seed=0)
        tools = [t.to_openai() for t in env.tools()]
        texts.append(scratch.apply_chat_template(msgs, tools=tools, tokenize=False))
        texts += [piece for turn in oracle_texts(task, env, scratch)[1] for piece in turn if piece]
    return train_tokenizer(texts)


# The wording of error observations (runtime.py, chat.py, engine.py): the policy must read them.
ERROR_WORDS = (
    "error unknown tool takes exactly one argument must be integer string not found: environment "
    "malformed tool call unbalanced tags not valid JSON expected name arguments must be an object "
    "too many calls in one turn timed out reset failed after s busy an earlier has returned "
    "run this"
)


def copy_user_model(src: Path, dst: Path) -> dict:
    require(src / "config.json", "the user's model folder (policy.model)")
    with atomic_dir(dst) as out:
        shutil.copytree(src, out, dirs_exist_ok=True)
    log("warmstart", f"using the local model {src}")
    return {"params_m": 0.0, "sft_final_loss": 0.0, "demos": 0}


def main() -> None:
    stage_main("warmstart", run)


if __name__ == "__main__":
    main()
