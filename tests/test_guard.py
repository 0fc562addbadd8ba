"""The collapse guard (train/guard.py): the rule, the in-process undo the benches use, and the
train stage keeping its start when a real update destroys a real (tiny, memorized) policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rollwise.config import GuardConfig, Params, validate
from rollwise.rollout.engine import Limits
from rollwise.train.guard import judge, validation_success
from tests.helpers import train_tables, write_train_inputs

GREEDY = Limits(max_context=256, greedy=True)  # the guard's limits at TINY_POLICY's context
TINY_SUITE = {"n_envs": 1, "domains": ["shop"], "owners_per_env": 3, "max_records": 1,
              "tasks_per_env": 6, "heldout_envs": 0, "heldout_task_frac": 0.0,
              "task_kinds": ["city_by_id"]}  # fmt: skip
TINY_POLICY = {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 64,
               "max_context": 256}  # fmt: skip


def test_judge_undoes_only_a_drop_beyond_max_drop():
    cfg = GuardConfig(tasks=8, max_drop=0.25)
    assert judge(0.5, 0.25, cfg).kept  # exactly max_drop: kept
    assert not judge(0.5, 0.125, cfg).kept
    assert judge(0.5, 0.875, cfg).kept
    assert judge(0.5, 0.125, cfg).metrics() == {
        "guard_start": 0.5, "guard_after": 0.125, "guard_best": 0.5, "guard_reverted": 1.0
    }  # fmt: skip


def test_guard_params_are_validated_by_name():
    assert Params().train.guard.tasks == 0  # off unless asked for
    with pytest.raises(ValueError, match="max_drop"):
        validate({"train": {"guard": {"tasks": 8, "max_drop": 1.5}}})
    with pytest.raises(ValueError, match="max_dorp"):
        validate({"train": {"guard": {"max_dorp": 0.1}}})


def test_against_best_stops_a_slide_that_each_round_allows():
    """Four updates each 4 points under the last, the state carried as loop.run_round carries
    it: `start` keeps them all (a 16-point slide), `best` undoes the second and every later one
    below 0.70 - 0.05."""
    undone = {}
    for against in ("start", "best"):
        cfg = GuardConfig(tasks=8, max_drop=0.05, against=against)
        start = best = 0.70
        undone[against] = []
        for after in (0.66, 0.62, 0.58, 0.54):
            verdict = judge(start, after, cfg, best)
            undone[against].append(not verdict.kept)
            start, best = verdict.kept_success, verdict.best_success
    assert undone == {"start": [False] * 4, "best": [False, True, True, True]}
    # a round over the best raises it; one that was undone leaves it
    up = judge(0.66, 0.75, GuardConfig(tasks=8, against="best"), best=0.70)
    assert up.kept and up.best_success == 0.75
    assert judge(0.66, 0.5, GuardConfig(tasks=8), best=0.70).best_success == 0.70


def items_for(vocab: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    items = []
    for k, n in enumerate([10, 12, 14, 9]):
        ids = torch.randint(5, vocab, (n,), generator=g).tolist()
        adv = [0.0] * 4 + [1.0 if k % 2 else -1.0] * (n - 4)
        items.append({"ids": ids, "mask": [0] * 4 + [1] * (n - 4), "adv": adv,
                      "logprobs": [0.0] + [-2.0] * (n - 1)})  # fmt: skip
    return items


@pytest.mark.parametrize("after, undone", [(0.0, True), (0.5, False)])
def test_an_undone_update_leaves_the_start_weights_and_snapshot(after, undone):
    """loop.train with a guard that sees a drop: the model keeps its start's weights and the
    round hands on the start's trainer snapshot (moments and all); else both move."""
    from rollwise import loop
    from rollwise.policy.build import build_model, train_tokenizer

    tok = train_tokenizer(["the answer is paris"])
    train = {"lr": 1e-2, "epochs": 1, "minibatches": 1, "guard": {"tasks": 4}}
    params = validate({"policy": TINY_POLICY, "train": train})
    model = build_model(tok, params.policy)
    tables = {kind: frame for kind, (_, frame) in train_tables(items_for(len(tok))).items()}
    episodes, advantages = tables["rollouts"], tables["advantages"]
    first = loop.train(params, model, tok, None, episodes, advantages, 1)  # moments not zero
    weights = {k: v.clone() for k, v in first.model.state_dict().items()}

    def guard(_model):
        return judge(0.5, after, params.train.guard)

    second = loop.train(params, first.model, tok, first.trainer, episodes, advantages, 2, None,
                        guard)  # fmt: skip
    same = all(torch.equal(v, weights[k]) for k, v in second.model.state_dict().items())
    assert second.verdict.kept is not undone and second.metrics["guard_reverted"] == float(undone)
    assert same is undone and "loss" in second.metrics and second.metrics["guard_s"] >= 0
    assert (second.trainer is first.trainer) is undone
    assert second.trainer["step"] == (1 if undone else 2)


@pytest.fixture(scope="module")
def memorized(tmp_path_factory) -> tuple[Path, Params]:
    """A one-environment suite and a tiny policy SFT'd on its three train tasks until it solves
    them by reading the record (a real policy with validation success above zero, in seconds; at
    150 steps it answered from memory with no call, which grounded success does not count). The
    stop rule is set but never checked: it puts the validation suite's words in the tokenizer."""
    from rollwise.envs.generate import generate_suite
    from rollwise.envs.runtime import load_suite
    from rollwise.policy.build import save_policy
    from rollwise.train.warmstart import sft_warm_start

    root = tmp_path_factory.mktemp("guarded")
    params = validate({"envs": TINY_SUITE, "policy": TINY_POLICY,
                       "warmstart": {"steps": 400, "batch_size": 6, "optimizer": "muon",
                                     "stop_at_success": 0.99, "check_every": 10**6},
                       "rounds": {"01": {"start": "00", "rollout_round": "00"},
                                  "02": {"start": "01", "rollout_round": "01"}}})  # fmt: skip
    generate_suite(params.envs, root / "data" / "envs")
    suite = load_suite(root / "data" / "envs")
    model, tok, _, _ = sft_warm_start(params, suite)
    save_policy(model, tok, root / "round_00")
    return root, params


def stage_round(root: Path, params: Params, r: str, lr: float, suite: str = "train") -> dict:
    """train@r on four scored episodes of random tokens: a large lr wrecks the policy."""
    from rollwise.policy.build import load_tokenizer
    from tasks import train as stage

    write_train_inputs(root, r, items_for(len(load_tokenizer(root / "models" / "round_00"))))
    guard = GuardConfig(tasks=3, max_drop=0.05, suite=suite)
    cfg = {"lr": lr, "epochs": 2, "minibatches": 1, "guard": guard}
    update = {"train": params.train.model_copy(update=cfg)}
    return stage.run(params.model_copy(update=update), root, r)


def test_train_stage_keeps_its_start_when_the_update_collapses(memorized, tmp_path):
    import shutil

    from rollwise.policy.build import load_policy

    source, params = memorized
    root = tmp_path / "project"
    shutil.copytree(source / "data" / "envs", root / "data" / "envs")
    shutil.copytree(source / "round_00", root / "models" / "round_00")
    model, tok = load_policy(root / "models" / "round_00")
    start = validation_success(model, tok, load_suite_of(root), GuardConfig(tasks=3), GREEDY)
    assert start > 0.05  # the memorized policy solves something: a collapse can show

    metrics = stage_round(root, params, "01", lr=1.0)
    assert metrics["guard_reverted"] == 1.0 and metrics["guard_start"] == start
    assert metrics["guard_after"] < start - 0.05 and metrics["guard_s"] > 0
    before = load_file(root / "models" / "round_00" / "model.safetensors")
    after = load_file(root / "models" / "round_01" / "model.safetensors")
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    record = json.loads((root / "models" / "round_01" / "guard.json").read_text())
    assert record["kept"] is False and record["kept_success"] == record["best_success"] == start
    marker = json.loads((root / "models" / "round_01" / "rollwise_policy.json").read_text())
    assert marker == {"round": 1, "from": "00", "reverted": True}

    # round 02 starts from round_01's record (no re-measure) and a harmless step is kept
    metrics = stage_round(root, params, "02", lr=1e-7)
    assert metrics["guard_reverted"] == 0.0 and metrics["guard_start"] == start
    record = json.loads((root / "models" / "round_02" / "guard.json").read_text())
    assert record["kept"] is True and record["kept_success"] == metrics["guard_after"]
    assert record["best_success"] == max(start, metrics["guard_after"])
    moved = load_file(root / "models" / "round_02" / "model.safetensors")
    assert any(not torch.equal(moved[k], v) for k, v in before.items())


def test_train_stage_validates_on_the_validation_suite_when_asked(memorized, tmp_path):
    """suite: validation decodes the warm start's validation suite (other environments, where
    the memorized policy solves less than on its train tasks), and its record says so."""
    import shutil

    from rollwise.policy.build import load_policy
    from rollwise.train.warmstart import validation_suite

    source, params = memorized
    root = tmp_path / "project"
    shutil.copytree(source / "data" / "envs", root / "data" / "envs")
    shutil.copytree(source / "round_00", root / "models" / "round_00")
    model, tok = load_policy(root / "models" / "round_00")
    cfg = GuardConfig(tasks=3, suite="validation")
    on_train = validation_success(model, tok, load_suite_of(root), cfg, GREEDY)
    on_validation = validation_success(
        model, tok, validation_suite(params, tmp_path / "v"), cfg, GREEDY
    )
    assert on_validation != on_train  # the two suites tell apart which one the stage read

    metrics = stage_round(root, params, "01", lr=1e-7, suite="validation")
    assert metrics["guard_start"] == on_validation and metrics["guard_reverted"] == 0.0
    record = json.loads((root / "models" / "round_01" / "guard.json").read_text())
    assert record["suite"] == "validation" and record["kept"] is True
    # a start recorded for the other suite is measured again, not reused
    metrics = stage_round(root, params, "02", lr=1e-7, suite="train")
    assert metrics["guard_start"] == validation_success(
        load_policy(root / "models" / "round_01")[0], tok, load_suite_of(root), cfg, GREEDY
    )


def test_validation_suite_refuses_a_tokenizer_without_its_words(tmp_path):
    from rollwise.policy.build import train_tokenizer
    from rollwise.train.guard import validation_guard_suite

    params = validate({"envs": TINY_SUITE, "train": {"guard": {"tasks": 2, "suite": "validation"}}})
    with pytest.raises(ValueError, match="train.guard.suite: validation"):
        validation_guard_suite(params, tmp_path / "v", train_tokenizer(["nothing of it"]))


def load_suite_of(root: Path):
    from rollwise.envs.runtime import load_suite

    return load_suite(root / "data" / "envs")
