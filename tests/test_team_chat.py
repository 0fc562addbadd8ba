"""rollout/team.py: a chat model as every team participant. A scripted backend stands in for the
model (what it writes is fixed; the protocol, prompts, parsing and records are the real ones);
bench/teamgym.py --model runs the tiny model itself."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from rollwise.envs.team import make_tasks, setup
from rollwise.envs.teamplay import play, round_metrics, view_of
from rollwise.policy.build import build_model, save_policy, train_tokenizer
from rollwise.policy.chat import encode
from rollwise.policy.hf import Completion
from rollwise.rollout.team import ChatPolicy, view_messages


class Writes:
    """A backend whose reply is `reply(prompt text)`, token for token."""

    def __init__(self, tok, reply):
        self.tok, self.reply = tok, reply

    def generate(self, prompts, max_new_tokens, temperature=1.0, greedy=False, seed=None):
        out = []
        for ids in prompts:
            reply = encode(self.tok, self.reply(self.tok.decode(ids)))[:max_new_tokens]
            out.append(Completion(reply, [-0.5] * len(reply), stopped=True))
        return out


def corpus(tasks) -> list[str]:
    """Every word of the prompts the tasks' participants see (the chat template's rendering)."""
    scratch = train_tokenizer([])
    texts = ["PASS nothing yet participant none the answer is"]
    for t in tasks:
        texts += [t.brief.question, *(f.phrase for f in t.facts)]
        for c in ("single", "split"):
            s = setup(t, c, 3, seed=0)
            texts += [scratch.apply_chat_template(view_messages(view_of_start(t, s, p), a),
                                                  tokenize=False, add_generation_prompt=True)
                      for p in range(len(s.holdings)) for a in ("speak", "decide")]  # fmt: skip
    return texts


def view_of_start(task, s, p):
    from rollwise.envs.teamplay import TeamEpisode

    return view_of(TeamEpisode(task, s), p)


def test_a_chat_team_discloses_decides_and_keeps_every_turn_token_exact():
    (task,) = make_tasks("shop", 0, 1)
    tok = train_tokenizer(corpus([task]))
    right = task.decision
    chat = ChatPolicy(Writes(tok, teller(task)), tok)
    s = setup(task, "split", 3, seed=0)
    ep = play(task, s, chat, budget=8, seed=0)
    assert ep.success and ep.decision == right
    told = {f for m in ep.messages for f in m.pivotal}
    held = {f for p, hand in enumerate(s.holdings) if p != s.decider for f in hand}
    assert held & set(task.pivotal) <= told  # every privately held pivotal fact reached the channel
    decide = [t for t in chat.turns if t.act == "decide"]
    assert len(decide) == 1 and decide[0].participant == s.decider
    for turn in chat.turns:
        assert turn.completion_ids == encode(tok, turn.text)
        assert len(turn.logprobs) == len(turn.completion_ids)
        assert task.brief.question in tok.decode(turn.prompt_ids)
    assert round_metrics([ep])["disclosure_rate"] == 1.0


def test_a_reply_that_names_no_candidate_is_no_decision():
    (task,) = make_tasks("shop", 0, 1)
    tok = train_tokenizer(corpus([task]))
    chat = ChatPolicy(Writes(tok, lambda prompt: "PASS"), tok)
    ep = play(task, setup(task, "single", 3, seed=0), chat, budget=4, seed=0)
    assert ep.messages == [] and ep.decision is None and not ep.success
    assert chat.decide(view_of(ep, 0), random.Random(0)) is None


def test_teamgym_plays_a_policy_folder_as_every_participant(tmp_path, monkeypatch):
    from bench import teamgym
    from tests.helpers import TINY_POLICY

    tasks = make_tasks("shop", 0, 2)
    tok = train_tokenizer(corpus(tasks))
    save_policy(build_model(tok, TINY_POLICY), tok, tmp_path / "policy")
    out = tmp_path / "teamgym.json"
    argv = ["teamgym.py", "--worlds", "1", "--tasks", "2", "--model", str(tmp_path / "policy"),
            "--model-tasks", "2", "--max-new-tokens", "8", "--out", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    teamgym.main()
    model = json.loads(out.read_text())["model"]
    assert model["tasks"] == 2 and model["generations"] >= 2 * 3  # a decision per episode at least
    assert set(model["success_pct"]) == {"single", "split", "retrieval"}
    assert model["share_all_same_tasks"]["episodes"] == model["episodes"]


class Coin(Writes):
    """`reply`, except that a decision is made only on an even seed (else PASS: no decision):
    samples of one task end in mixed outcomes."""

    def generate(self, prompts, max_new_tokens, temperature=1.0, greedy=False, seed=None):
        out = []
        for ids, s in zip(prompts, seed, strict=True):
            text = self.tok.decode(ids)
            reply = "PASS" if "Reply with the id" in text and s % 2 else self.reply(text)
            ids = encode(self.tok, reply)[:max_new_tokens]
            out.append(Completion(ids, [-0.5] * len(ids), stopped=True))
        return out


def teller(task):
    def reply(prompt: str) -> str:
        if "Reply with the id" in prompt:
            return f"the answer is {task.decision}"
        mine = [f for f in task.pivotal if f.phrase in prompt.split("Channel so far")[0]]
        heard = prompt.split("Channel so far")[1]
        fresh = [f.phrase for f in mine if f.phrase not in heard]
        return fresh[0] if fresh else "PASS"

    return reply


def test_a_teachers_episode_becomes_sft_sequences_with_only_its_replies_as_targets():
    from rollwise.envs.teamplay import Scripted
    from rollwise.rollout.team import demo_sequences

    (task,) = make_tasks("shop", 0, 1)
    tok = train_tokenizer(corpus([task]))
    s = setup(task, "split", 3, seed=0)
    seqs = demo_sequences(tok, task, s, Scripted("all"), budget=8, seed=0)
    ep = play(task, s, Scripted("all"), budget=8, seed=0)
    replies = [tok.decode([i for i, m in zip(ids, mask, strict=True) if m]) for ids, mask in seqs]
    told = [r.removesuffix(tok.eos_token) for r in replies[:-1] if not r.startswith("PASS")]
    assert told == [m.text for m in ep.messages]  # every message, in order; passes are PASS
    assert replies[-1] == f"{ep.decision}{tok.eos_token}"  # the decision: the id alone
    for ids, mask in seqs:
        k = mask.index(1)
        assert set(mask[k:]) == {1} and task.brief.question in tok.decode(ids[:k])


def test_generation_credit_by_hand_outcome_plus_weighted_surprisal_drop():
    from rollwise.credit.cosir import generation_tables, surprisal_drops
    from rollwise.rollout.team import play_chats

    (task,) = make_tasks("shop", 0, 1)
    tok = train_tokenizer(corpus([task]))
    s = setup(task, "split", 3, seed=0)
    (won,) = play_chats([(task, s, 0)], ChatPolicy(Writes(tok, teller(task)), tok), budget=8)
    (lost,) = play_chats([(task, s, 0)], ChatPolicy(Writes(tok, lambda p: "PASS"), tok), budget=8)
    assert won.episode.success and not lost.episode.success
    drops = surprisal_drops(task, [m.disclosed for m in won.episode.messages])
    episodes, adv = generation_tables([won, lost], ["g", "g"], weight=0.5, std_norm=False, eps=1e-6)
    assert len(episodes) == len(won.turns) + len(lost.turns)
    mine = adv.iloc[: len(won.turns)]
    posted = won.posted()
    expected = [0.5 + (0.5 * drops[i] if i is not None else 0.0) for i in posted]
    assert mine["advantage"].tolist() == pytest.approx(expected)  # +1/2: centred outcome of 2
    theirs = adv.iloc[len(won.turns) :]["advantage"].tolist()
    assert theirs == pytest.approx([-0.5] * len(lost.turns))
    assert mine["surprisal_drop"].sum() == pytest.approx(sum(drops)) and sum(drops) > 0
    row = episodes.iloc[0]
    n = len(won.turns[0].prompt_ids)
    assert row["loss_mask"] == [0] * n + [1] * len(won.turns[0].completion_ids)
    assert row["logprobs"][n:] == won.turns[0].logprobs and adv.iloc[0]["span_start"] == n
    # outcome-only: weight 0 leaves every generation of an episode the same advantage
    _, flat = generation_tables([won, lost], ["g", "g"], weight=0.0, std_norm=False, eps=1e-6)
    assert set(flat.iloc[: len(won.turns)]["advantage"]) == {0.5}


def test_a_team_round_plays_credits_and_trains_the_policy(tmp_path):
    import torch

    from rollwise import loop
    from rollwise.config import read_raw, validate
    from tests.helpers import TINY_POLICY

    tasks = make_tasks("shop", 0, 2)
    tok = train_tokenizer(corpus(tasks))
    model = build_model(tok, TINY_POLICY)
    raw = read_raw(Path(__file__).resolve().parents[1] / "params.yaml")
    raw["rollout"]["samples_per_task"] = 4
    raw["credit"] = {"method": "cosir"}
    raw["train"] = {**raw["train"], "warmup_steps": 0, "lr": 1e-3}
    params = validate(raw)
    before = [w.detach().clone() for w in model.parameters()]
    backend = Coin(tok, teller(tasks[0]))
    done = loop.team_round(params, model, tok, None, tasks[:1], r=1, conditions=("split",),
                           backend=backend)  # fmt: skip
    outcomes = [p.episode.success for p in done.plays]
    assert len(done.plays) == 4 and any(outcomes) and not all(outcomes)
    assert done.metrics["generations"] == sum(len(p.turns) for p in done.plays)
    assert done.metrics["surprisal_bits"] > 0 and done.metrics["train_optimizer_steps"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_teamgym_trains_outcome_and_cosir_arms_from_one_warm_start(tmp_path, monkeypatch):
    from bench import teamgym
    from tests.helpers import TINY_POLICY

    tasks = make_tasks("shop", 0, 2)
    tok = train_tokenizer(corpus(tasks))
    save_policy(build_model(tok, TINY_POLICY), tok, tmp_path / "policy")
    out = tmp_path / "teamgym.json"
    argv = ["teamgym.py", "rollout.samples_per_task=2", "--worlds", "1", "--tasks", "2",
            "--model", str(tmp_path / "policy"), "--model-tasks", "1", "--max-new-tokens", "6",
            "--train", "--warm-steps", "2", "--rounds", "1", "--train-tasks", "1",
            "--eval-tasks", "2", "--out", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    teamgym.main()
    result = json.loads(out.read_text())
    trained = result["trained"]
    assert trained["warm_start"]["steps"] == 2 and trained["warm_start"]["demos"] > 0
    assert trained["episodes_per_arm"] == 1 * 1 * 2 * 2  # rounds x tasks x conditions x samples
    for arm in ("outcome", "cosir"):
        (r1,) = trained[arm]["rounds"]
        assert r1["generations"] >= 2 * 2  # a decision per episode at least
        assert set(trained[arm]["after"]["success_pct"]) == {"single", "split", "retrieval"}
    assert result["cosir_minus_outcome_pts"] == trained["cosir_minus_outcome_pts"]
    assert -100 <= result["cosir_minus_outcome_pts"] <= 100


def test_episodes_played_in_one_batch_are_the_episodes_played_alone():
    from rollwise.policy.hf import HFBackend
    from rollwise.rollout.team import play_chats
    from tests.helpers import TINY_POLICY

    tasks = make_tasks("shop", 0, 2)
    tok = train_tokenizer(corpus(tasks))
    chat = ChatPolicy(HFBackend(build_model(tok, TINY_POLICY), tok), tok, max_new_tokens=6)
    jobs = [(t, setup(t, c, 3, seed=0), g) for t in tasks for c in ("split", "single")
            for g in range(2)]  # fmt: skip
    together = play_chats(jobs, chat, budget=4)
    alone = [play(t, s, chat, 4, g) for t, s, g in jobs]
    for one, other in zip(together, alone, strict=True):
        assert [m.text for m in one.episode.messages] == [m.text for m in other.messages]
        assert one.episode.decision == other.decision
    assert len({tuple(p.turns[0].completion_ids) for p in together}) > 1  # they did sample
