"""Repair a dvc.lock that a kill -9 cut short.

DVC rewrites dvc.lock in place (open "w+", then a YAML dump), so a process killed during that
write leaves it truncated, and every later `dvc repro` refuses the whole file ("dvc.lock
validation failed"). Stage outputs are safe (each stage writes to a temporary folder and renames
it), so nothing is lost but the record: `repair` keeps every complete stage entry, drops the one
the kill cut (and anything after it, already gone), and writes the file back atomically. The
next `dvc repro` restores a dropped stage from DVC's run-cache, or reruns it.

`make run` and the Prefect flow call it before they start; after a crash of a hand-run
`dvc repro`, run `python -m flows.lockfile`.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import yaml
from dvc.schema import COMPILED_LOCKFILE_SCHEMA, LOCK_FILE_STAGE_SCHEMA
from voluptuous import Invalid, Schema

from rollwise.config import dump_for_dvc

STAGE_KEY = re.compile(r"^  (?P<name>[^\s#-][^:]*):\s*$")  # "  train@01:" under `stages:`
ONE_STAGE = Schema(LOCK_FILE_STAGE_SCHEMA)


def is_valid(text: str) -> bool:
    """Does DVC accept this dvc.lock? (An empty or unparsable file it refuses.)"""
    try:
        COMPILED_LOCKFILE_SCHEMA(yaml.safe_load(text))
    except (yaml.YAMLError, Invalid):
        return False
    return True


def complete_entries(text: str) -> dict[str, dict]:
    """The stage entries of a truncated dvc.lock that are whole: every entry but the last one
    present (the write was cut inside it or right after it), each checked against DVC's schema."""
    blocks: list[tuple[str, list[str]]] = []
    in_stages = False
    for line in text.splitlines():
        if line.startswith("stages:"):
            in_stages = True
        elif in_stages and (m := STAGE_KEY.match(line)):
            blocks.append((m["name"], []))
        elif in_stages and blocks and line.startswith("    "):
            blocks[-1][1].append(line[4:])
        elif in_stages and line.strip():
            in_stages = False  # another top-level key
    entries = {}
    for name, lines in blocks[:-1]:
        try:
            entries[name] = ONE_STAGE(yaml.safe_load("\n".join(lines)))
        except (yaml.YAMLError, Invalid):
            continue
    return entries


def repair(root: Path) -> list[str] | None:
    """None when dvc.lock is absent or valid; otherwise rewrite it with its complete entries and
    return their names (the stages whose record survived)."""
    path = root / "dvc.lock"
    if not path.exists():
        return None
    text = path.read_text(errors="replace")
    if is_valid(text):
        return None
    entries = complete_entries(text)
    tmp = path.with_name(f".dvc.lock.repair-{os.getpid()}")
    tmp.write_text(dump_for_dvc({"schema": "2.0", "stages": entries}))
    os.replace(tmp, path)
    return list(entries)


def main() -> int:
    kept = repair(Path("."))
    if kept is None:
        print("dvc.lock is valid: nothing to repair")
    else:
        print(f"dvc.lock was cut short: kept {len(kept)} complete stage entries; the next "
              "`dvc repro` restores the rest from the run-cache or reruns them")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
