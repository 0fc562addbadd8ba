"""Token-level signals (issue 41): the per-token advantage path, OPD and OPDVR token rewards by
hand, fact checks localized to a value's exact tokens, and counterfactual reliability."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from rollwise.config import CreditConfig, FactsConfig, OPDConfig
from rollwise.credit import ESTIMATORS
from rollwise.credit.facts import Judge, answer_values, fact_checks, mentions, with_facts
from rollwise.credit.farca import fact_terms
from rollwise.credit.opd import gate, log_ratio
from rollwise.credit.signals import attach_token_inputs
from rollwise.credit.tokens import add_token_terms
from rollwise.curate.filters import weighted_advantages
from rollwise.train.trainer import token_advantages


class CharTokenizer:
    """One token per character: a value's token span is its character span."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(int(i)) for i in ids)


# ---------------------------------------------------------------- the per-token advantage path
def test_token_term_is_added_to_the_turn_advantage_and_scaled_by_the_curator_weight(tmp_path):
    episodes = pd.DataFrame({"episode_id": ["a"], "token_ids": [list(range(8))]})
    adv = pd.DataFrame({"episode_id": ["a", "a"], "step": [0, 1], "advantage": [1.0, -1.0],
                        "span_start": [2, 5], "span_end": [4, 8]})  # fmt: skip
    term = np.array([9, 9, 0.5, -0.25, 9, 0.0, 2.0, 1.0])  # off-span values never reach a turn
    both = add_token_terms(add_token_terms(adv, {"a": term}), {"a": term})  # terms compose
    assert both["token_advantage"].tolist() == [[1.0, -0.5], [0.0, 4.0, 2.0]]
    assert token_advantages(episodes, both)[0] == [0, 0, 2.0, 0.5, 0, -1.0, 3.0, 1.0]
    decisions = pd.DataFrame({"episode_id": ["a"], "weight": [0.5]})
    half = weighted_advantages(both, decisions)
    assert token_advantages(episodes, half)[0] == [0, 0, 1.0, 0.25, 0, -0.5, 1.5, 0.5]
    half.to_parquet(tmp_path / "advantages.parquet")  # the credit stage's file, read by train
    back = pd.read_parquet(tmp_path / "advantages.parquet")
    assert token_advantages(episodes, back)[0] == [0, 0, 1.0, 0.25, 0, -0.5, 1.5, 0.5]
    assert token_advantages(episodes, adv)[0] == [0, 0, 1, 1, 0, -1, -1, -1]  # no column: as before


# ---------------------------------------------------------------- OPD / OPDVR by hand
def opd_batch() -> pd.DataFrame:
    """One group, a success and a failure; two turns each; prompt tokens 0-1."""
    mask = [0, 0, 1, 1, 0, 1, 1]
    return pd.DataFrame({
        "episode_id": ["win", "lose"], "group": ["t", "t"], "reward": [1.0, 0.0],
        "success": [True, False], "token_ids": [list(range(7))] * 2, "loss_mask": [mask] * 2,
        "turn_spans": [[[2, 4], [5, 7]]] * 2, "termination": ["answer"] * 2, "answer": ["x"] * 2,
        "logprobs": [[0, 0, -1.0, -2.0, 0, -0.5, -3.0], [0, 0, -1.0, -2.0, 0, -0.5, -3.0]],
        "teacher_logprobs": [[-7, -7, -0.5, -2.5, -7, -0.5, -1.0]] * 2,
    })  # fmt: skip


def test_opd_reward_is_teacher_minus_student_log_prob_on_policy_tokens():
    ep = opd_batch().iloc[0]
    r = log_ratio(ep.teacher_logprobs, ep.logprobs, ep.loss_mask)
    assert r.tolist() == [0, 0, 0.5, -0.5, 0, 0.0, 2.0]


def test_opdvr_gate_signs_on_a_success_and_a_failure():
    r = np.array([0.5, -0.5, 0.0, 2.0])
    assert gate(r, True).tolist() == [0.5, 0.0, 0.0, 2.0]  # success: never negative
    assert gate(r, False).tolist() == [0.0, -0.5, 0.0, 0.0]  # failure: never positive


def test_opd_and_opdvr_add_their_terms_to_grpo_with_no_mixing_weight():
    cfg = CreditConfig(method="opdvr", opd=OPDConfig(teacher="unused"))
    episodes = opd_batch()
    grpo = token_advantages(episodes, ESTIMATORS["grpo"](episodes, pd.DataFrame(), cfg))
    opd = token_advantages(episodes, ESTIMATORS["opd"](episodes, pd.DataFrame(), cfg))
    opdvr = token_advantages(episodes, ESTIMATORS["opdvr"](episodes, pd.DataFrame(), cfg))

    def a(x):
        return pytest.approx(x, abs=1e-5)

    assert grpo[0] == a([0, 0, 1, 1, 0, 1, 1]) and grpo[1] == a([0, 0, -1, -1, 0, -1, -1])
    assert opd[0] == a([0, 0, 1.5, 0.5, 0, 1, 3]) and opd[1] == a([0, 0, -0.5, -1.5, 0, -1, 1])
    assert opdvr[0] == a([0, 0, 1.5, 1, 0, 1, 3])  # success: only the teacher's raises
    assert opdvr[1] == a([0, 0, -1, -1.5, 0, -1, -1])  # failure: only its cuts
    assert set(OPDConfig.model_fields) == {"teacher", "base"}  # zero new knobs


def test_opd_without_a_teacher_fails_naming_the_key():
    with pytest.raises(ValueError, match="credit.opd.teacher"):
        attach_token_inputs(CreditConfig(method="opdvr"), opd_batch(), pd.DataFrame(), None, 1.0)


def test_backend_score_is_the_sampled_log_prob_so_self_distillation_gives_zero(tmp_path):
    from rollwise.credit.signals import teacher_logprobs
    from rollwise.policy.build import build_model, save_policy
    from rollwise.policy.hf import HFBackend
    from tests.helpers import TINY_POLICY, suite_and_tokenizer

    torch.set_num_threads(1)
    _, tok = suite_and_tokenizer(tmp_path / "envs")
    model = build_model(tok, TINY_POLICY).eval()
    prompt = tok.encode("find the order")
    out = HFBackend(model, tok).generate([prompt], 6, temperature=0.7, seed=[3])[0]
    seq = prompt + out.token_ids
    scored = HFBackend(model, tok).score([seq, prompt], temperature=0.7)
    assert len(scored[0]) == len(seq) and scored[1] == pytest.approx(scored[0][: len(prompt)])
    assert scored[0][len(prompt) :] == pytest.approx(out.logprobs, abs=1e-5)
    save_policy(model, tok, tmp_path / "teacher")
    episodes = pd.DataFrame({"token_ids": [seq]})
    via_folder = teacher_logprobs(episodes, str(tmp_path / "teacher"), 0.7)[0]
    assert via_folder[len(prompt) :] == pytest.approx(out.logprobs, abs=1e-5)


# ---------------------------------------------------------------- fact checks
PROMPT = "user: what is the total of order ord_5?\n"
CALL = '<tool_call>{"name":"get_order","arguments":{"order_id":"ord_5","limit":3}}</tool_call>'
OBSERVATION = json.dumps({"id": "ord_5", "total": 42})
ANSWER = "The total is 42, not 77."


def fact_episode() -> tuple[pd.DataFrame, pd.DataFrame]:
    tok = CharTokenizer()
    ids = tok.encode(PROMPT + CALL + "\n" + OBSERVATION + "\n" + ANSWER)
    call_start = len(PROMPT)
    answer_start = len(ids) - len(ANSWER)
    episodes = pd.DataFrame({
        "episode_id": ["e"], "group": ["t"], "reward": [1.0], "success": [True],
        "token_ids": [ids], "prompt_len": [call_start], "termination": ["answer"],
        "answer": [ANSWER], "loss_mask": [[1] * len(ids)],
        "turn_spans": [[[call_start, call_start + len(CALL)], [answer_start, len(ids)]]],
    })  # fmt: skip
    steps = pd.DataFrame({
        "episode_id": ["e"], "step": [0], "tool": ["get_order"],
        "arguments": [json.dumps({"order_id": "ord_5", "limit": 3})],
        "observation": [OBSERVATION], "observation_kind": ["ok"],
        "span_start": [call_start], "span_end": [call_start + len(CALL)],
        "fingerprint_before": ["s"], "fingerprint_after": ["s"],
    })  # fmt: skip
    return episodes, steps


def test_fact_checks_localize_each_value_to_its_exact_tokens():
    episodes, steps = fact_episode()
    facts = fact_checks(episodes, steps, CharTokenizer(), FactsConfig())
    text = CharTokenizer().decode(episodes["token_ids"][0])
    got = {r.value: (r.step, r.span_start, r.span_end, r.supported) for r in facts.itertuples()}
    call_at, answer_at = len(PROMPT), text.rindex(ANSWER)
    ord5 = call_at + CALL.index("ord_5")
    assert got["ord_5"] == (0, ord5, ord5 + 5, True)  # from the prompt
    limit = call_at + CALL.index(":3}") + 1
    assert got["3"] == (0, limit, limit + 1, False)  # nothing said 3
    v42, v77 = answer_at + ANSWER.index("42"), answer_at + ANSWER.index("77")
    assert got["42"] == (-1, v42, v42 + 2, True)  # read from the observation
    assert got["77"] == (-1, v77, v77 + 2, False)
    assert text[ord5 : ord5 + 5] == "ord_5" and text[v77 : v77 + 2] == "77"
    assert len(facts) == 4


def test_farca_puts_the_signal_on_the_value_tokens_only():
    episodes, steps = fact_episode()
    cfg = CreditConfig(method="farca", facts=FactsConfig(coef=0.5))
    episodes, metrics = attach_token_inputs(cfg, episodes, steps, CharTokenizer(), 1.0)
    assert metrics["facts"] == 4 and metrics["fact_reliability_mean"] == 1.0
    adv = token_advantages(episodes, ESTIMATORS["farca"](episodes, steps, cfg))[0]
    text = CharTokenizer().decode(episodes["token_ids"][0])
    v77 = text.rindex("77")
    # a singleton group: grpo gives 0, so what is left is the fact terms alone
    assert adv[v77 : v77 + 2] == [-0.5, -0.5] and adv[v77 - 1] == 0 and adv[v77 + 2] == 0
    ord5 = text.index("ord_5", len(PROMPT))
    assert adv[ord5 : ord5 + 5] == [0.5] * 5
    assert sum(1 for a in adv if a != 0) == 5 + 1 + 2 + 2


def test_reliability_near_zero_when_the_judgment_ignores_its_evidence():
    evidence = ["the id is ord_5", "nothing here"]
    ignores = Judge(lambda value, texts: True, trials=200, flip_rate=0.1, seed=1)
    supported, reliability = ignores.judge("ord_5", evidence, ("e", 0))
    assert reliability < 0.1
    assert Judge(lambda v, t: True).judge("ord_5", evidence, ("e", 0)) == (True, 0.0)


def test_reliability_near_one_when_the_judgment_depends_on_its_evidence():
    evidence = ["the id is ord_5", "nothing here"]
    assert Judge(mentions).judge("ord_5", evidence, ("e", 0)) == (True, 1.0)
    assert Judge(mentions).judge("ord_9", evidence, ("e", 0)) == (False, 1.0)  # planted
    noisy = Judge(mentions, trials=200, flip_rate=0.1, seed=1)
    _, reliability = noisy.judge("ord_5", evidence, ("e", 0))
    assert 0.7 < reliability < 0.9  # |(1 - q) - q| = 0.8 at flip rate q = 0.1


def test_unweighted_farca_counts_an_unreliable_judgment_fully():
    episodes = pd.DataFrame({"episode_id": ["e"], "token_ids": [list(range(4))]})
    facts = pd.DataFrame([{"episode_id": "e", "step": 0, "value": "v", "span_start": 1,
                           "span_end": 3, "supported": True, "reliability": 0.0}])  # fmt: skip
    ep = with_facts(episodes, facts)
    assert fact_terms(ep, FactsConfig(coef=0.5))["e"].tolist() == [0, 0, 0, 0]
    assert fact_terms(ep, FactsConfig(coef=0.5, weighted=False))["e"].tolist() == [0, 0.5, 0.5, 0]


def test_answer_values_are_numbers_and_ids():
    assert answer_values("Order ord_5 costs 12.5 dollars, 3 items.") == ["ord_5", "12.5", "3"]
    assert not mentions("12", ["total 12.5"]) and mentions("12.5", ["total 12.5."])


def test_loop_credit_runs_a_token_method_end_to_end():
    from rollwise import loop
    from rollwise.config import apply_overrides, read_raw, validate
    from tests.test_config import REPO

    raw = apply_overrides(read_raw(REPO / "params.yaml"), {"credit.method": "farca"})
    params = validate(raw)
    episodes, steps = fact_episode()
    decisions = pd.DataFrame({"episode_id": ["e"], "kept": [True], "weight": [1.0]})
    done = loop.credit(params, episodes, steps, decisions, loop.RoundState(), CharTokenizer())
    assert done.metrics["facts"] == 4 and done.metrics["turns_with_token_term"] == 1.0
    with pytest.raises(ValueError, match="tokenizer"):
        loop.credit(params, episodes, steps, decisions, loop.RoundState())
