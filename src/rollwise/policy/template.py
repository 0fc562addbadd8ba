"""Framing turns with any model's own chat template.

The engine appends pieces token-in/token-out: the prompt, each generated turn (ending on the
model's eos token), then what follows it (tool results or a user turn, up to the next assistant
cue). That last piece is cut from the template itself: render a probe conversation ending on an
assistant reply, render it again with the new messages and the generation prompt, keep the
difference. So a Llama-3-style template frames observations its way, ChatML its way.

A template that ignores `tools=` (SmolLM2's, most base chat templates) is wrapped once, when the
model is materialized (policy/build.py): a Jinja preamble puts a tools block into the system
message (the compact listing or Qwen2.5's Hermes JSON section: `policy.tools_format`) and turns
`tool` messages into user turns holding `<tool_response>` blocks. The wrapped template is saved
with the checkpoint, so every later stage, and vLLM, render the same text.

A template rollwise cannot frame with fails here, naming the model and what is missing.
"""

from __future__ import annotations

from typing import Literal

TOOLS_FORMATS = ("compact", "hermes")
ToolsFormat = Literal["compact", "hermes"]

PROBE = [
    {"role": "user", "content": "rollwise probe question"},
    {"role": "assistant", "content": "rollwise probe reply"},
]
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "rollwise_probe_tool",
        "description": "probe",
        "parameters": {"type": "object", "properties": {"probe_arg": {"type": "string"}}},
    },
}
WRAP_MARK = "{#- rollwise: tools block and tool turns #}"
CALL_FORMAT = '<tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>'
COMPACT_HEAD = f"To call a tool, reply with {CALL_FORMAT}, one per call. Tools:\n<tools>"
HERMES_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
HERMES_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


class TemplateError(ValueError):
    """The model's chat template cannot frame rollwise's turns; says which model and why."""


def literal(text: str) -> str:
    """`text` as a Jinja string literal (Jinja unescapes backslash escapes like Python)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def tools_block(tools_format: ToolsFormat) -> str:
    """Jinja that sets rw.block to the tools listing for `tools` (OpenAI-style specs)."""
    if tools_format == "hermes":
        line = "(t | tojson)"
        head, tail = HERMES_HEAD, HERMES_TAIL
    else:
        line = (
            "f.name + '(' + ((f.parameters.properties | list | join(',')) "
            "if f.parameters is defined and f.parameters.properties is defined else '') + ')'"
        )
        head, tail = COMPACT_HEAD, "\n</tools>"
    return (
        f"{{%- set rw.block = {literal(head)} %}}"
        "{%- for t in tools %}{%- set f = t.function if t.function is defined else t %}"
        f"{{%- set rw.block = rw.block + '\\n' + {line} %}}{{%- endfor %}}"
        f"{{%- set rw.block = rw.block + {literal(tail)} %}}"
    )


def with_tools_block(template: str, tools_format: ToolsFormat) -> str:
    """`template` behind a preamble that renders `tools` into the system message and `tool`
    messages as user turns of <tool_response> blocks (consecutive ones merged, as Qwen2.5 does)."""
    if tools_format not in TOOLS_FORMATS:
        raise ValueError(f"tools_format must be one of {TOOLS_FORMATS}, not {tools_format!r}")
    response = "'<tool_response>\\n' + m.content + '\\n</tool_response>'"
    preamble = (
        WRAP_MARK + "{%- set rw = namespace(msgs=[], block='') %}"
        "{%- for m in messages %}"
        "{%- if m.role == 'tool' and loop.previtem is defined and loop.previtem.role == 'tool' %}"
        "{%- set rw.msgs = rw.msgs[:-1] + [{'role': 'user', "
        f"'content': rw.msgs[-1].content + '\\n' + {response}}}] %}}"
        "{%- elif m.role == 'tool' %}"
        f"{{%- set rw.msgs = rw.msgs + [{{'role': 'user', 'content': {response}}}] %}}"
        "{%- else %}{%- set rw.msgs = rw.msgs + [m] %}{%- endif %}{%- endfor %}"
        "{%- if tools %}"
        + tools_block(tools_format)
        + "{%- if rw.msgs and rw.msgs[0].role == 'system' %}"
        "{%- set rw.msgs = [{'role': 'system', 'content': rw.msgs[0].content + '\\n\\n' + "
        "rw.block}] + rw.msgs[1:] %}"
        "{%- else %}{%- set rw.msgs = [{'role': 'system', 'content': rw.block}] + rw.msgs %}"
        "{%- endif %}{%- endif %}"
        "{%- set messages = rw.msgs %}"
    )
    return preamble + template


def render(tokenizer, messages: list[dict], tools=None, generation: bool = False) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=generation, tokenize=False
    )


def model_name(tokenizer) -> str:
    return getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__


def turn_after(tokenizer, messages: list[dict]) -> str:
    """The text the template puts after a finished assistant turn's eos token when `messages`
    come next, through the next assistant cue."""
    eos = tokenizer.eos_token
    head = render(tokenizer, PROBE)
    end = head.find(PROBE[1]["content"] + (eos or "\0"))
    if end < 0:
        raise TemplateError(
            f"{model_name(tokenizer)}: its chat template does not end an assistant turn with the "
            f"eos token {eos!r}; rollwise stops generation on eos, so it cannot frame turns"
        )
    prefix = head[: end + len(PROBE[1]["content"]) + len(eos)]
    full = render(tokenizer, PROBE + messages, generation=True)
    if not full.startswith(prefix):
        raise TemplateError(
            f"{model_name(tokenizer)}: its chat template re-renders earlier turns when a "
            f"{messages[0]['role']} message follows (not prefix-stable), so turns cannot be "
            "appended token-in/token-out"
        )
    return full[len(prefix) :]


def renders_tools(tokenizer) -> bool:
    """Whether the template itself lists the tools passed as `tools=`."""
    text = render(tokenizer, [{"role": "system", "content": "s"}, PROBE[0]], tools=[PROBE_TOOL])
    return PROBE_TOOL["function"]["name"] in text


def check_template(tokenizer, name: str) -> None:
    """Raise TemplateError naming `name` unless the template can frame every rollwise turn: a
    generation prompt, turns ending on eos, tool results and user turns appendable, tools listed."""
    from jinja2 import TemplateError as JinjaError

    if not getattr(tokenizer, "chat_template", None):
        raise TemplateError(f"{name}: the tokenizer has no chat template")
    if tokenizer.eos_token is None:
        raise TemplateError(f"{name}: the tokenizer has no eos token to end a turn on")
    try:
        if render(tokenizer, PROBE[:1]) == render(tokenizer, PROBE[:1], generation=True):
            raise TemplateError(
                f"{name}: its chat template has no generation prompt (add_generation_prompt "
                "renders nothing), so a prompt cannot end on the assistant's cue"
            )
        for role in ("tool", "user"):
            text = turn_after(tokenizer, [{"role": role, "content": "rollwise probe content"}])
            if "rollwise probe content" not in text:
                raise TemplateError(f"{name}: its chat template drops {role} messages")
        if not renders_tools(tokenizer):
            raise TemplateError(f"{name}: its chat template does not list the tools")
    except JinjaError as exc:
        raise TemplateError(f"{name}: its chat template fails to render: {exc}") from exc
