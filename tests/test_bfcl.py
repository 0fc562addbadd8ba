"""The BFCL multi-turn adapter against BFCL's own checker and executor (bfcl-eval's
multi_turn_checker eval()s BFCL's own call strings: its data, never model output)."""

from __future__ import annotations

import copy
import json
import uuid

import pytest
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

from rollwise.envs.bfcl import BFCLEnv, Entry, expected_of, replay
from rollwise.envs.generate import oracle_passes
from rollwise.envs.protocol import Environment, MultiTurn, TaskSource


def fresh_name() -> str:
    """BFCL keeps instances in its module globals keyed by model name: one name per run."""
    return f"rollwise_{uuid.uuid4().hex}"


def bfcl_valid(entry: Entry, turns: list[list[str]]) -> bool:
    """BFCL's verdict on a model whose turns made these calls (one step per turn)."""
    prompt = {"id": entry.id, "initial_config": entry.initial_config,
              "involved_classes": entry.classes}  # fmt: skip
    model = [[calls] if calls else [] for calls in turns]
    category = f"multi_turn_{entry.category}"
    return multi_turn_checker(model, entry.ground_truth, prompt, category, fresh_name())["valid"]


def verdicts(env: BFCLEnv, edit) -> list[tuple[bool, bool]]:
    """(BFCL's verdict, ours) per entry, for each turn's ground-truth calls passed through
    `edit`: BFCL checks the edited call strings, we replay the edited parsed calls."""
    out = []
    for task in env.tasks():
        entry = env.entries[task.task_id]
        ours = replay(env, task, [edit(turn) for turn in env.oracle_turns(task)]).success
        out.append((bfcl_valid(entry, [edit(turn) for turn in entry.ground_truth]), ours))
    return out


@pytest.fixture(scope="module")
def base() -> BFCLEnv:
    return BFCLEnv(["base"])


def test_ground_truth_passes_ours_wherever_bfcl_passes(base):
    both = verdicts(base, lambda turn: turn)
    bfcl_passes = [ours for theirs, ours in both if theirs]
    assert len(both) == 200 and len(bfcl_passes) == 200  # pinned: BFCL passes all its own
    assert sum(bfcl_passes) == 200  # and so do we on every one of them


def test_wrong_call_sequences_fail_both(base):
    dropped = verdicts(base, lambda turn: turn[:-1])  # every turn's last call left out
    assert [v for v in dropped if v != (False, False)] == []  # pinned: all 200 fail both
    # Each turn's calls in reverse order: where order changes the state both fail, elsewhere
    # both pass (BFCL's response check ignores order). A verdict-for-verdict match.
    reordered = verdicts(base, lambda turn: turn[::-1])
    assert all(theirs == ours for theirs, ours in reordered)
    assert sum(ours for _, ours in reordered) == 90  # pinned: 90 pass, 110 fail


@pytest.mark.parametrize("category", ["miss_func", "miss_param", "long_context"])
def test_ground_truth_replays_in_every_category(category):
    both = verdicts(BFCLEnv([category]), lambda turn: turn)
    assert len(both) == 200 and all(theirs and ours for theirs, ours in both)  # pinned: 200


def test_our_executor_gives_bfcls_results(base):
    """Our whitelisted executor on parsed calls renders exactly what BFCL's eval() renders."""
    for entry in base.entries.values():
        name, theirs = fresh_name(), []
        for turn in entry.ground_truth:
            results, _ = execute_multi_turn_func_call(
                turn, entry.initial_config, entry.classes, name, entry.id
            )
            theirs.append(results)
        assert expected_of(entry).results == theirs, entry.id


def test_protocols_and_generation_replay(base):
    assert isinstance(base, Environment) and isinstance(base, TaskSource)
    assert isinstance(base, MultiTurn)
    for task in base.tasks()[:20]:  # the generate stage's oracle replay, turn by turn
        assert oracle_passes(copy.copy(base), task), task.task_id


def test_turns_are_fed_in_order_and_missing_functions_revealed():
    env = BFCLEnv(["miss_func"], ids=["multi_turn_miss_func_0"])  # sort held out to turn 3
    (task,) = env.tasks()
    entry = env.entries[task.task_id]
    messages = env.reset(task, seed=0)
    assert messages[0]["role"] == "system" and messages[1:] == entry.turns[0]
    seen = [[t.name for t in env.tools()]]
    for t in range(1, len(entry.turns)):
        messages = env.next_turn("done")
        seen.append([s.name for s in env.tools()])
        if t == 3:
            docs, prompt = messages[-1]["content"].split("\n", 1)
            assert [d["function"]["name"] for d in json.loads(docs)] == ["sort"]
            assert "updated some more functions" in prompt
        else:
            assert messages == entry.turns[t]
    assert env.next_turn("done") is None
    assert ["sort" in names for names in seen] == [False, False, False, True, True]


def test_verify_reads_the_state(base):
    task = base.tasks()[0]  # multi_turn_base_0: file system and twitter
    assert replay(base, task, base.oracle_turns(task)).success
    base.instances["TwitterAPI"].tweet_counter += 1  # a change no call made
    scored = base.verify("", list(task.oracle))
    assert not scored.success and scored.scores["no_side_effects"] == 0.0
    # All calls in the first turn, later turns left empty: fails although every call was made.
    rushed = replay(base, task, [list(task.oracle)])
    assert not rushed.success and rushed.scores["answer_correct"] < 1.0


def test_fingerprint_follows_the_state(base):
    task = base.tasks()[0]
    base.reset(task, seed=0)
    fresh = base.fingerprint()
    base.reset(task, seed=1)
    assert base.fingerprint() == fresh
    base.step(task.oracle[0])
    assert base.fingerprint() != fresh
