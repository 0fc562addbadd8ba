"""bench/unseen.py: the learning benches' extra held-out set is the warm start's validation
suite, offered only when its words are the tokenizer's, less the tasks SFT's stop rule saw."""

from __future__ import annotations

from bench.unseen import guard_suite, unseen_suite, unseen_tasks
from rollwise.config import validate
from rollwise.envs.runtime import load_suite
from rollwise.evaluate.full import evaluation_tasks
from rollwise.policy.build import train_tokenizer
from rollwise.train.warmstart import fresh_suite, suite_tokenizer

ENVS = {"n_envs": 2, "domains": ["shop", "clinic"], "owners_per_env": 3, "max_records": 2,
        "tasks_per_env": 12, "heldout_envs": 0}  # fmt: skip


def test_unseen_suite_needs_its_words_and_leaves_out_the_checked_tasks(tmp_path):
    warm = {"stop_at_success": 0.5, "augment_suites": 1, "check_tasks": 5}
    p = validate({"envs": ENVS, "warmstart": warm})
    assert unseen_suite(validate({"envs": ENVS}), tmp_path, None) is None  # no stop rule
    # the suite SFT validated on: the same generator call warmstart makes
    validation = fresh_suite(p, tmp_path / "validation", p.warmstart.augment_suites + 1)
    assert unseen_suite(p, tmp_path, train_tokenizer(["nothing of it"])) is None  # [UNK]s

    folder = unseen_suite(p, tmp_path, suite_tokenizer(validation))
    assert folder is not None and folder.parent == tmp_path
    suite = load_suite(folder)
    assert set(suite.tasks) == set(validation.tasks)
    checked = {t.task_id for t in evaluation_tasks(suite, "train", 5)}
    picked = unseen_tasks(suite, p)
    assert len(picked) == len(suite.tasks) - 5 and not checked & {t.task_id for t in picked}
    long = unseen_tasks(suite, p, {"status", "amount", "cancel"})
    assert long and {t.kind for t in long} <= {"status", "amount", "cancel"}
    assert [t.task_id for t in long] == [t.task_id for t in picked if t in long]

    # a guard validating on this suite looks at its first guard.tasks tasks: left out too
    guard = {"tasks": 8, "suite": "validation"}
    guarded = validate({"envs": ENVS, "warmstart": warm, "train": {"guard": guard}})
    assert unseen_tasks(suite, guarded) == picked[3:]
    on_train = validate({"envs": ENVS, "warmstart": warm, "train": {"guard": {"tasks": 8}}})
    assert guard_suite(suite, on_train, folder) is suite  # suite: train reads the arm's own
    assert set(guard_suite(suite, guarded, folder).tasks) == set(validation.tasks)
