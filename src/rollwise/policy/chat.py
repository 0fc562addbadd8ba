"""The chat format as token pieces. Prompts, actions and observations are tokenized once each and
concatenated; rollout and SFT build sequences the same way, so training sees exactly the tokens
the policy produced (never a re-tokenization of the whole conversation)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from rollwise.policy.template import turn_after
from rollwise.types import Observation, ToolCall, ToolSpec

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
MAX_CALLS_PER_TURN = 8
# Code actions (rollout.action_mode: code): one fenced block of Python per turn, run in the
# sandbox (rollwise/sandbox), never here. The tools are functions of the block; a turn without
# a block is the answer. The block's text is data to this process: a regex finds it, nothing
# parses or runs it here.
CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
CODE_FORMAT = (
    "To act, reply with one block of Python:\n```python\n<code>\n```\n"
    "The tools are Python functions (arguments by name or in the order listed) returning the "
    "parsed result; a failed call raises ToolError. Keep intermediate results in variables: "
    "only what the code prints and the value of its last expression come back. Variables do "
    "not survive between blocks. Reply without a block to give the final answer. Functions:"
)


@dataclass
class Action:
    """A parsed assistant turn: tool calls, or a final answer, or an error to show the policy."""

    calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    error: str | None = None
    code: str | None = None  # a code action's Python source (action_mode: code)


def parse_action(text: str, eos: str = "<|im_end|>") -> Action:
    """Hermes/Qwen tool calls in assistant text. Model output is data: json.loads only."""
    text = text.replace(eos, "")
    bodies = TOOL_CALL.findall(text)
    if not bodies:
        if "<tool_call>" in text or "</tool_call>" in text:
            return Action(error="malformed tool call: unbalanced <tool_call> tags")
        return Action(answer=text.strip())
    if len(bodies) > MAX_CALLS_PER_TURN:
        return Action(
            error=f"too many tool calls in one turn ({len(bodies)} > {MAX_CALLS_PER_TURN})"
        )
    calls = []
    for body in bodies:
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):  # JSONDecodeError, and ints past 4300 digits
            return Action(error="malformed tool call: not valid JSON")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return Action(error='malformed tool call: expected {"name": ..., "arguments": {...}}')
        args = obj.get("arguments", {})
        if not isinstance(args, dict):
            return Action(error="malformed tool call: arguments must be an object")
        calls.append(ToolCall(obj["name"], args))
    return Action(calls=calls)


def parse_code_action(text: str, eos: str = "<|im_end|>") -> Action:
    """A code-mode assistant turn: one ```python block (code), or none (the answer)."""
    text = text.replace(eos, "")
    blocks = CODE_BLOCK.findall(text)
    if not blocks:
        if "```" in text:
            return Action(error="malformed code action: unbalanced ``` fence")
        if "<tool_call>" in text:
            return Action(error="in code mode, call tools as functions inside a ```python block")
        return Action(answer=text.strip())
    if len(blocks) > 1:
        return Action(error=f"one code block per turn, not {len(blocks)}")
    return Action(code=blocks[0])


def code_messages(messages: list[dict], tools: list[ToolSpec]) -> list[dict]:
    """The opening messages of a code-mode episode: the code format and the tools as Python
    signatures appended to the system message (the chat template then gets no `tools=`, so
    no tool-call instructions contradict it)."""
    listing = "\n".join(f"{t.name}({', '.join(t.parameters.get('properties', {}))})"
                        for t in tools)  # fmt: skip
    note = f"{CODE_FORMAT}\n{listing}"
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{note}"}, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]


def code_action_text(code: str, eos: str = "<|im_end|>") -> str:
    """An oracle code-mode turn in the exact format the policy is to emit."""
    return f"```python\n{code}\n```{eos}"


def prompt_ids(tokenizer, messages: list[dict], tools: list[ToolSpec]) -> list[int]:
    """The opening prompt through the tokenizer's own chat template, ending in the assistant cue."""
    ids = tokenizer.apply_chat_template(
        messages,
        tools=[t.to_openai() for t in tools],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    return list(ids)


def observation_text(tokenizer, observations: list[Observation]) -> str:
    """What follows a finished assistant turn: the tool results as `tool` messages, framed by the
    model's chat template, then the next assistant cue."""
    return turn_after(tokenizer, [{"role": "tool", "content": o.content} for o in observations])


def user_text(tokenizer, messages: list[dict]) -> str:
    """User messages as the chat template renders them after an answer's end-of-turn token,
    ending on the next assistant cue: the same framing as chat.observation_text."""
    if not messages or any(
        not isinstance(m, dict) or m.get("role") != "user" or not isinstance(m.get("content"), str)
        for m in messages
    ):
        raise ValueError(f"next_turn must return user messages or None, not {messages!r:.200}")
    return turn_after(tokenizer, [{"role": "user", "content": m["content"]} for m in messages])


def calls_text(calls: list[ToolCall]) -> str:
    return "".join(f"<tool_call>{c.to_json()}</tool_call>" for c in calls)


def action_text(
    calls: list[ToolCall] | None = None, answer: str | None = None, eos: str = "<|im_end|>"
) -> str:
    """An oracle assistant turn (for SFT), in the exact format the policy is to emit, ending on
    the model's end-of-turn token `eos` (the tokenizer's eos_token)."""
    return (calls_text(calls) if calls else f"{answer}") + eos


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)
