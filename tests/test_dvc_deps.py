"""dvc.yaml lists every project file a stage runs: a change to any of them marks the stage
stale, so `dvc repro` never serves results of old code. The files are derived here from the
stage's module and everything it imports of the project (transitively, imports inside functions
included), not from a hand-kept list."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"rollwise": ROOT / "src" / "rollwise", "tasks": ROOT / "tasks"}


def module_file(name: str) -> Path | None:
    """The file of a project module (`rollwise.loop`, `tasks.common`), None if not ours."""
    top, *rest = name.split(".")
    if top not in PACKAGES:
        return None
    base = PACKAGES[top].joinpath(*rest)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def imported(path: Path) -> set[Path]:
    """The project files `path` imports directly (`from a import b` may name a module b)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        found |= {f for f in map(module_file, names) if f is not None}
    return found


def closure(path: Path) -> set[Path]:
    seen, todo = set(), [path]
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo += imported(f)
            if f.name != "__init__.py":  # importing a.b runs a/__init__.py too
                todo += [p / "__init__.py" for p in f.parents if (p / "__init__.py").exists()
                         and PACKAGES["rollwise"] in [p, *p.parents]]  # fmt: skip
    return seen


def stages() -> dict[str, tuple[str, list[str]]]:
    """stage -> (its tasks module, its deps), a foreach stage's `do` read as written."""
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    out = {}
    for name, stage in spec.items():
        body = stage.get("do", stage)
        module = re.search(r"python -m (tasks\.\w+)", body["cmd"]).group(1)
        out[name] = (module, [str(d).split()[0] for d in body.get("deps", [])])
    return out


def test_every_stage_lists_every_project_file_it_runs():
    missing = {}
    for name, (module, deps) in stages().items():
        files = closure(module_file(module))
        covered = [ROOT / d for d in deps]
        left = [f.relative_to(ROOT) for f in files
                if not any(f == c or c in f.parents for c in covered)]  # fmt: skip
        if left:
            missing[name] = sorted(map(str, left))
    assert len(stages()) == 7 and missing == {}


def test_the_import_walk_sees_a_late_import():
    """The check can fail: the train stage imports rollwise.loop and, inside functions,
    rollwise.train.trainer; both are in its closure."""
    files = closure(module_file("tasks.train"))
    assert ROOT / "src/rollwise/loop.py" in files
    assert ROOT / "src/rollwise/train/trainer.py" in files
    assert ROOT / "tasks/common.py" in files


def test_task_modules_import_no_other_task_module():
    """tasks/* are thin wrappers over the library: the only project module they share is
    tasks/common.py."""
    for path in sorted((ROOT / "tasks").glob("*.py")):
        others = {f.name for f in imported(path) if f.parent == ROOT / "tasks"}
        assert others <= {"common.py", "__init__.py"}, path.name
