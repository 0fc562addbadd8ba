"""`rollwise params [KEY]`: the resolved configuration (params.yaml over config.py's defaults) as
YAML, all of it or one section or key (`train`, `train.lr`).

`--markdown` prints the reference of every key (docs/params.md is this output); `--write-rounds`
writes rounds.yaml, what dvc.yaml's foreach reads, from params.yaml's `rounds` and
`rollout.policy_lag`."""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_origin

import yaml
from pydantic import BaseModel

from rollwise.config import (
    ROUNDS_FILE,
    Params,
    ParamsError,
    dump_for_dvc,
    load_params,
    section_type,
    write_rounds_file,
)

MARKDOWN_COMMAND = "rollwise params --markdown > docs/params.md"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", nargs="?", help="a section or dotted key: train, train.lr")
    parser.add_argument("--file", type=Path, default=Path("params.yaml"), help="the params file")
    parser.add_argument("--markdown", action="store_true", help="the reference of every key")
    parser.add_argument(
        "--write-rounds",
        action="store_true",
        help=f"write {ROUNDS_FILE} (what dvc.yaml loops over) beside the params file",
    )


def run(args: argparse.Namespace) -> int:
    if args.markdown:
        print(markdown(), end="")
        return 0
    try:
        params = load_params(args.file)
        if args.write_rounds:
            write_rounds_file(args.file.parent, params)
            print(f"wrote {args.file.parent / ROUNDS_FILE}: {params.n_rounds} round(s)")
            return 0
        print(resolved(params, args.key), end="")
    except ParamsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def resolved(params: Params, key: str | None = None) -> str:
    """The resolved configuration as YAML, or the part under one dotted key."""
    data: Any = params.model_dump(mode="json")
    if not key:
        return dump_for_dvc(data)
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            raise ParamsError(f"{key}: no such key (sections: {', '.join(params.model_dump())})")
        data = data[part]
    return dump_for_dvc({key: data})


def sections(model: type[BaseModel], path: str = "") -> Iterator[tuple[str, type[BaseModel]]]:
    """(dotted path, section model) of `model` and every section inside it, depth first."""
    yield path, model
    for name, field in model.model_fields.items():
        sub = section_type(field.annotation)
        if sub is not None and get_origin(field.annotation) is not dict:  # not `rounds`
            yield from sections(sub, f"{path}.{name}" if path else name)


def shown(value: Any) -> str:
    """A default as params.yaml would write it."""
    if isinstance(value, BaseModel):
        return "section below"
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return f"`{text.removesuffix('...').strip()}`"


def markdown() -> str:
    """The reference of every key: per section its docstring and a table of key, default, what
    it does (the Field descriptions of src/rollwise/config/)."""
    out = [
        "# Parameters",
        "",
        f"Generated from src/rollwise/config/ by `{MARKDOWN_COMMAND}`; do not edit by hand",
        "(tests/test_docs.py fails when it is stale). params.yaml writes only the keys this",
        "project sets and the ones a user changes first; every other key takes the default here.",
        "`rollwise params [KEY]` prints the resolved configuration.",
    ]
    for path, model in sections(Params):
        out += ["", f"## `{path}`" if path else "## Top level", ""]
        if model.__doc__:
            out += [" ".join(inspect.cleandoc(model.__doc__).split()), ""]
        out += ["| key | default | what it does |", "|---|---|---|"]
        for name, field in model.model_fields.items():
            if not path and name in Params.model_fields and name not in ("seed", "rounds"):
                continue  # a top-level section: its own heading
            key = f"{path}.{name}" if path else name
            default = "`1`" if key == "rounds" else shown(field.default)
            about = (field.description or "").replace("|", "\\|")
            out.append(f"| `{key}` | {default} | {about} |")
    return "\n".join(out) + "\n"
