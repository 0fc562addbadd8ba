"""Run worktrees and in-process DVC stage records (flows/workspace.py) on a two-stage toy DAG,
with real git and DVC; and the flow form's overrides."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.form import form_overrides
from flows.workspace import DvcStages, WorkspaceError, create_worktree
from rollwise.config import ParamsError

DVC = str(Path(sys.executable).parent / "dvc")
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
DAG = """stages:
  a:
    cmd: python -c "raise SystemExit('computed in-process, never by this cmd')"
    deps: [code.py]
    params: [x]
    outs: [out_a]
  b:
    cmd: python -c "raise SystemExit('computed in-process, never by this cmd')"
    deps: [out_a]
    params: [y]
    outs: [out_b]
    metrics:
      - m_b.json:
          cache: false
"""


def sh(cwd: Path, *cmd: str) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=GIT_ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "dvc.yaml").write_text(DAG)
    (root / "params.yaml").write_text("x: 1\ny: 1\n")
    (root / "code.py").write_text("VERSION = 1\n")
    (root / ".gitignore").write_text(".rollwise/\n")
    sh(root, "git", "init", "-q")
    sh(root, DVC, "init", "-q")
    sh(root, "git", "add", "-A")
    sh(root, "git", "commit", "-q", "-m", "init")
    return root


def compute(root: Path, name: str, log: list[str]):
    def run() -> None:
        log.append(name)
        params = (root / "params.yaml").read_text()
        (root / f"out_{name}").write_text(f"{name} from {params!r}")
        if name == "b":
            (root / "m_b.json").write_text('{"done": 1}')

    return run


def run_dag(root: Path) -> tuple[dict[str, str], list[str]]:
    stages, computed = DvcStages(root), []
    try:
        how = {name: stages.run(name, compute(root, name, computed)) for name in ("a", "b")}
    finally:
        stages.close()
    return how, computed


def test_worktree_has_the_workspace_code_and_its_own_params(project: Path):
    (project / "code.py").write_text("VERSION = 2  # uncommitted\n")
    (project / "new_module.py").write_text("NEW = True\n")
    root = create_worktree(project, "w1", "x: 1\ny: 5\n")
    assert root == project / ".rollwise" / "runs" / "w1"
    assert (root / "code.py").read_text() == "VERSION = 2  # uncommitted\n"
    assert (root / "new_module.py").exists()
    assert (root / "params.yaml").read_text() == "x: 1\ny: 5\n"
    assert (project / "params.yaml").read_text() == "x: 1\ny: 1\n"  # workspace untouched
    assert str(project / ".dvc" / "cache") in (root / ".dvc" / "config.local").read_text()
    assert "rollwise-runs/w1" in sh(project, "git", "branch", "--list", "rollwise-runs/*")


def test_stages_run_then_restore_across_worktrees_then_skip(project: Path):
    w1 = create_worktree(project, "w1", "x: 1\ny: 1\n")
    assert run_dag(w1) == ({"a": "ran", "b": "ran"}, ["a", "b"])
    assert "up to date" in sh(w1, DVC, "status")  # recorded as `dvc commit` would
    assert run_dag(w1) == ({"a": "up-to-date", "b": "up-to-date"}, [])

    w2 = create_worktree(project, "w2", "x: 1\ny: 1\n")  # same deps and params: run-cache
    assert run_dag(w2) == ({"a": "restored", "b": "restored"}, [])
    assert (w2 / "out_b").read_text() == (w1 / "out_b").read_text()
    assert (w2 / "m_b.json").read_text() == '{"done": 1}'  # uncached metrics restored too

    w3 = create_worktree(project, "w3", "x: 1\ny: 2\n")  # only b's param differs
    assert run_dag(w3) == ({"a": "restored", "b": "ran"}, ["b"])
    assert not (project / "dvc.lock").exists() and not (project / "out_a").exists()


def test_a_reused_name_resumes(project: Path):
    w1 = create_worktree(project, "w1", "x: 1\ny: 1\n")
    stages = DvcStages(w1)
    try:
        stages.run("a", compute(w1, "a", []))
    finally:
        stages.close()
    again = create_worktree(project, "w1", "x: 1\ny: 1\n")  # e.g. after a crash in b
    assert again == w1
    assert run_dag(w1) == ({"a": "up-to-date", "b": "ran"}, ["b"])


def test_a_project_without_dvc_or_commit_is_named(tmp_path: Path):
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(WorkspaceError, match="dvc init"):
        create_worktree(bare, "w", "")
    sh(bare, "git", "init", "-q")
    sh(bare, DVC, "init", "-q")
    with pytest.raises(WorkspaceError, match="at least one commit"):
        create_worktree(bare, "w", "")


def test_unknown_stage_is_named(project: Path):
    w1 = create_worktree(project, "w1", "x: 1\ny: 1\n")
    stages = DvcStages(w1)
    try:
        with pytest.raises(WorkspaceError, match="'nope'"):
            stages.run("nope", lambda: None)
    finally:
        stages.close()


def test_form_fields_become_dotted_overrides():
    merged = form_overrides({"train_lr": 3e-4, "rounds": None}, {"train.epochs": 4})
    assert merged == {"train.epochs": 4, "train.lr": 3e-4}
    assert form_overrides({"rounds": 2}, {"rounds": 2}) == {"rounds": 2}
    with pytest.raises(ParamsError, match="train.lr"):
        form_overrides({"train_lr": 3e-4}, {"train.lr": 1e-4})
