"""rollwise.train.warmstart: augmentation suites are other databases, train tasks only, and the
tokenizer covers their words."""

from __future__ import annotations

import json

import pytest

from rollwise.config import validate
from rollwise.envs.generate import generate_suite
from rollwise.envs.runtime import load_suite
from rollwise.train.sft import oracle_sequence
from rollwise.train.warmstart import augment_suites, sft_warm_start, suite_tokenizer

SMALL = {"n_envs": 3, "tasks_per_env": 6, "heldout_envs": 1}


def test_augment_suites_are_fresh_databases_of_train_tasks(tmp_path):
    params = validate({"envs": SMALL, "warmstart": {"augment_suites": 2}})
    generate_suite(params.envs, tmp_path / "main")
    main = load_suite(tmp_path / "main")
    extra = augment_suites(params, tmp_path / "scratch")
    assert len(extra) == 2
    states = {(tmp_path / "main" / env / "state.sqlite").read_bytes() for env in main.envs}
    for suite in extra:
        assert len(suite.envs) == 3 and suite.tasks
        assert all(t.split == "train" for t in suite.tasks.values())
    found = [p.read_bytes() for p in (tmp_path / "scratch").glob("*/*/state.sqlite")]
    assert len(found) == 6 and not set(found) & states  # another seed: other databases
    tok = suite_tokenizer(main, *extra)
    unk = tok.convert_tokens_to_ids("[UNK]")
    for suite in extra:
        for task in suite.tasks.values():
            ids, _ = oracle_sequence(task, suite.envs[task.env_id], tok)
            assert unk not in ids, task.task_id


def test_no_augmentation_by_default_and_none_for_a_custom_suite(tmp_path):
    assert augment_suites(validate({"envs": SMALL}), tmp_path) == []
    custom = validate({"envs": {"custom": "examples.notes_env:make_env"},
                       "warmstart": {"augment_suites": 1}})  # fmt: skip
    with pytest.raises(ValueError, match="augment_suites"):
        augment_suites(custom, tmp_path)


def test_stop_at_success_checks_a_fresh_validation_suite(tmp_path):
    """warmstart.stop_at_success: every check_every steps a greedy check on tasks of a suite
    neither trained on nor evaluated; a target never reached runs every step, one reached at the
    first check stops there (a barely trained policy succeeds on no task: 0 >= 0.0 is reached,
    so the Field floor is bypassed with model_copy to pin the stopping rule itself)."""
    params = validate({"envs": SMALL, "policy": {"hidden": 32, "intermediate": 64},
                       "warmstart": {"steps": 4, "batch_size": 4, "stop_at_success": 1.0,
                                     "check_every": 2, "check_tasks": 3}})  # fmt: skip
    generate_suite(params.envs, tmp_path / "main")
    main = load_suite(tmp_path / "main")
    checks: list[dict] = []
    _, tok, losses, _ = sft_warm_start(params, main, checks=checks)
    assert len(losses) == 4
    assert [c["step"] for c in checks] == [2, 4]
    assert all(0.0 <= c["validation_success"] < 1.0 for c in checks)
    early = params.model_copy(
        update={"warmstart": params.warmstart.model_copy(update={"stop_at_success": 0.0})}
    )
    checks = []
    _, _, losses, _ = sft_warm_start(early, main, checks=checks)
    assert len(losses) == 2 and [c["step"] for c in checks] == [2]
    from rollwise.loop import warm_start  # a cached warm start says where its rule stopped it

    warm_start(early, main, tmp_path / "cache")
    (folder,) = (tmp_path / "cache").glob("sft_*")
    marker = json.loads((folder / "rollwise_policy.json").read_text())
    assert marker["sft_steps"] == 2 and [c["step"] for c in marker["checks"]] == [2]
    with pytest.raises(ValueError, match="stop_at_success"):
        sft_warm_start(validate({"envs": {"custom": "examples.notes_env:make_env"},
                                 "warmstart": {"stop_at_success": 0.5}}), main)  # fmt: skip


def test_a_pretrained_base_is_fine_tuned_with_its_own_tokenizer(tmp_path):
    """warmstart.finetune_model: loop.warm_start SFTs the given (model, tokenizer) on the train
    oracles instead of building a model: the same tokenizer comes back, the weights moved, and
    the cache hands the result back without training again."""
    import torch

    from rollwise import loop
    from rollwise.policy.build import build_model
    from tests.helpers import TINY_POLICY

    warm = {"steps": 3, "batch_size": 4, "finetune_model": True}
    params = validate({"envs": SMALL, "policy": TINY_POLICY.model_dump(), "warmstart": warm})
    generate_suite(params.envs, tmp_path / "envs")
    suite = load_suite(tmp_path / "envs")
    tok = suite_tokenizer(suite)
    base = build_model(tok, params.policy)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    model, got, info = loop.warm_start(params, suite, tmp_path / "cache", base=(base, tok))
    assert got is tok and model is base and info["sft_steps"] == 3
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    _, _, again = loop.warm_start(params, suite, tmp_path / "cache", base=(base, tok))
    assert "cached" in again


def test_a_suite_with_no_train_task_fails_naming_why(tmp_path):
    params = validate({"envs": {**SMALL, "heldout_envs": 3}, "warmstart": {"steps": 2}})
    generate_suite(params.envs, tmp_path / "main")
    with pytest.raises(ValueError, match="no train task"):
        sft_warm_start(params, load_suite(tmp_path / "main"))


def test_each_demo_carries_its_task_kind_for_the_balanced_draw(tmp_path):
    """warmstart.balance_kinds draws by the kinds demos_with_kinds reports: one per demo, the
    task's own kind, "direct" for a guessed answer; and the demos are demos()'s exactly."""
    from rollwise.train.warmstart import demos, demos_with_kinds

    params = validate({"envs": SMALL})
    generate_suite(params.envs, tmp_path / "s")
    suite = load_suite(tmp_path / "s")
    tok = suite_tokenizer(suite)
    seqs, kinds = demos_with_kinds([suite], tok, 0.5, seed=0)
    train = suite.split("train")
    assert len(seqs) == len(kinds) == len(train) and seqs == demos([suite], tok, 0.5, 0)
    assert {"direct"} < set(kinds) <= {"direct", *(t.kind for t in train)}
    assert all(k in ("direct", t.kind) for k, t in zip(kinds, train, strict=True))
