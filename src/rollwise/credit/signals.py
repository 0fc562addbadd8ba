"""What the token-level estimators read besides episodes and steps, attached as episode columns
before dispatch (as credit/tracker.py attach does for spo): the teacher's log-probs of the
student's sampled tokens (opd, opdvr: `teacher_logprobs`) and the per-value fact checks (farca:
`facts`). The impure part lives here (a teacher loaded, text decoded), so the estimators stay
pure functions of their one signature."""

from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd

from rollwise.credit.facts import fact_checks, fact_metrics, with_facts

TEACHER_METHODS = {"opd", "opdvr"}


def methods_used(cfg) -> set[str]:
    """credit.method, and farca's base estimator when it is one."""
    return {cfg.method} | ({cfg.facts.base} if cfg.method == "farca" else set())


def attach_token_inputs(
    cfg, episodes: pd.DataFrame, steps: pd.DataFrame, tokenizer, temperature: float
) -> tuple[pd.DataFrame, dict]:
    """(episodes with the columns credit.method reads, metrics of the fact checks); a method
    without token inputs gets the episodes back unchanged."""
    used, metrics = methods_used(cfg), {}
    if used & TEACHER_METHODS:
        if cfg.opd.teacher is None:
            raise ValueError(f"credit.opd.teacher: {sorted(used & TEACHER_METHODS)} need a policy "
                             "folder to score the sampled tokens")  # fmt: skip
        scores = teacher_logprobs(episodes, cfg.opd.teacher, temperature)
        episodes = episodes.assign(teacher_logprobs=scores)
    if "farca" in used:
        if tokenizer is None:
            raise ValueError("credit.method farca: localizing values needs the policy's tokenizer")
        facts = fact_checks(episodes, steps, tokenizer, cfg.facts)
        episodes, metrics = with_facts(episodes, facts), fact_metrics(facts)
    return episodes, metrics


@functools.lru_cache(maxsize=1)
def load_teacher(folder: str) -> tuple:
    """The teacher's (model, tokenizer), loaded once per folder across rounds."""
    from rollwise.policy.build import load_policy

    return load_policy(Path(folder))


def teacher_logprobs(episodes: pd.DataFrame, folder: str, temperature: float) -> list:
    """The teacher's log-prob of every token of every episode, through the hf backend."""
    from rollwise.policy.backends import open_hf

    with open_hf(Path(folder), None, load=lambda: load_teacher(str(folder))) as (backend, _):
        return backend.score([[int(i) for i in ids] for ids in episodes["token_ids"]], temperature)
