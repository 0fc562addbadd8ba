"""Stage `curate@NN`: which episodes may teach (rollwise.loop.curate) -> data/curated/round_NN/.

Reads the round's episodes and steps, the suite (the environments the curator replays calls
against) and round NN-1's curated folder (success bank and quarantine; round 00's, empty, is
written by the warmstart stage). The curator never reads audit.parquet (curate/attribution.py).

Writes:
  attributions.parquet  per episode: cause, confidence, per-cause scores, evidence, verifier calls
  decisions.parquet     per episode: kept, reason, evidence, cause, confidence, weight
  quarantine.parquet    tasks the next round's scheduler skips (curate/filters.py)
  success_bank.parquet  verified successes per task, merged with the previous round's
  positives.parquet     banked successes of this round's tasks as episodes (replay_positives>0)
  skill_bank.parquet    with rollout.memory.skills: the skill bank (memory/bank.py), the next
                        rollout offers its skills
  meta_updates.parquet  with rollout.memory.meta_tasks: the meta-agent's updates tried, each
                        with its validation before and after and whether it was kept
  tool_pool.json        a tool-building suite's (SMITH) pool: round NN-1's with this round's
                        admitted builds (envs/tool_pool.py); the next rollout calls it
"""

from __future__ import annotations

from pathlib import Path

from rollwise import loop
from rollwise.config import Params
from rollwise.envs.tool_pool import POOL_FILE
from tasks.common import (
    atomic_dir,
    envs_dir,
    log,
    model_dir,
    read_history,
    read_suite,
    read_table,
    require,
    round_dir,
    round_state,
    stage_main,
    stage_of_model,
)


def run(params: Params, root: Path, r: str) -> dict:
    rollouts = round_dir(root, "rollouts", r)
    episodes = read_table(rollouts / "episodes.parquet", f"rollout@{r}")
    steps = read_table(rollouts / "steps.parquet", f"rollout@{r}")
    suite = read_suite(require(envs_dir(root), "generate"))
    state = round_state(root, params.rounds[r].start, "curate")
    tokenizer, backend = None, None
    if params.rollout.memory.skills != "none":  # reads the skill calls in the policy's turns
        from rollwise.policy.build import load_policy, load_tokenizer

        state.history = read_history(root, r)  # earlier rounds' failures: the repair pathway
        policy = params.rounds[r].rollout_round
        folder = require(model_dir(root, policy), stage_of_model(policy))
        if params.rollout.memory.meta_tasks:  # the meta-agent validates with the round's policy
            from rollwise.policy.hf import HFBackend

            model, tokenizer = load_policy(folder)
            backend = HFBackend(model, tokenizer)
        else:
            tokenizer = load_tokenizer(folder)
    done = loop.curate(params, suite, episodes, steps, state, int(r), tokenizer, backend)
    with atomic_dir(round_dir(root, "curated", r)) as out:
        for name, table in done.tables.items():
            table.to_parquet(out / f"{name}.parquet")
        if done.tools is not None:
            done.tools.save(out / POOL_FILE)
    if params.curate.bank_url:
        from rollwise.curate.success_bank import publish

        url = f"{params.curate.bank_url.rstrip('/')}/round_{r}"
        publish(round_dir(root, "curated", r) / "success_bank.parquet", url)
    m = done.metrics
    log(f"curate@{r}", f"kept {m['kept']}, dropped {m['dropped']}, quarantined "
        f"{m['quarantined']}, {m['verifier_calls']} verifier calls")  # fmt: skip
    return m


def main() -> None:
    stage_main("curate", run, with_round=True)


if __name__ == "__main__":
    main()
