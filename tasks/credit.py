"""Stage `credit@NN`: advantages of the kept episodes (rollwise.loop.credit) ->
data/advantages/round_NN/.

Reads the round's episodes and steps, the curator's decisions (only kept episodes get
advantages, each scaled by its decision weight) and replayed positives (positives.parquet,
`curate.replay_positives` > 0: they join their task's group), and round NN-1's
credit_state.json (round 00's, empty, comes with the warm start) plus train@NN-1's KL. Writes
advantages.parquet (one row per episode turn) and this round's credit_state.json: SPO's per-task
Beta tracker and the KL each policy version travelled from the warm start."""

from __future__ import annotations

from pathlib import Path

from rollwise import loop
from rollwise.config import Params
from rollwise.credit.tracker import to_json
from tasks.common import (
    CREDIT_STATE,
    atomic_dir,
    log,
    model_dir,
    require,
    round_batch,
    round_dir,
    round_state,
    stage_main,
    stage_of_model,
    with_train_drift,
    write_json,
)


def run(params: Params, root: Path, r: str) -> dict:
    from rollwise.credit.signals import methods_used
    from rollwise.policy.build import load_tokenizer

    episodes, steps, decisions = round_batch(root, r)
    start = params.rounds[r].start
    state = with_train_drift(params, root, r, round_state(root, start, "credit"))
    tokenizer = None
    if "farca" in methods_used(params.credit):  # values localized to tokens: the policy's own
        tokenizer = load_tokenizer(require(model_dir(root, start), stage_of_model(start)))
    done = loop.credit(params, episodes, steps, decisions, state, tokenizer)
    with atomic_dir(round_dir(root, "advantages", r)) as out:
        done.advantages.to_parquet(out / "advantages.parquet")
        write_json(out / CREDIT_STATE, to_json(done.tracker, state.drift, int(r)))
    log(f"credit@{r}", f"{params.credit.method}: {len(done.advantages)} turn advantages")
    return done.metrics


def main() -> None:
    stage_main("credit", run, with_round=True)


if __name__ == "__main__":
    main()
