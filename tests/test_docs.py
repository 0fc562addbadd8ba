"""The README and bench/README.md must stay true to the repo they ship in: every command a fenced
block names exists (make targets, python -m modules, scripts and paths), every relative link
resolves, and the bench table's figures are the ones in its canonical results files."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BENCH_README = REPO / "bench" / "README.md"
RESULTS = REPO / "bench" / "results"
DOCS = sorted((REPO / "docs").rglob("*.md"))

FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATHLIKE = re.compile(r"^[\w.\-]+(/[\w.\-]*)+$")  # a/b, a/b.py, dir/


def fenced(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block."""
    return [(m.group(1).strip(), m.group(2)) for m in FENCE.finditer(text)]


def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([\w.-]+):", text, re.M))


def module_exists(name: str) -> bool:
    """A `python -m` module of the repo (flows, tasks) or of src/ (rollwise)."""
    rel = Path(*name.split("."))
    for root in (REPO, REPO / "src"):
        if (root / rel).with_suffix(".py").is_file() or (root / rel / "__main__.py").is_file():
            return True
    return False


def commands(body: str) -> list[list[str]]:
    """Shell command lines of a fenced block, comments dropped, `&&`/`;` split apart."""
    out = []
    for line in body.splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        words: list[str] = []
        for word in [*shlex.split(line), "&&"]:
            if word not in ("&&", ";", "||"):
                words.append(word)
                continue
            while words and "=" in words[0] and not words[0].startswith("-"):
                words = words[1:]  # leading VAR=value assignments
            if words:
                out.append(words)
            words = []
    return out


def check_command(words: list[str]) -> list[str]:
    """What in one command line does not exist (empty: all of it does)."""
    missing = []
    prog, args = words[0], words[1:]
    if prog == "make":
        missing += [f"make target {t}" for t in args if t not in make_targets()]
    if prog.endswith("python") and args[:1] == ["-m"]:
        if not module_exists(args[1]):
            missing.append(f"module {args[1]}")
    elif prog.endswith("python") and args and args[0].endswith(".py"):
        if not (REPO / args[0]).is_file():
            missing.append(f"script {args[0]}")
    if prog.startswith(".venv/bin/") and Path(prog).name not in {"python", "dvc", "rollwise"}:
        missing.append(f"executable {prog}")
    if prog.endswith("rollwise") and args and args[0] not in ("compare", "params"):  # bare: name
        missing.append(f"rollwise subcommand {args[:1]}")
    return missing


def test_params_reference_is_current():
    """docs/params.md is `rollwise params --markdown` of src/rollwise/config/, and it justifies
    no default by a results file (that narrative lives in docs/experiments/)."""
    from rollwise.params_cmd import MARKDOWN_COMMAND, markdown

    text = markdown()
    assert (REPO / "docs" / "params.md").read_text() == text, f"stale: run `{MARKDOWN_COMMAND}`"
    assert "results" not in text and "README" not in text
    assert "| `train.lr` | `0.0001` |" in text and "| `envs.faults.seed` | `0` |" in text


def test_readme_is_at_most_12_kb():
    assert README.stat().st_size <= 12 * 1024, README.stat().st_size


def test_readme_names_the_commands_and_the_fast_tier():
    text = README.read_text()
    for target in ("make run", "make test", "make check", "make ui"):
        assert target in text
    assert {"run", "test", "check", "ui", "bench"} <= make_targets()


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_fenced_commands_name_what_exists(doc: Path):
    missing = []
    for lang, body in fenced(doc.read_text()):
        if lang in ("bash", "sh"):
            for words in commands(body):
                missing += check_command(words)
        elif lang == "yaml":  # a dotted factory path must import from the repo root
            for spec in re.findall(r'custom:\s*"([\w.]+):(\w+)"', body):
                assert module_exists(spec[0]), spec
    assert not missing, missing


INLINE = re.compile(r"`([^`\n]+)`")
COMMAND_START = re.compile(r"^(make|python|\.venv/bin/\S+|dvc|rollwise) ")
TRACKED = "src|bench|tests|flows|tasks|docs|examples|scripts"
REPO_PATH = re.compile(rf"(?<![\w/.])((?:{TRACKED})/[\w./\-]*\w/?)")


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_inline_commands_name_what_exists(doc: Path):
    """`make X`, `python -m X`, `.venv/bin/...` written inline in the prose, too."""
    text = FENCE.sub("", doc.read_text())
    missing = []
    for span in INLINE.findall(text):
        if COMMAND_START.match(span + " ") and "<" not in span:
            for words in commands(span.replace("[", "").replace("]", "")):
                missing += check_command(words)
    assert not missing, missing


def test_readme_repo_paths_exist():
    """Paths into the repo's own folders (not data/, models/: those are outputs)."""
    missing = sorted({p for p in REPO_PATH.findall(README.read_text()) if not (REPO / p).exists()})
    assert not missing, missing


def test_readme_tree_lists_paths_that_exist():
    tree = next(body for lang, body in fenced(README.read_text()) if "pyproject.toml" in body)
    entries = [line for line in tree.splitlines()  # a description's continuation is indented
               if line.strip() and len(line) - len(line.lstrip()) <= 4]  # fmt: skip
    first_words = [line.split()[0] for line in entries]
    parent = REPO
    for word in first_words:
        for name in word.rstrip(",").split(","):
            if not re.match(r"^[\w.\-/]+$", name):
                continue
            top = REPO / name
            nested = parent / name
            assert top.exists() or nested.exists(), name
            if name.endswith("/") and top.exists():
                parent = top


@pytest.mark.parametrize(
    "doc", [README, BENCH_README, *DOCS], ids=lambda p: str(p.relative_to(REPO))
)
def test_relative_links_resolve(doc: Path):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+://", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        if not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, broken


def bench_rows() -> list[list[str]]:
    rows = []
    for line in BENCH_README.read_text().splitlines():
        if line.startswith("| ") and not line.startswith("| target") and "---" not in line:
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def lookup(data: dict, key: str):
    """A dotted key; a part may itself hold dots (forgetting.json's override names)."""
    if key in data:
        return data[key]
    head, _, rest = key.partition(".")
    while rest:
        if head in data and isinstance(data[head], dict):
            return lookup(data[head], rest)
        nxt, _, rest = rest.partition(".")
        head = f"{head}.{nxt}"
    raise KeyError(key)


def close(shown, actual) -> bool:
    """`shown` is `actual` as written with fewer digits."""
    if isinstance(shown, list):
        return len(shown) == len(actual) and all(map(close, shown, actual))
    if isinstance(shown, bool) or not isinstance(shown, int | float):
        return shown == actual
    digits = len(repr(float(shown)).split(".")[1]) if "." in repr(shown) else 0
    return abs(shown - actual) <= 0.5 * 10**-digits + 1e-12


def test_bench_table_has_every_target_and_every_canonical_file():
    rows = bench_rows()
    targets = [r[0] for r in rows]
    for name in ("quickstart", "rollout engine", "training", "orchestration", "scheduling",
                 "curation", "credit", "halving", "fuzz", "synthapi", "peer"):  # fmt: skip
        assert name in targets, name
    canonical = [r[2] for r in rows if ".json" in r[2]]
    listed = {re.search(r"results/([\w.\-]+\.json)", cell).group(1) for cell in canonical}
    on_disk = {p.name for p in RESULTS.glob("*.json")}
    assert listed == on_disk


@pytest.mark.parametrize("row", [r for r in bench_rows() if ".json" in r[2]], ids=lambda r: r[0])
def test_bench_row_matches_its_results_file(row: list[str]):
    _, bench, result, figures, _, command, commit = row
    script = re.search(r"bench/([\w]+)\.py", bench).group(1)
    name = re.search(r"results/([\w.\-]+)\.json", result).group(1)
    assert name == script, "the canonical file is named after its bench"
    assert (REPO / "bench" / f"{script}.py").is_file()
    data = json.loads((RESULTS / f"{name}.json").read_text())
    for key, value in re.findall(r"`([^`]+)` = ([^<]+)", figures):
        assert close(json.loads(value), lookup(data, key)), (key, value)
    recorded = " ".join(data["command"].split())
    assert " ".join(command.strip("`").replace("\\|", "|").split()) == recorded
    assert data["git_commit"].startswith(commit.split("+")[0])
    assert commit.endswith("+uncommitted") == data["git_commit"].endswith("+uncommitted")


def test_experiment_pages_cite_files_that_exist():
    """Every results file the pages name exists, but for `--out` paths of recorded commands."""
    cited = set()
    for page in (REPO / "docs" / "experiments").glob("*.md"):
        text = page.read_text()
        for m in re.finditer(r"bench/results/((?:archive/)?[\w.\-]+\.json)", text):
            if not text[: m.start()].rstrip().endswith("--out"):
                cited.add(m.group(1))
    assert len(cited) > 50
    missing = sorted(c for c in cited if not (RESULTS / c).is_file())
    assert not missing, missing
