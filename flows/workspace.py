"""A flow run's own experiment: a git worktree of the project, sharing its DVC cache.

Why a worktree and not `dvc exp run`: DVC experiments run every stage as a subprocess, while the
flow runs stages in one process so a model stays loaded across them. A worktree gives the same
guarantees a DVC experiment does (design.md §2, Orchestration):
- the user's workspace (params.yaml, data/, models/, dvc.lock) is never touched, and two runs at
  once never share a folder;
- the worktree's `.dvc/config.local` points at the project's DVC cache, so DVC's run-cache
  restores any stage some earlier run (or `dvc repro`) computed with the same deps and params;
- each stage is recorded in the worktree's dvc.lock the way `dvc commit` records a command run by
  hand, so `dvc repro` in the worktree afterwards runs nothing;
- at the end the worktree's params.yaml and dvc.lock are committed on the branch
  `rollwise-runs/<name>`: `git checkout rollwise-runs/<name> && dvc checkout` brings it back.

The worktree gets the workspace's code as it is now (uncommitted edits included): that is the
code the flow process runs, so that is what dvc.lock must hash.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from rollwise.config import ROUNDS_FILE

RUNS_DIR = Path(".rollwise") / "runs"
BRANCH_PREFIX = "rollwise-runs/"
# Files that belong to the run, not to the code copied from the workspace.
RUN_OWNED = {"params.yaml", ROUNDS_FILE, "dvc.lock"}
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "rollwise",
    "GIT_AUTHOR_EMAIL": "rollwise@localhost",
    "GIT_COMMITTER_NAME": "rollwise",
    "GIT_COMMITTER_EMAIL": "rollwise@localhost",
}


class WorkspaceError(RuntimeError):
    """The project cannot host a run worktree (not a git repo, no commit, no DVC)."""


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise WorkspaceError(f"git {' '.join(args)} failed in {cwd}: {done.stderr.strip()}")
    return done.stdout


def check_project(project: Path) -> None:
    """A clear error before any work when the project cannot host worktrees."""
    if not (project / ".dvc").is_dir():
        raise WorkspaceError(f"{project} has no .dvc/ folder: run `dvc init` there first")
    try:
        git(project, "rev-parse", "--verify", "HEAD")
    except WorkspaceError as e:
        raise WorkspaceError(
            f"{project} must be a git repository with at least one commit: flow runs are git "
            "worktrees of it (git init && git add -A && git commit -m init)"
        ) from e


def changed_files(project: Path) -> tuple[list[str], list[str]]:
    """(files to copy, files to delete): the workspace's edits against HEAD, untracked files
    included, ignored files (data, models, caches) excluded."""
    out = git(project, "status", "--porcelain", "-z", "--untracked-files=all", "--no-renames")
    copy, delete = [], []
    for entry in filter(None, out.split("\0")):
        status, path = entry[:2], entry[3:]
        if path in RUN_OWNED or path.startswith(str(RUNS_DIR)):
            continue
        (delete if "D" in status else copy).append(path)
    return copy, delete


def project_cache_dir(project: Path) -> Path:
    """Where the project's DVC cache lives (its config may move it)."""
    from dvc.repo import Repo

    with Repo(str(project)) as repo:
        return Path(repo.cache.local.path)


def create_worktree(project: Path, name: str, params_text: str) -> Path:
    """`.rollwise/runs/<name>/`: a worktree on branch rollwise-runs/<name> with the workspace's
    code, the run's params.yaml and the project's DVC cache. An existing one is reused, so a
    crashed run resumes: its finished stages are up to date in its dvc.lock."""
    check_project(project)
    root = project / RUNS_DIR / name
    if not (root / ".git").exists():
        shutil.rmtree(root, ignore_errors=True)  # a half-made folder from a crash
        git(project, "worktree", "prune")
        root.parent.mkdir(parents=True, exist_ok=True)
        git(project, "worktree", "add", "-q", "-B", BRANCH_PREFIX + name, str(root), "HEAD")
    copy, delete = changed_files(project)
    for rel in copy:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(project / rel, root / rel)
    for rel in delete:
        (root / rel).unlink(missing_ok=True)
    (root / "params.yaml").write_text(params_text)
    (root / ".dvc" / "config.local").write_text(
        f"[cache]\n    dir = {project_cache_dir(project)}\n"
    )
    return root


def commit_run(root: Path, message: str) -> str:
    """Commit the run's params.yaml, dvc.lock and code on its branch; returns the commit id."""
    git(root, "add", "-A")
    env = {**GIT_IDENTITY, **os.environ}
    done = subprocess.run(
        ["git", "commit", "-q", "--allow-empty", "-m", message],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise WorkspaceError(f"git commit failed in {root}: {done.stderr.strip()}")
    return git(root, "rev-parse", "HEAD").strip()


@contextlib.contextmanager
def inside(folder: Path) -> Iterator[None]:
    """DVC resolves stage paths against the working directory: work from the worktree."""
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


class DvcStages:
    """Runs dvc.yaml's stages in this process and records them as `dvc commit` would.

    For each stage: up to date in dvc.lock -> nothing to do; else the run-cache (shared with
    every other run through the DVC cache) restores it; else `compute()` runs it here and the
    result is committed to dvc.lock, the cache and the run-cache.

    Stages may be run from several threads at once (the flow overlaps independent stages): every
    DVC call, and the working-directory change it needs, holds `lock`; `compute()` runs outside
    it. Callers that run stages at once keep the process in the worktree meanwhile (`inside`), so
    no thread's chdir can undo another's."""

    UP_TO_DATE, RESTORED, RAN = "up-to-date", "restored", "ran"

    def __init__(self, root: Path):
        from dvc.repo import Repo

        from flows.lockfile import repair

        if (kept := repair(root)) is not None:
            print(f"dvc.lock in {root} was cut short by a crash: kept {len(kept)} stage records")
        self.root = root
        self.repo = Repo(str(root))
        self.lock = threading.RLock()

    def close(self) -> None:
        self.repo.close()

    def stage(self, name: str):
        from dvc.stage.exceptions import StageNotFound

        try:
            return self.repo.stage.collect(name)[0]
        except StageNotFound as e:
            raise WorkspaceError(f"dvc.yaml in {self.root} has no stage {name!r}") from e

    def is_up_to_date(self, name: str) -> bool:
        with self.lock, inside(self.root), self.repo.lock:
            return not self.stage(name).changed()

    def upstream(self) -> dict[str, set[str]]:
        """Each stage's direct upstream stages in dvc.yaml's graph (whose outputs it reads)."""
        with self.lock, inside(self.root):
            graph = self.repo.index.graph
            return {s.addressing: {d.addressing for d in graph.successors(s)} for s in graph}

    def restore(self, name: str) -> bool:
        """Check out the stage's outputs from the run-cache; False when never computed."""
        from dvc.stage.cache import RunCacheNotFoundError

        with self.lock, inside(self.root):
            stage = self.stage(name)
            try:
                with self.repo.lock:
                    self.repo.stage_cache.restore(stage)
            except RunCacheNotFoundError:
                return False
            self.repo.commit(name, force=True)
        return True

    def run(self, name: str, compute: Callable[[], object]) -> str:
        """Bring one stage up to date; returns how (UP_TO_DATE, RESTORED or RAN)."""
        if self.is_up_to_date(name):
            return self.UP_TO_DATE
        if self.restore(name):
            return self.RESTORED
        with inside(self.root):  # not locked: concurrent callers are already in the worktree
            compute()
        with self.lock, inside(self.root):
            self.repo.commit(name, force=True)
        return self.RAN
