"""FARCA-style fact checks: a signal on each value the policy asserts, weighted by reliability
(the estimator, farca, is credit/farca.py).

Each value the policy asserts (every scalar in a tool call's arguments; every number or id-like
word, one holding a digit, in its final answer) is judged by a checker: is it supported by the
evidence the policy had at that point, the task prompt and the ok observations of the turns
before? The verdict becomes a per-token term on exactly that value's tokens: +coef if supported,
-coef if not, times its reliability.

Reliability by counterfactual evidence attribution: re-run the check without its key evidence
(every evidence text that mentions the value, masked) and measure how far the verdict moves,
|P(supported | evidence) - P(supported | counterfactual)| over `trials` re-checks each side. A
judgment that stands without its evidence is unreliable (near 0) and is down-weighted; one that
falls with it is reliable (near 1). A noisy checker (credit.facts.flip_rate) flips each verdict
with that probability, drawn from (seed, episode, step, value, side, trial) alone (envs.faults).

Departs from the paper in: an "unsupported" verdict's counterfactual plants the value as
evidence (masking nothing would leave every negative verdict unreliable); the environment's
hidden state is not evidence (a value the policy never saw is a guess, even a lucky one); the
default checker is an exact mention, not a learned judge (pass your own `checker`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rollwise.credit.iapo import parse
from rollwise.envs.faults import draw

Checker = Callable[[str, list[str]], bool]  # (value, evidence texts) -> supported?
FACT_COLUMNS = ["episode_id", "step", "value", "span_start", "span_end", "supported",
                "reliability"]  # fmt: skip
ANSWER = -1  # the `step` of a value asserted in the final answer


def pattern(value: str) -> re.Pattern:
    """The value as a whole word: `ord_5` is not in `ord_51`, `12` is not in `12.5`."""
    return re.compile(rf"(?<![\w.]){re.escape(value)}(?!\.?\w)")


def mentions(value: str, texts: list[str]) -> bool:
    """The exact checker: some evidence text mentions the value as a whole word."""
    found = pattern(value)
    return any(found.search(t) for t in texts)


def ordered_leaves(obj) -> list[str]:
    """Scalar values of a JSON document in document order, once each (booleans, nulls and
    empty strings assert nothing)."""
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, list):
        return list(dict.fromkeys(v for item in obj for v in ordered_leaves(item)))
    if obj is None or isinstance(obj, bool) or str(obj).strip() == "":
        return []
    return [str(obj).strip()]


def call_values(call: dict) -> list[str]:
    return ordered_leaves(parse(call["arguments"]))


def answer_values(answer: str) -> list[str]:
    """Numbers and id-like words (holding a digit) of a final answer, in order, once each."""
    words = (w.rstrip(".-") for w in re.findall(r"[\w.\-]+", answer or ""))
    return list(dict.fromkeys(w for w in words if any(c.isdigit() for c in w)))


def char_offsets(tokenizer, ids: list[int]) -> list[int]:
    """offsets[k]: where token k starts in decode(ids); offsets[-1] is the text's length."""
    return [len(tokenizer.decode(ids[:k])) for k in range(len(ids) + 1)]


def locate(value: str, text: str, offsets: list[int], cursor: int) -> tuple[int, int, int] | None:
    """(first token, end token, end char) of the value's first whole-word occurrence at or after
    `cursor` (else anywhere in the text); None if the text does not hold it."""
    found = pattern(value)
    m = found.search(text, cursor) or found.search(text)
    if m is None:
        return None
    a, b = m.span()
    hit = [k for k in range(len(offsets) - 1) if offsets[k] < b and offsets[k + 1] > a]
    return hit[0], hit[-1] + 1, b


@dataclass(frozen=True)
class Judge:
    """A checker, made noisy by `flip_rate`, and its counterfactual reliability estimate."""

    checker: Checker
    trials: int = 4
    flip_rate: float = 0.0
    seed: int = 0

    def verdict(self, value: str, texts: list[str], key: tuple) -> bool:
        flip = self.flip_rate > 0 and draw(self.seed, *key) < self.flip_rate
        return self.checker(value, texts) != flip

    def judge(self, value: str, evidence: list[str], key: tuple) -> tuple[bool, float]:
        """(supported?, reliability): how far the verdict moves without its key evidence."""
        supported = self.verdict(value, evidence, (*key, "verdict"))
        if supported:  # mask every text that mentions the value
            counter = [t for t in evidence if not mentions(value, [t])]
        else:  # plant it
            counter = [*evidence, value]
        p = self.share(value, evidence, (*key, "with"))
        q = self.share(value, counter, (*key, "without"))
        return supported, abs(p - q)

    def share(self, value: str, texts: list[str], key: tuple) -> float:
        """The share of `trials` re-checks that find the value supported."""
        return float(np.mean([self.verdict(value, texts, (*key, t)) for t in range(self.trials)]))


def episode_facts(ep, calls: dict, tokenizer, judge: Judge) -> list[tuple]:
    """FACT_COLUMNS rows of one episode, spans absolute in its token_ids."""
    ids = [int(i) for i in ep.token_ids]
    evidence = [tokenizer.decode(ids[: int(ep.prompt_len)])]
    rows = []
    spans = list(ep.turn_spans)
    for k, (s, e) in enumerate(spans):
        s, e = int(s), int(e)
        turn_calls = calls.get((ep.episode_id, s), [])
        asserted = [(c["step"], v) for c in turn_calls for v in call_values(c)]
        if not turn_calls and k == len(spans) - 1 and ep.termination == "answer":
            asserted = [(ANSWER, v) for v in answer_values(str(ep.answer))]
        offsets, text, cursor = char_offsets(tokenizer, ids[s:e]), tokenizer.decode(ids[s:e]), 0
        for step, value in asserted:
            where = locate(value, text, offsets, cursor)
            if where is None:  # not in the turn's own text (a template rewrote it): no span
                continue
            first, end, cursor = where
            ok, reliability = judge.judge(value, list(evidence), (ep.episode_id, step, value))
            rows.append((ep.episode_id, step, value, s + first, s + end, ok, reliability))
        evidence += [c["observation"] for c in turn_calls if c["observation_kind"] == "ok"]
    return rows


def fact_checks(
    episodes: pd.DataFrame, steps: pd.DataFrame, tokenizer, cfg, checker: Checker = mentions
) -> pd.DataFrame:
    """Every asserted value of every episode, judged and localized (cfg: credit.facts)."""
    from rollwise.credit.turns import calls_by_turn

    judge = Judge(checker, cfg.trials, cfg.flip_rate, cfg.seed)
    calls = calls_by_turn(steps)
    rows = []
    for ep in episodes.itertuples(index=False):
        rows += episode_facts(ep, calls, tokenizer, judge)
    return pd.DataFrame(rows, columns=FACT_COLUMNS)


def with_facts(episodes: pd.DataFrame, facts: pd.DataFrame) -> pd.DataFrame:
    """The episodes with a `facts` column: each one's fact rows as records."""
    by_episode = {ep: g.to_dict("records") for ep, g in facts.groupby("episode_id")}
    return episodes.assign(facts=[by_episode.get(ep, []) for ep in episodes["episode_id"]])


def fact_metrics(facts: pd.DataFrame) -> dict:
    if facts.empty:
        return {"facts": 0}
    return {"facts": len(facts), "facts_supported": float(facts["supported"].mean()),
            "fact_reliability_mean": float(facts["reliability"].mean())}  # fmt: skip
