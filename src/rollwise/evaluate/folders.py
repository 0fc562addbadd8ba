"""Is a folder a loadable Hugging Face model? Checked for every candidate before any evaluation
cell runs, so a typo or a damaged checkpoint fails in a second, not after hours of episodes.

Cheap on purpose: config.json and the tokenizer are parsed, weight files are checked against
their own safetensors headers (a truncated or overwritten file is caught without reading it)."""

from __future__ import annotations

import json
from pathlib import Path

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")  # fmt: skip


class NotAModel(ValueError):
    """The folder exists but cannot be loaded as a Hugging Face causal LM; says why."""


def check_hf_folder(folder: Path) -> None:
    """Raise FileNotFoundError (no folder) or NotAModel (what is wrong with it)."""
    from transformers import AutoConfig

    from rollwise.policy.build import load_tokenizer

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} does not exist or is not a folder")
    if not (folder / "config.json").is_file():
        raise NotAModel("no config.json: not a Hugging Face model folder")
    try:
        AutoConfig.from_pretrained(folder)
    except Exception as e:  # JSON errors, unknown model_type, ...
        raise NotAModel(f"config.json: {type(e).__name__}: {e}") from e
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise NotAModel(f"no weights: none of {', '.join(WEIGHT_FILES)}")
    for path in sorted(folder.glob("*.safetensors")):
        check_safetensors(path)
    try:
        load_tokenizer(folder)
    except Exception as e:
        raise NotAModel(f"tokenizer: {type(e).__name__}: {e}") from e


def check_safetensors(path: Path) -> None:
    """The file is exactly as long as its header says: 8-byte header length, JSON header, then
    the tensors' bytes (the largest end offset)."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if size < 8 or n > size - 8:
                raise NotAModel(f"header of {n} bytes in a file of {size}")
            header = json.loads(f.read(n))
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"),
                  default=0)  # fmt: skip
    except NotAModel as e:
        raise NotAModel(f"{path.name}: truncated or not safetensors ({e})") from e
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise NotAModel(f"{path.name}: unreadable safetensors header ({e})") from e
    if 8 + n + end != size:
        raise NotAModel(f"{path.name}: {size} bytes but its header describes {8 + n + end}: "
                        "truncated or overwritten")  # fmt: skip
