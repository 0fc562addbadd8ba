"""The BFCL multi-turn adapter against BFCL's own checker and executor (bfcl-eval's
multi_turn_checker eval()s BFCL's own call strings: its data, never model output)."""

from __future__ import annotations

import copy
import json
import re
import uuid

import pytest
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

from rollwise.envs.bfcl import (
    CATEGORIES,
    BFCLEnv,
    Entry,
    expected_of,
    plain,
    public_state,
    replay,
)
from rollwise.envs.generate import oracle_passes
from rollwise.envs.protocol import Environment, MultiTurn, TaskSource
from rollwise.policy.chat import MAX_CALLS_PER_TURN, action_text, encode, user_text
from rollwise.policy.hf import Completion
from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes


def fresh_name() -> str:
    """BFCL keeps instances in its module globals keyed by model name: one name per run."""
    return f"rollwise_{uuid.uuid4().hex}"


def bfcl_valid(entry: Entry, turns: list[list[str]]) -> bool:
    """BFCL's verdict on a model whose turns made these calls (one step per turn)."""
    prompt = {"id": entry.id, "initial_config": entry.initial_config,
              "involved_classes": entry.classes}  # fmt: skip
    model = [[calls] if calls else [] for calls in turns]
    category = f"multi_turn_{entry.category}"
    return multi_turn_checker(model, entry.ground_truth, prompt, category, fresh_name())["valid"]


def verdicts(env: BFCLEnv, edit) -> list[tuple[bool, bool]]:
    """(BFCL's verdict, ours) per entry, for each turn's ground-truth calls passed through
    `edit`: BFCL checks the edited call strings, we replay the edited parsed calls."""
    out = []
    for task in env.tasks():
        entry = env.entries[task.task_id]
        ours = replay(env, task, [edit(turn) for turn in env.oracle_turns(task)]).success
        out.append((bfcl_valid(entry, [edit(turn) for turn in entry.ground_truth]), ours))
    return out


@pytest.fixture(scope="module")
def base() -> BFCLEnv:
    return BFCLEnv(["base"])


def test_ground_truth_passes_ours_wherever_bfcl_passes(base):
    both = verdicts(base, lambda turn: turn)
    bfcl_passes = [ours for theirs, ours in both if theirs]
    assert len(both) == 200 and len(bfcl_passes) == 200  # pinned: BFCL passes all its own
    assert sum(bfcl_passes) == 200  # and so do we on every one of them


def test_wrong_call_sequences_fail_both(base):
    dropped = verdicts(base, lambda turn: turn[:-1])  # every turn's last call left out
    assert [v for v in dropped if v != (False, False)] == []  # pinned: all 200 fail both
    # Each turn's calls in reverse order: where order changes the state both fail, elsewhere
    # both pass (BFCL's response check ignores order). A verdict-for-verdict match.
    reordered = verdicts(base, lambda turn: turn[::-1])
    assert all(theirs == ours for theirs, ours in reordered)
    assert sum(ours for _, ours in reordered) == 90  # pinned: 90 pass, 110 fail


@pytest.mark.parametrize("category", ["miss_func", "miss_param", "long_context"])
def test_ground_truth_replays_in_every_category(category):
    both = verdicts(BFCLEnv([category]), lambda turn: turn)
    assert len(both) == 200 and all(theirs and ours for theirs, ours in both)  # pinned: 200


def test_replaying_an_oracle_twice_changes_neither_it_nor_the_final_state():
    """BFCL keeps list arguments by reference and later calls extend them (entries 90 and 147
    post a tweet whose mentions a later call appends to): the oracle must come out unchanged."""
    env = BFCLEnv(CATEGORIES)
    tasks = env.tasks()
    assert len(tasks) == 800  # pinned: every entry of the four categories
    for task in tasks:
        oracle = copy.deepcopy(task.oracle)
        finals = []
        for _ in range(2):
            assert replay(env, task, env.oracle_turns(task)).success, task.task_id
            assert task.oracle == oracle, task.task_id
            finals.append(plain(public_state(env.instances)))
        assert finals[0] == finals[1], task.task_id


def test_our_executor_gives_bfcls_results(base):
    """Our whitelisted executor on parsed calls renders exactly what BFCL's eval() renders."""
    for entry in base.entries.values():
        name, theirs = fresh_name(), []
        for turn in entry.ground_truth:
            results, _ = execute_multi_turn_func_call(
                turn, entry.initial_config, entry.classes, name, entry.id
            )
            theirs.append(results)
        assert expected_of(entry).results == theirs, entry.id


def test_protocols_and_generation_replay(base):
    assert isinstance(base, Environment) and isinstance(base, TaskSource)
    assert isinstance(base, MultiTurn)
    for task in base.tasks()[:20]:  # the generate stage's oracle replay, turn by turn
        assert oracle_passes(copy.copy(base), task), task.task_id


def test_turns_are_fed_in_order_and_missing_functions_revealed():
    env = BFCLEnv(["miss_func"], ids=["multi_turn_miss_func_0"])  # sort held out to turn 3
    (task,) = env.tasks()
    entry = env.entries[task.task_id]
    messages = env.reset(task, seed=0)
    assert messages[0]["role"] == "system" and messages[1:] == entry.turns[0]
    seen = [[t.name for t in env.tools()]]
    for t in range(1, len(entry.turns)):
        messages = env.next_turn("done")
        seen.append([s.name for s in env.tools()])
        if t == 3:
            docs, prompt = messages[-1]["content"].split("\n", 1)
            assert [d["function"]["name"] for d in json.loads(docs)] == ["sort"]
            assert "updated some more functions" in prompt
        else:
            assert messages == entry.turns[t]
    assert env.next_turn("done") is None
    assert ["sort" in names for names in seen] == [False, False, False, True, True]


def test_verify_reads_the_state(base):
    task = base.tasks()[0]  # multi_turn_base_0: file system and twitter
    assert replay(base, task, base.oracle_turns(task)).success
    base.instances["TwitterAPI"].tweet_counter += 1  # a change no call made
    scored = base.verify("", list(task.oracle))
    assert not scored.success and scored.scores["no_side_effects"] == 0.0
    # All calls in the first turn, later turns left empty: fails although every call was made.
    rushed = replay(base, task, [list(task.oracle)])
    assert not rushed.success and rushed.scores["answer_correct"] < 1.0


def test_fingerprint_follows_the_state(base):
    task = base.tasks()[0]
    base.reset(task, seed=0)
    fresh = base.fingerprint()
    base.reset(task, seed=1)
    assert base.fingerprint() == fresh
    base.step(task.oracle[0])
    assert base.fingerprint() != fresh


# ------------------------------------------------------------------------------ through the engine


class Tagged(BFCLEnv):
    """BFCLEnv with the entry's id in its system message: the scripted policy's only way to tell
    apart entries that open with the same request (state, tools and checks are BFCL's)."""

    def reset(self, task, seed):
        system, *rest = super().reset(task, seed)
        return [{**system, "content": f"{system['content']} [{task.task_id}]"}, *rest]


def byte_tokenizer(texts: list[str]):
    """Byte-level BPE with the policy's chat template: no [UNK], so any BFCL result or message
    round-trips and the decoded episode can be compared with the text it should be."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rollwise.policy.build import CHAT_TEMPLATE, SPECIAL_TOKENS, TAG_TOKENS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=alphabet, show_progress=False)  # fmt: skip
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens(TAG_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def turn_actions(calls: list) -> list[str]:
    """One user turn's assistant turns: its calls, MAX_CALLS_PER_TURN at a time, then a reply."""
    step = MAX_CALLS_PER_TURN
    chunks = [action_text(calls[i : i + step]) for i in range(0, len(calls), step)]
    return [*chunks, action_text(answer="Done.")]


class ScriptedTurns:
    """A policy that plays each entry's (edited) ground truth turn by turn: a user turn's calls,
    MAX_CALLS_PER_TURN per assistant turn, then a reply without calls, which asks for the next
    user turn. The entry is read off the prompt's tag; the turn, off its assistant cues."""

    def __init__(self, tok, env: BFCLEnv, edit):
        self.tok = tok
        self.actions = {
            t.task_id: [a for calls in env.oracle_turns(t) for a in turn_actions(edit(calls))]
            for t in env.tasks()
        }

    def generate(self, prompts, max_new_tokens, temperature=1.0, greedy=False, seed=None,
                 top_p=1.0):  # fmt: skip
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            entry_id = re.search(r"\[(multi_turn_\w+?_\d+)\]", text).group(1)
            turn = self.actions[entry_id][text.count("<|im_start|>assistant") - 1]
            ids = encode(self.tok, turn)
            out.append(Completion(ids, [-0.5] * len(ids), stopped=True))
        return out


def engine_run(category: str, edit=lambda turn: turn, max_turns: int = 64):
    env = Tagged([category])
    texts = [json.dumps(e.turns) for e in env.entries.values()]
    tok = byte_tokenizer(texts)
    tasks = env.tasks()
    specs = [EpisodeSpec(t.task_id, t, clone_env(env), t.task_id) for t in tasks]
    limits = Limits(max_turns=max_turns, max_new_tokens=100_000, max_context=10_000_000)
    episodes, steps = run_episodes(specs, ScriptedTurns(tok, env, edit), tok, limits)
    return env, tok, {t.task_id: t for t in tasks}, episodes


def user_turns(env: BFCLEnv, task) -> list[list[dict]]:
    """What next_turn says after each reply, on a fresh copy (miss_func reveals included)."""
    env = clone_env(env)
    env.reset(task, seed=0)
    return list(iter(lambda: env.next_turn("Done."), None))


@pytest.mark.parametrize("category", ["base", "miss_func", "miss_param", "long_context"])
def test_the_engine_feeds_every_user_turn_and_ground_truth_passes_every_entry(category):
    env, tok, tasks, episodes = engine_run(category)
    assert len(episodes) == 200  # pinned, as above: BFCL passes all 200 of its own
    assert [e["termination"] for e in episodes] == ["answer"] * 200
    assert sum(e["success"] for e in episodes) == 200  # and so do we, fed turn by turn
    for ep in episodes:
        entry, later = env.entries[ep["task_id"]], user_turns(env, tasks[ep["task_id"]])
        ids, mask, spans = ep["token_ids"], ep["loss_mask"], ep["turn_spans"]
        replies = [s for s in spans if tok.decode(ids[s[0] : s[1]]) == "Done.<|im_end|>"]
        assert len(replies) == len(entry.turns)  # one reply per user turn, the last one ends it
        assert ep["tool_calls"] == sum(map(len, entry.ground_truth))
        assert len(later) == len(entry.turns) - 1
        for (_, end), turn in zip(replies, later, strict=False):
            user_ids = encode(tok, user_text(tok, turn))  # each later user turn, exactly, mask 0
            assert ids[end : end + len(user_ids)] == user_ids
            assert not any(mask[end : end + len(user_ids)])


def test_through_the_engine_wrong_calls_or_a_conversation_cut_short_fail():
    *_, episodes = engine_run("base", lambda turn: turn[:-1])
    assert len(episodes) == 200 and not any(e["success"] for e in episodes)  # pinned: 0 pass
    # Two assistant turns: the first user turn's calls and its reply; later turns go unheard.
    env, _, _, episodes = engine_run("base", max_turns=2)
    several = [len(env.entries[e["task_id"]].turns) > 1 for e in episodes]
    assert [e["termination"] == "max_turns" for e in episodes] == several
    assert [e["success"] for e in episodes] == [not s for s in several]
    assert sum(several) == 197  # pinned: 3 base entries have one user turn (and pass)
