"""Stage `rollout@NN`: schedule tasks and sample G episodes each (rollwise.loop.rollout) with
policy round NN-1 (with `rollout.policy_lag: 1`, round max(NN-2, 0): the round's `rollout_round`
in params' `rounds`, so that the flow can run this stage while train@NN-1 trains; train@NN
corrects the lag by TIS).

Reads the suite, the checkpoint, and round NN-1's scheduler state and curated folder
(quarantine, success bank; round 00's, empty, come with the warm start). Writes
data/rollouts/round_NN/: plan.parquet, episodes.parquet and steps.parquet (the kept groups: the
training batch), scheduler_state.json (the history with this round's groups appended) and
audit.parquet (the faults injected per episode; ground truth the curator never reads)."""

from __future__ import annotations

from pathlib import Path

from rollwise import loop
from rollwise.config import Params
from rollwise.envs.faults import AUDIT_FILE
from rollwise.schedule.history import to_state
from tasks.common import (
    atomic_dir,
    envs_dir,
    load_checkpoint,
    log,
    model_dir,
    read_suite,
    require,
    round_dir,
    round_state,
    stage_main,
    stage_of_model,
    write_json,
)


def run(params: Params, root: Path, r: str) -> dict:
    from rollwise.policy.build import load_tokenizer
    from rollwise.rollout.executors import EXECUTORS

    prev, policy, cfg = params.rounds[r].start, params.rounds[r].rollout_round, params.rollout
    suite_dir = require(envs_dir(root), "generate")
    policy_dir = require(model_dir(root, policy), stage_of_model(policy))
    state = round_state(root, prev, "rollout", "curate")
    limits = loop.limits_of(params, int(r))

    def run_specs(specs: list) -> loop.Rows:
        load = lambda: load_checkpoint(policy_dir, stage_of_model(policy))  # noqa: E731
        return EXECUTORS[cfg.executor](specs, policy_dir, suite_dir, limits, cfg, load=load)

    log(f"rollout@{r}", f"{params.schedule.method}: {params.schedule.tasks_per_round} tasks x "
        f"{cfg.samples_per_task} samples, policy round {policy}, executor {cfg.executor}, "
        f"backend {cfg.backend}")  # fmt: skip
    tokenizer = load_tokenizer(policy_dir) if params.curate.demonstrations else None
    done = loop.rollout(params, read_suite(suite_dir), int(r), state, run_specs, tokenizer,
                        int(policy))  # fmt: skip
    with atomic_dir(round_dir(root, "rollouts", r)) as out:
        done.plan.to_parquet(out / "plan.parquet")
        done.episodes.to_parquet(out / "episodes.parquet")
        done.steps.to_parquet(out / "steps.parquet")
        done.audit.to_parquet(out / AUDIT_FILE)
        state_json = to_state(done.history, method=params.schedule.method, round=int(r))
        write_json(out / "scheduler_state.json", state_json)
    return done.metrics


def main() -> None:
    stage_main("rollout", run, with_round=True)


if __name__ == "__main__":
    main()
