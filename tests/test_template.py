"""Turns framed by any chat template (policy/template.py) and the checks on a user's model
(policy/build.py materialize_model): the tiny ChatML template, a Llama-3-style one written here,
and bad inputs that must fail before anything heavy, naming the file and what is wrong."""

from __future__ import annotations

import copy
import json

import pytest

from rollwise.policy.build import (
    ModelSourceError,
    build_model,
    load_tokenizer,
    materialize_model,
    save_policy,
)
from rollwise.policy.chat import observation_text, prompt_ids, user_text
from rollwise.policy.template import (
    TemplateError,
    check_template,
    render,
    renders_tools,
    with_tools_block,
)
from rollwise.types import Observation
from tests.helpers import TINY_POLICY, suite_and_tokenizer

# Llama-3's framing: header tokens around each role, <|eot_id|> ends every turn; ignores tools=.
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{{ m.content | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
CHATML_NO_TOOLS = (  # SmolLM2's kind: ChatML that renders nothing for tools=
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HEADERS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


@pytest.fixture(scope="module")
def suite_tok(tmp_path_factory):
    return suite_and_tokenizer(tmp_path_factory.mktemp("suite"))


def llama_tokenizer(tok, tools_format="compact"):
    """The suite's word-level tokenizer speaking a Llama-3-style template (wrapped, since it
    ignores tools=), with <|eot_id|> as its eos."""
    tok = copy.deepcopy(tok)
    tok.add_special_tokens({"additional_special_tokens": HEADERS})
    tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|eot_id|>"
    tok.chat_template = LLAMA3
    assert not renders_tools(tok)
    tok.chat_template = with_tools_block(LLAMA3, tools_format)
    check_template(tok, "llama-style")
    return tok


def test_tiny_template_frames_turns_as_before(suite_tok):
    _, tok = suite_tok
    check_template(tok, "tiny")
    both = observation_text(tok, [Observation("a", "ok"), Observation("b", "ok")])
    body = "<tool_response>a</tool_response><tool_response>b</tool_response>"
    assert both == f"\n<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n"
    said = user_text(tok, [{"role": "user", "content": "more"}])
    assert said == "\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"


def whole_conversation(task, env, tok) -> str:
    """The oracle conversation rendered by the template in one piece (no pieces appended)."""
    from rollwise.policy.chat import calls_text

    messages = env.reset(task, seed=0)
    for call in task.oracle:
        messages.append({"role": "assistant", "content": calls_text([call])})
        messages.append({"role": "tool", "content": env.step(call).content})
    messages.append({"role": "assistant", "content": task.answer})
    tools = [t.to_openai() for t in env.tools()]
    return render(tok, messages, tools=tools)


@pytest.mark.parametrize("kind", ["tiny", "llama3"])
def test_oracle_pieces_are_the_whole_conversation_token_for_token(suite_tok, kind):
    from rollwise.train.sft import oracle_sequence

    suite, tok = suite_tok
    tok = tok if kind == "tiny" else llama_tokenizer(tok)
    for task in list(suite.tasks.values())[:6]:
        env = copy.copy(suite.envs[task.env_id])
        ids, mask = oracle_sequence(task, env, tok)
        whole = whole_conversation(task, copy.copy(suite.envs[task.env_id]), tok)
        whole = whole[: whole.rindex(tok.eos_token) + len(tok.eos_token)]  # ends on the answer
        assert ids == tok.encode(whole, add_special_tokens=False), task.task_id
        policy = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
        assert policy.endswith(f"{task.answer}{tok.eos_token}") and "<tool_call>" in policy
        assert "<|start_header_id|>" not in policy and "<tool_response>" not in policy


def test_llama_style_prompt_lists_tools_in_its_own_system_turn(suite_tok):
    suite, tok = suite_tok
    tok = llama_tokenizer(tok)
    task = next(iter(suite.tasks.values()))
    env = suite.envs[task.env_id]
    text = tok.decode(prompt_ids(tok, env.reset(task, 0), env.tools()))
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
    assert "<tools>" in text and f"{env.tools()[0].name}(" in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    obs = observation_text(tok, [Observation('{"ok": 1}', "ok")])
    assert obs == (
        "<|start_header_id|>user<|end_header_id|>\n\n<tool_response>\n"
        '{"ok": 1}\n</tool_response><|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n'
    )


def test_hermes_format_lists_tools_as_json(suite_tok):
    suite, tok = suite_tok
    task = next(iter(suite.tasks.values()))
    env = suite.envs[task.env_id]
    compact = llama_tokenizer(tok, "compact")
    hermes = llama_tokenizer(tok, "hermes")
    text = render(hermes, env.reset(task, 0), tools=[t.to_openai() for t in env.tools()])
    assert '{"type": "function", "function": {"name": ' in text and "# Tools" in text
    short = prompt_ids(compact, env.reset(task, 0), env.tools())
    assert len(prompt_ids(hermes, env.reset(task, 0), env.tools())) > len(short)


def test_llama_style_engine_episode_masks(suite_tok):
    from rollwise.policy.hf import HFBackend
    from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes
    from tests.test_chat import BiasedLMHead

    suite, tok = suite_tok
    tok = llama_tokenizer(tok)
    model = build_model(tok, TINY_POLICY)
    BiasedLMHead(model, tok)
    tasks = list(suite.tasks.values())[:4]
    specs = [EpisodeSpec(f"e{i}", t, clone_env(suite.envs[t.env_id])) for i, t in enumerate(tasks)]
    limits = Limits(max_turns=3, max_new_tokens=10, max_context=512)
    episodes, _ = run_episodes(specs, HFBackend(model, tok), tok, limits)
    gaps = 0
    for ep in episodes:
        spans, ids = ep["turn_spans"], ep["token_ids"]
        for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False):
            assert ids[end - 1] == tok.eos_token_id  # each turn ended on <|eot_id|>
            text = tok.decode(ids[end:nxt])
            assert text.startswith("<|start_header_id|>user<|end_header_id|>\n\n<tool_response>")
            assert text.endswith("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
            assert not any(ep["loss_mask"][end:nxt])
            gaps += 1
    assert gaps > 0, "no observation was framed: the test checked nothing"


# ------------------------------------------------------------------------------ bad input


REVERSED = (  # renders the newest message first: appending a turn changes what came before
    "{% for m in messages | reverse %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize(
    "template, missing",
    [
        (CHATML_NO_TOOLS.replace("<|im_start|>assistant\n", ""), "no generation prompt"),
        (CHATML_NO_TOOLS.replace("<|im_end|>\n{% endfor", "\n{% endfor"), "eos token"),
        (REVERSED, "re-renders earlier turns"),
    ],
)
def test_a_template_that_cannot_frame_turns_fails_naming_the_model(
    suite_tok, tmp_path, template, missing
):
    _, tok = suite_tok
    folder = tmp_path / "bad_model"
    save_policy(build_model(tok, TINY_POLICY), tok, folder)
    (folder / "chat_template.jinja").write_text(template)
    with pytest.raises(TemplateError, match=missing) as err:
        materialize_model(str(folder), tmp_path / "out")
    assert str(folder) in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_folder_without_a_tokenizer_fails_naming_it(suite_tok, tmp_path):
    _, tok = suite_tok
    folder = tmp_path / "weights_only"
    build_model(tok, TINY_POLICY).save_pretrained(folder)
    with pytest.raises(ModelSourceError, match="no tokenizer") as err:
        materialize_model(str(folder), tmp_path / "out")
    assert str(folder) in str(err.value) and not (tmp_path / "out").exists()


def test_a_folder_that_is_not_a_causal_lm_fails(tmp_path):
    (tmp_path / "enc").mkdir()
    (tmp_path / "enc" / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(ModelSourceError, match="'t5' is not a causal LM"):
        materialize_model(str(tmp_path / "enc"), tmp_path / "out")


def write_gguf(path, arch: str, kind: str = "model") -> None:
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch)
    writer.add_type(kind)
    writer.add_tokenizer_model("gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(
    "arch, kind, message",
    [("bert", "model", "'bert' is not a causal LM"), ("llama", "adapter", "a GGUF adapter")],
)
def test_a_gguf_that_is_not_a_causal_lm_fails_from_its_header(tmp_path, arch, kind, message):
    pytest.importorskip("gguf")
    path = tmp_path / f"{arch}.gguf"
    write_gguf(path, arch, kind)
    with pytest.raises(ModelSourceError, match=message) as err:
        materialize_model(str(path), tmp_path / "out")
    assert str(path) in str(err.value) and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "name, content, message",
    [("junk.gguf", b"not a gguf", "not a readable GGUF"), ("model.bin", b"x", "not a .gguf")],
)
def test_a_file_that_is_no_gguf_fails(tmp_path, name, content, message):
    pytest.importorskip("gguf")
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ModelSourceError, match=message):
        materialize_model(str(tmp_path / name), tmp_path / "out")


def test_an_unknown_model_name_says_what_is_accepted(tmp_path):
    with pytest.raises(ModelSourceError, match="SmolLM2-135M-Instruct"):
        materialize_model("no/such/model", tmp_path / "out")


def test_a_folder_whose_template_ignores_tools_is_saved_wrapped(suite_tok, tmp_path):
    suite, tok = suite_tok
    folder = tmp_path / "chatml"
    save_policy(build_model(tok, TINY_POLICY), tok, folder)
    (folder / "chat_template.jinja").write_text(CHATML_NO_TOOLS)
    assert not renders_tools(load_tokenizer(folder))
    out = materialize_model(str(folder), tmp_path / "out", "hermes")
    assert out["params_m"] > 0
    saved = load_tokenizer(tmp_path / "out")
    assert renders_tools(saved)
    task = next(iter(suite.tasks.values()))
    env = suite.envs[task.env_id]
    text = saved.decode(prompt_ids(saved, env.reset(task, 0), env.tools()))
    assert "<|im_start|>system\n" in text and '"name": "' in text
    marker = json.loads((tmp_path / "out" / "rollwise_policy.json").read_text())
    assert marker["tools_format"] == "hermes"
