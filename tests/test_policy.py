"""The tiny policy: tokenizer, chat template and save/load round trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rollwise.policy.build import (
    TAG_TOKENS,
    build_model,
    load_policy,
    load_tokenizer,
    save_policy,
    train_tokenizer,
)
from rollwise.policy.chat import prompt_ids
from rollwise.types import ToolSpec
from tests.helpers import TINY_POLICY

CORPUS = [
    "What city does customer alice live in?",
    "You are the order desk. Call tools, then reply with the answer.",
    '{"name":"find_customer","arguments":{"name":"alice"}}',
    "find_customer get_customer customer_id order_id error not found paris",
    "system\nuser\nassistant\n",  # the chat template's own words (suite_tokenizer adds them)
]
SAMPLE = (
    "<|im_start|>user\nWhat city does customer alice live in? 0 7 42 999<|im_end|>\n"
    '<tool_call>{"name":"find_customer","arguments":{"customer_id":150}}</tool_call>'
    '<tool_response>{"error":"not found: 100"}</tool_response><|im_end|>'
)
TOOLS = [
    ToolSpec(
        "find_customer",
        "Look up a customer id by name.",
        {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    ),
    ToolSpec(
        "get_customer",
        "Read a customer record.",
        {
            "type": "object",
            "properties": {"customer_id": {"type": "integer"}},
            "required": ["customer_id"],
        },
    ),
]
MESSAGES = [
    {"role": "system", "content": "You are the order desk."},
    {"role": "user", "content": "What city does customer alice live in?"},
]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(CORPUS)


@pytest.fixture(scope="module")
def saved(tok, tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("policy") / "round_00"
    model = build_model(tok, TINY_POLICY)
    save_policy(model, tok, folder, {"round": 0})
    return folder, model


def test_every_number_below_1000_is_one_token(tok):
    unk = tok.unk_token_id
    for i in range(1000):
        ids = tok.encode(str(i), add_special_tokens=False)
        assert len(ids) == 1 and ids[0] != unk, i


def test_tags_and_words_are_single_tokens(tok):
    for tag in [*TAG_TOKENS, "<|im_start|>", "<|im_end|>", "<|endoftext|>"]:
        ids = tok.encode(tag, add_special_tokens=False)
        assert len(ids) == 1 and ids[0] != tok.unk_token_id, tag
    # a word is one token after a quote, a space or a bracket
    name = tok.convert_tokens_to_ids("alice")
    for text in ['"alice"', " alice", "(alice)", "alice"]:
        assert name in tok.encode(text, add_special_tokens=False), text
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.pad_token_id != tok.eos_token_id


def test_decode_round_trips(tok):
    ids = tok.encode(SAMPLE, add_special_tokens=False)
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == SAMPLE


def test_chat_template(tok):
    text = tok.apply_chat_template(
        MESSAGES, tools=[t.to_openai() for t in TOOLS], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\nYou are the order desk.\n<tools>\n")
    assert "find_customer(name)\nget_customer(customer_id)\n</tools><|im_end|>\n" in text
    assert "<|im_start|>user\nWhat city does customer alice live in?<|im_end|>\n" in text
    ids = prompt_ids(tok, MESSAGES, TOOLS)
    assert ids == tok.encode(text, add_special_tokens=False)
    no_cue = tok.apply_chat_template(MESSAGES, tools=None, tokenize=False)
    assert not no_cue.endswith("assistant\n") and "<tools>" not in no_cue
    tool_turn = tok.apply_chat_template(
        [*MESSAGES, {"role": "tool", "content": '{"customer_id":150}'}], tokenize=False
    )
    assert tool_turn.endswith(
        '<|im_start|>user\n<tool_response>{"customer_id":150}</tool_response><|im_end|>\n'
    )


def test_model_build_is_seeded(tok):
    a, b = build_model(tok, TINY_POLICY), build_model(tok, TINY_POLICY)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert a.config.vocab_size == len(tok)
    assert a.config.eos_token_id == tok.eos_token_id


def test_saved_folder_is_a_qwen2_checkpoint(saved):
    folder, _ = saved
    assert json.loads((folder / "config.json").read_text())["model_type"] == "qwen2"
    assert json.loads((folder / "rollwise_policy.json").read_text()) == {"round": 0}


def test_model_round_trip_gives_identical_logits(tok, saved):
    folder, model = saved
    loaded, _ = load_policy(folder)
    batch = torch.tensor(
        [
            tok.encode(SAMPLE, add_special_tokens=False)[:24],
            tok.encode(SAMPLE[::-1], add_special_tokens=False)[:24],
        ]
    )
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(input_ids=batch).logits, loaded(input_ids=batch).logits)


def test_loads_in_threads_at_once_keep_every_lm_head_tied(tok, saved):
    """transformers swaps PreTrainedModel.tie_weights for a no-op while it loads; unguarded,
    threads loading at once (the flow overlaps rollout and train) left the no-op in place and
    every later load got a random lm_head (it broke the ray executor tests after the policy-lag
    ones). The lock in policy.build keeps tying intact; a disabled tying is a named error."""
    from concurrent.futures import ThreadPoolExecutor

    from transformers import PreTrainedModel

    folder, model = saved
    original = PreTrainedModel.tie_weights
    try:
        with ThreadPoolExecutor(4) as pool:
            loaded = [m for m, _ in pool.map(lambda _: load_policy(folder), range(8))]
            built = list(pool.map(lambda _: build_model(tok, TINY_POLICY), range(4)))
        assert PreTrainedModel.tie_weights is original
        for m in loaded + built + [load_policy(folder)[0]]:
            assert m.lm_head.weight is m.model.embed_tokens.weight
        assert torch.equal(loaded[0].lm_head.weight, model.lm_head.weight)
        assert all(torch.equal(b.lm_head.weight, built[0].lm_head.weight) for b in built)
        PreTrainedModel.tie_weights = lambda *a, **k: None  # what the race used to leave behind
        with pytest.raises(RuntimeError, match=f"{folder}: config.tie_word_embeddings is true"):
            load_policy(folder)
    finally:
        PreTrainedModel.tie_weights = original


def test_load_policy_tokenizer_gives_the_same_ids(tok, saved):
    folder, _ = saved
    _, loaded = load_policy(folder)
    assert loaded.encode(SAMPLE, add_special_tokens=False) == tok.encode(
        SAMPLE, add_special_tokens=False
    )
    assert loaded.decode(tok.encode(SAMPLE, add_special_tokens=False)) == SAMPLE
    assert (loaded.eos_token_id, loaded.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    assert loaded.padding_side == "left"
    assert prompt_ids(loaded, MESSAGES, TOOLS) == prompt_ids(tok, MESSAGES, TOOLS)


def test_load_tokenizer_ignores_the_qwen2_config(tok, saved):
    """config.json says qwen2; AutoTokenizer must not swap in Qwen's tokenizer (other ids)."""
    folder, _ = saved
    loaded = load_tokenizer(folder)
    for text in [SAMPLE, "customer_id 150", "0 1 2 999", "<tool_call></tool_call>"]:
        assert loaded.encode(text, add_special_tokens=False) == tok.encode(
            text, add_special_tokens=False
        ), text
    assert len(loaded) == len(tok)
