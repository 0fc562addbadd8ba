"""A held-out set no stage trained on, for the learning benches: the warm start's validation
suite (`warmstart.stop_at_success` generates it and puts its words in the tokenizer). Its
environments, databases and tasks are new to every arm, and it holds ~960 tasks against the
suite's ~275 held-out ones, so an arm's figure on it has about half the sampling noise. SFT's
stop rule looked at its first `check_tasks` train tasks: they are left out."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rollwise.envs.runtime import Suite, load_suite
from rollwise.evaluate.full import evaluation_tasks
from rollwise.train.warmstart import validation_suite


def unseen_suite(p, cache: Path, tok) -> Path | None:
    """The validation suite's folder (generated once under `cache`), or None (printed why)
    when there is none (no stop_at_success) or its questions hold words the tokenizer lacks
    (a --warm-start built with other params)."""
    if p.warmstart.stop_at_success is None:
        print(json.dumps({"unseen_suite": "skipped: needs warmstart.stop_at_success"}))
        return None
    key = json.dumps([p.envs.model_dump(), p.warmstart.augment_suites], sort_keys=True)
    folder = cache / f"unseen_{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    if not folder.exists():
        validation_suite(p, folder)
    suite = load_suite(folder)
    if any(tok.unk_token_id in tok(t.prompt)["input_ids"] for t in suite.tasks.values()):
        print(json.dumps({"unseen_suite": "skipped: its words are not the warm start's tokens"}))
        return None
    return folder


def unseen_tasks(suite: Suite, p, kinds: set[str] | None = None) -> list:
    """Its tasks (of `kinds`, or all) in evaluate/full.py's order, less SFT's check tasks and,
    with `train.guard.suite: validation`, the guard's (both take the first tasks of that order)."""
    ordered = evaluation_tasks(suite, "train", 10**6)
    guard = p.train.guard
    seen = max(p.warmstart.check_tasks, guard.tasks if guard.suite == "validation" else 0)
    checked = {t.task_id for t in ordered[:seen]}
    return [t for t in ordered if t.task_id not in checked and (kinds is None or t.kind in kinds)]


def guard_suite(suite: Suite, p, unseen_dir: Path | None) -> Suite:
    """The suite a bench's guard validates on: the arm's own (`train.guard.suite: train`) or,
    with `validation`, this one, as train@r does (the pipeline generates the same suite)."""
    if p.train.guard.suite == "train" or p.train.guard.tasks == 0:
        return suite
    if unseen_dir is None:
        raise SystemExit("train.guard.suite=validation: pass --unseen-suite (the suite it reads)")
    return load_suite(unseen_dir)
