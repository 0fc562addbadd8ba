"""The CPU default policy: a whole-word tokenizer trained with `tokenizers` on the suite's text,
and a tiny Qwen2 built from a config. Nothing is downloaded."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers import utils as hf_utils

hf_utils.logging.disable_progress_bar()  # stage logs stay readable: no per-load progress bars

# transformers 5 builds and loads models inside context managers that swap class methods
# (PreTrainedModel.tie_weights, init_weights, torch.nn.init) for no-ops and put them back after.
# Two threads doing that at once (the flow overlaps rollout@r+1 with train@r) can leave the no-op
# in place for good: from then on every model in the process loads with a random, untied lm_head.
# Every model this package builds, loads or wraps (LoRA adapters init through torch.nn.init too)
# does it under this one lock.
MODEL_INIT_LOCK = threading.Lock()

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]"]
TAG_TOKENS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<tools>",
    "</tools>",
]
# Words, whole numbers, single whitespace and single symbols: a word is one token wherever it
# stands (after a space, a quote or a bracket), so copying a name into JSON is one token copy.
WORD_PATTERN = r"[A-Za-z]+|\d+|\s|[^\sA-Za-z\d]"
MARKER = "rollwise_policy.json"  # provenance written beside every checkpoint we save

# Qwen-style ChatML with Hermes tool calls; tools are listed by compact signature to keep the
# tiny model's context short. Observations return in a user turn inside <tool_response>.
# HF renders with trim_blocks (a newline right after a tag is dropped): newlines in tool lists
# are written as expressions.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m.role == 'system' %}<|im_start|>system\n{{ m.content }}"
    "{% if tools %}{{ '\\n' }}<tools>{% for t in tools %}{{ '\\n' }}{{ t.function.name }}("
    "{% for a in t.function.parameters.properties %}{{ a }}{% if not loop.last %},{% endif %}"
    "{% endfor %}){% endfor %}{{ '\\n' }}</tools>{% endif %}<|im_end|>\n"
    "{% elif m.role == 'user' %}<|im_start|>user\n{{ m.content }}<|im_end|>\n"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}"
    "</tool_response><|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(corpus: Iterable[str]) -> PreTrainedTokenizerFast:
    """Word-level vocabulary over the corpus plus every number 0..999 (one token each)."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(WORD_PATTERN), behavior="isolated")
    tok.decoder = decoders.Fuse()
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS, min_frequency=1)
    numbers = " ".join(str(i) for i in range(1000))
    tok.train_from_iterator([numbers, *corpus], trainer)
    tok.add_tokens(TAG_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="[UNK]",
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
    )


def build_model(tokenizer: PreTrainedTokenizerBase, cfg) -> Qwen2ForCausalLM:
    """A tiny Qwen2 (tied embeddings) sized by params `policy`; seeded, so rebuilds are equal."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        intermediate_size=cfg.intermediate,
        max_position_embeddings=cfg.max_context,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    with MODEL_INIT_LOCK:  # the seed too: a thread building beside it would draw from it
        torch.manual_seed(cfg.seed)
        return require_tied(Qwen2ForCausalLM(config), "a new model")


def save_policy(model, tokenizer, folder: Path, info: dict | None = None) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / MARKER).write_text(json.dumps(info or {}, indent=1))


def load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """A plain fast tokenizer loads as itself: AutoTokenizer would swap in Qwen's pre-tokenizer
    beside a qwen2 config.json and silently change the ids (stack-notes.md)."""
    folder = Path(folder)
    config = folder / "tokenizer_config.json"
    declared = json.loads(config.read_text()).get("tokenizer_class") if config.exists() else None
    if declared in ("PreTrainedTokenizerFast", "TokenizersBackend"):  # transformers 4 / 5
        return PreTrainedTokenizerFast.from_pretrained(folder, padding_side="left")
    tok = AutoTokenizer.from_pretrained(folder, padding_side="left")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_policy(folder: Path, dtype: torch.dtype = torch.float32):
    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder}: no config.json; not a Hugging Face model folder")
    with MODEL_INIT_LOCK:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return require_tied(model, str(folder)), load_tokenizer(folder)


def require_tied(model, what: str):
    """The model, if its config's tied embeddings are really one tensor; else a clear error, not
    a policy whose output layer is random (see MODEL_INIT_LOCK for how that happens)."""
    out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    tied = getattr(model.config, "tie_word_embeddings", False)
    if tied and out is not None and out.weight is not inp.weight:
        raise RuntimeError(
            f"{what}: config.tie_word_embeddings is true but lm_head is a separate, newly "
            "initialized tensor: transformers' weight tying was disabled in this process "
            "(a model built or loaded concurrently in another thread outside rollwise's lock)"
        )
    return model
