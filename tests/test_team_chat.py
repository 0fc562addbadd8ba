"""rollout/team.py: a chat model as every team participant. A scripted backend stands in for the
model (what it writes is fixed; the protocol, prompts, parsing and records are the real ones);
bench/teamgym.py --model runs the tiny model itself."""

from __future__ import annotations

import json
import random
import sys

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

    def reply(prompt: str) -> str:
        if "Reply with the id" in prompt:
            return f"the answer is {right}"
        mine = [f for f in task.pivotal if f.phrase in prompt.split("Channel so far")[0]]
        heard = prompt.split("Channel so far")[1]
        fresh = [f.phrase for f in mine if f.phrase not in heard]
        return fresh[0] if fresh else "PASS"

    chat = ChatPolicy(Writes(tok, reply), tok)
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
