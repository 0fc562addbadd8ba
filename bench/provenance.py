"""What a bench figure was measured with. The commit is read when the bench starts (this module
is imported at the top of each bench), not when it writes its JSON: a bench that runs for an
hour outlives the commits made meanwhile, and its figures belong to the code that ran. A tree
with uncommitted changes is marked `+uncommitted`."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git_commit(fallback: str = "unknown") -> str:
    """HEAD, with "+uncommitted" when tracked or new files differ; `fallback` outside git."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        return fallback
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()  # fmt: skip
    return head.stdout.strip() + ("+uncommitted" if dirty else "")


STARTED_AT = git_commit()  # the code this bench runs
