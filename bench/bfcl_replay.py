"""BFCL's ground truth through our adapter, per category, against bfcl-eval's own executor and
checker (which eval() BFCL's call strings: its data, and our oracle rewritten as BFCL rewrites a
model's function calls, never model output). Writes bench/results/bfcl_replay.json.

Per category: entries shipped; entries loaded as tasks (the rest skipped, with the reason);
BFCL's checker passing its own ground truth, and passing our oracle as a model's calls; our
replay of the oracle passing, twice, with the oracle unchanged after both; generation keeping
the task (generate.oracle_passes); execution results equal to BFCL's executor (the ground truth
executed, and the oracle stepped, turn by turn) and public states equal after every turn.

    .venv/bin/python bench/bfcl_replay.py
"""

from __future__ import annotations

import copy
import json
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (  # noqa: E402
    multi_turn_checker,
)
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (  # noqa: E402
    execute_multi_turn_func_call,
)

from bench.provenance import STARTED_AT  # noqa: E402
from rollwise.envs.bfcl import (  # noqa: E402
    CATEGORIES,
    BFCLEnv,
    Entry,
    expected_of,
    long_context,
    plain,
    public_state,
    replay,
)
from rollwise.envs.bfcl_exec import RAW  # noqa: E402
from rollwise.envs.generate import oracle_passes  # noqa: E402
from rollwise.types import ToolCall  # noqa: E402

OUT = ROOT / "bench" / "results" / "bfcl_replay.json"


def fresh_name() -> str:
    """BFCL keeps instances in its module globals keyed by model name: one name per run."""
    return f"bench_{uuid.uuid4().hex}"


def fc_string(call: ToolCall) -> str:
    """A call as BFCL executes a model's FC output (model_handler/utils.py
    convert_to_function_call); a call kept as text (RAW) as that text."""
    if set(call.arguments) == {RAW}:
        return call.arguments[RAW]
    return f"{call.name}({','.join(f'{k}={v!r}' for k, v in call.arguments.items())})"


def bfcl_valid(entry: Entry, turns: list[list[str]]) -> bool:
    """BFCL's checker on a model whose turns made these calls (one step per turn)."""
    prompt = {"id": entry.id, "initial_config": entry.initial_config,
              "involved_classes": entry.classes}  # fmt: skip
    model = [[calls] if calls else [] for calls in turns]
    category = f"multi_turn_{entry.category}"
    return multi_turn_checker(model, entry.ground_truth, prompt, category, fresh_name())["valid"]


def bfcl_run(entry: Entry) -> tuple[list[list[str]], list[dict]]:
    """BFCL's executor on the ground truth: results and public states, turn by turn."""
    name, results, states = fresh_name(), [], []
    for turn in entry.ground_truth:
        out, instances = execute_multi_turn_func_call(
            turn, entry.initial_config, entry.classes, name, entry.id, long_context(entry.id)
        )
        results.append(out)
        states.append(plain(public_state(instances)))
    return results, states


def stepped(env: BFCLEnv, task) -> tuple[bool, list[list[str]], list[dict]]:
    """Our replay of the oracle: verdict, observations and public states, turn by turn."""
    success = replay(env, task, env.oracle_turns(task)).success
    states = [plain(s) for s in [*env.states, public_state(env.instances)]]
    return success, env.results, states


def category_row(category: str) -> dict:
    env = BFCLEnv([category])
    tasks = env.tasks()
    row = {"entries": len(env.entries), "loaded": len(tasks), "skipped": dict(env.skipped)}
    counts = dict.fromkeys(
        ["bfcl_passes_ground_truth", "bfcl_passes_our_oracle", "replay_passes",
         "replay_passes_twice_oracle_unchanged", "generation_keeps", "results_equal_bfcl",
         "states_equal_bfcl"], 0)  # fmt: skip
    differ = []
    for task in tasks:
        entry = env.entries[task.task_id]
        oracle = copy.deepcopy(task.oracle)
        theirs, their_states = bfcl_run(entry)
        first, results, states = stepped(env, task)
        second = replay(env, task, env.oracle_turns(task)).success
        results_equal = results == theirs and expected_of(entry).results == theirs
        checks = {
            "bfcl_passes_ground_truth": bfcl_valid(entry, entry.ground_truth),
            "bfcl_passes_our_oracle": bfcl_valid(
                entry, [[fc_string(c) for c in turn] for turn in env.oracle_turns(task)]
            ),
            "replay_passes": first,
            "replay_passes_twice_oracle_unchanged": first and second and task.oracle == oracle,
            "generation_keeps": oracle_passes(copy.copy(env), task),
            "results_equal_bfcl": results_equal,
            "states_equal_bfcl": states == their_states,
        }
        for key, ok in checks.items():
            counts[key] += ok
        if not all(checks.values()):
            differ.append({"id": entry.id, **{k: v for k, v in checks.items() if not v}})
    return {**row, **counts, "differ": differ[:20]}


def main() -> None:
    start = time.time()
    table = {category: category_row(category) for category in CATEGORIES}
    report = {
        "command": "python bench/bfcl_replay.py " + " ".join(sys.argv[1:]),
        "git_commit": STARTED_AT,
        "git_dirty": STARTED_AT.endswith("+uncommitted"),
        "seconds": round(time.time() - start, 1),
        "categories": table,
    }
    OUT.write_text(json.dumps(report, indent=1) + "\n")
    keys = [k for k in next(iter(table.values())) if k not in ("skipped", "differ")]
    print(f"{'':38}" + "".join(f"{c:>14}" for c in table))
    for key in keys:
        print(f"{key:38}" + "".join(f"{row[key]:>14}" for row in table.values()))
    print(f"wrote {OUT.relative_to(ROOT)} in {report['seconds']} s")


if __name__ == "__main__":
    main()
