"""Ground-truth calls that BFCL's executor answers with an error, and the instance flags it sets,
against bfcl-eval's own executor and checker on the same input (they eval() the call strings
written here and in BFCL's data, never model output)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

from rollwise.envs.bfcl import (
    CATEGORIES,
    BFCLEnv,
    Entry,
    build_instances,
    expected_of,
    load_entries,
    plain,
    public_state,
    replay,
)
from rollwise.envs.bfcl_exec import RAW
from rollwise.envs.generate import oracle_passes
from rollwise.types import ToolCall
from tests.test_bfcl import bfcl_valid, fresh_name

# Each appended to the first turn of multi_turn_base_0 (file system and twitter), after a cd.
TOLERATED = {
    "an argument the function lacks": "cd(folder='temp', fast=True)",
    "a missing required argument": "mkdir()",
    "a function that does not exist": "teleport(to='temp')",
    "a string literal that does not parse": "post_tweet(content='It's done')",
    "too many positional arguments": "cd('document', 'temp')",
    "an unknown function called positionally": "teleport('temp')",
    "a function BFCL refuses": "exit()",
}


def fc_string(call: ToolCall) -> str:
    """How BFCL turns a model's FC call into the string it executes (model_handler/utils.py
    convert_to_function_call, copied: that module imports tree_sitter, not installed here)."""
    return f"{call.name}({','.join(f'{k}={v!r}' for k, v in call.arguments.items())})"


def bfcl_results(entry: Entry, turns: list[list[str]]) -> list[list[str]]:
    """BFCL's executor on these call strings, turn by turn, on one set of instances."""
    name = fresh_name()
    run = execute_multi_turn_func_call
    return [run(turn, entry.initial_config, entry.classes, name, entry.id)[0] for turn in turns]


def with_ground_truth(turn0_extra: str) -> tuple[BFCLEnv, Entry]:
    env = BFCLEnv(["base"], ids=["multi_turn_base_0"])
    entry = env.entries["multi_turn_base_0"]
    gt = entry.ground_truth
    entry = dataclasses.replace(entry, ground_truth=[[*gt[0], turn0_extra], *gt[1:]])
    env.entries = {entry.id: entry}
    return env, entry


@pytest.mark.parametrize("text", TOLERATED.values(), ids=TOLERATED.keys())
def test_a_call_bfcl_answers_with_an_error_is_that_error_and_keeps_the_entry(text):
    env, entry = with_ground_truth(text)
    (task,) = env.tasks()  # loaded, not skipped
    theirs = bfcl_results(entry, entry.ground_truth)
    assert theirs[0][-1].startswith("Error during execution: ")
    assert expected_of(entry).results == theirs  # the ground truth, executed as BFCL does
    turns = env.oracle_turns(task)
    assert replay(env, task, turns).success and env.results == theirs  # the oracle, stepped
    assert bfcl_valid(entry, entry.ground_truth)  # BFCL passes its own ground truth too
    assert oracle_passes(copy.copy(env), task)  # and generation keeps the task
    # A model leaving the erring call out fails both: the error is a result BFCL checks for.
    cut = [turns[0][:-1], *turns[1:]]
    assert not replay(env, task, cut).success
    assert not bfcl_valid(entry, [entry.ground_truth[0][:-1], *entry.ground_truth[1:]])
    # The same call sent by a model (BFCL's conversion of FC output) gets the same answer.
    last = turns[0][-1]
    if RAW not in last.arguments:
        prefix = [*entry.ground_truth[0][:-1], fc_string(last)]
        assert bfcl_results(entry, [prefix])[0][-1] == theirs[0][-1]


def test_erring_calls_keep_the_arguments_a_model_would_send():
    oracle = {k: with_ground_truth(v)[0].tasks()[0].oracle[3] for k, v in TOLERATED.items()}
    assert oracle["an argument the function lacks"] == ToolCall(
        "cd", {"folder": "temp", "fast": True}
    )
    assert oracle["a missing required argument"] == ToolCall("mkdir", {})
    assert oracle["a function that does not exist"] == ToolCall("teleport", {"to": "temp"})
    assert oracle["too many positional arguments"].arguments == {RAW: "cd('document', 'temp')"}
    parse_error = oracle["a string literal that does not parse"]
    assert parse_error == ToolCall("post_tweet", {RAW: "post_tweet(content='It's done')"})


def test_a_model_cannot_run_a_method_through_the_raw_argument():
    env, entry = with_ground_truth("cd(folder='temp')")
    (task,) = env.tasks()
    env.reset(task, seed=0)
    before = plain(public_state(env.instances))
    obs = env.step(ToolCall("cd", {RAW: "mkdir(dir_name='x')"}))
    assert obs.kind == "tool_error" and "unexpected keyword argument 'bfcl_call'" in obs.content
    assert plain(public_state(env.instances)) == before


def test_a_ground_truth_we_cannot_run_without_eval_skips_the_entry():
    env, _ = with_ground_truth("cd(folder=pwd())")  # BFCL would evaluate the nested call
    assert env.tasks() == [] and "not a literal" in env.skipped["multi_turn_base_0"].lower()


@pytest.mark.parametrize("category", CATEGORIES)
def test_instances_load_with_bfcls_flags(category):
    """The first entry of each category with a class whose state the long_context flag changes:
    our instances equal the ones BFCL's checker builds (flag from the category), and differ from
    those built with the other flag value."""
    entry = next(e for e in load_entries(category) if "GorillaFileSystem" in e.classes)
    ours = plain(public_state(build_instances(entry)))
    theirs = {}
    for flag in (False, True):
        run = execute_multi_turn_func_call
        _, instances = run([], entry.initial_config, entry.classes, fresh_name(), entry.id, flag)
        theirs[flag] = plain(public_state(instances))
    flag = category == "long_context"
    assert ours == theirs[flag] and ours != theirs[not flag]
