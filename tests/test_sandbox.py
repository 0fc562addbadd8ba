"""The code sandbox (rollwise/sandbox): every limit enforced, and a corpus of hostile code
that each ends as an error observation with nothing outside the sandbox touched."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import pytest

from rollwise.sandbox import SandboxLimits, run_code
from rollwise.sandbox.host import WORKER
from rollwise.types import Observation

FAST = SandboxLimits(cpu_s=1, wall_s=10, memory_mb=256, output_chars=300)
TOOLS = {"find_customer": ["name"], "list_orders": ["customer_id", "status"]}


class Env:
    """Tool calls as the rollout engine sees them: recorded, answered with JSON text."""

    def __init__(self, sleep_s: float = 0.0):
        self.calls: list[tuple[str, dict]] = []
        self.sleep_s = sleep_s

    def __call__(self, name: str, arguments: dict) -> Observation:
        self.calls.append((name, arguments))
        time.sleep(self.sleep_s)
        if name == "find_customer" and arguments.get("name") == "alice":
            return Observation(json.dumps({"customer_id": 7}))
        if name == "list_orders":
            return Observation(json.dumps([{"order_id": i, "n": i * i} for i in range(50)]))
        return Observation(json.dumps({"error": f"not found: {arguments}"}), "tool_error")


@pytest.fixture(autouse=True)
def private_tmp(tmp_path, monkeypatch):
    """Sandbox folders under this test's tmp_path, so leftovers can be counted."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield tmp_path
    assert not list(tmp_path.glob("rollwise-sandbox-*")), "a sandbox folder was left behind"


def run(code: str, limits: SandboxLimits = FAST, env: Env | None = None):
    return run_code(code, TOOLS, env or Env(), limits)


def test_code_runs_with_tools_stdout_and_the_last_value():
    env = Env()
    code = (
        "import statistics\n"
        "cid = find_customer('alice')['customer_id']\n"
        "rows = list_orders(customer_id=cid, status='paid')\n"
        "print('rows', len(rows))\n"
        "statistics.mean(r['n'] for r in rows if r['order_id'] < 5)"
    )
    result = run(code, env=env)
    assert (result.error, result.text) == (None, "rows 50\n6")
    assert result.observation() == Observation("rows 50\n6", "ok")
    assert env.calls == [("find_customer", {"name": "alice"}),
                         ("list_orders", {"customer_id": 7, "status": "paid"})]  # fmt: skip
    assert result.calls == 2


def test_a_tool_error_is_an_exception_the_code_may_catch():
    code = "try:\n    find_customer('nobody')\nexcept ToolError as e:\n    print('caught', e)"
    assert run(code).text.startswith('caught {"error": "not found')
    uncaught = run("find_customer(name='zed')")
    assert uncaught.observation().kind == "tool_error" and "ToolError" in uncaught.text


def test_same_code_same_observation():
    code = "print(set(['alpha', 'beta', 'gamma', 'delta']))\nhash('x')"
    assert run(code).text == run(code).text


# ------------------------------------------------------------------------------ limits
def test_cpu_limit():
    t0 = time.monotonic()
    result = run("x = 0\nwhile True:\n    x += 1", SandboxLimits(cpu_s=1, wall_s=30))
    assert result.error == "CPU time limit exceeded"
    assert time.monotonic() - t0 < 10


def test_wall_limit_counts_time_spent_in_tools_too():
    limits = SandboxLimits(cpu_s=30, wall_s=1)
    t0 = time.monotonic()
    result = run("for i in range(10):\n    find_customer('alice')", limits, Env(sleep_s=0.4))
    assert result.error == "wall time limit exceeded (1 s)"
    assert time.monotonic() - t0 < 3


def test_memory_limit():
    result = run("blocks = []\nwhile True:\n    blocks.append(' ' * 10**7)")
    assert result.error.startswith("MemoryError")


def test_output_is_truncated_and_runaway_printing_stopped():
    short = run("print('a' * 1000)")
    assert short.error is None and short.text.startswith("a" * 300)
    assert short.text.endswith("[truncated: 700 more characters]")
    runaway = run("while True:\n    print('spam' * 100)")
    assert runaway.error.startswith("OutputLimit") and len(runaway.text) < 700
    assert runaway.text.endswith("Error: OutputLimit: output passed 1200 characters")
    value = run("list(range(10**5))")
    assert len(value.text) < 400 and "truncated" in value.text


def test_file_size_and_open_files_limits():
    big = run("f = open('big.txt', 'w')\nf.write('x' * (3 * 2**20))\nf.close()")
    assert big.error is not None  # SIGXFSZ or OSError: either way an error observation
    files = run("fs = [open('f%d' % i, 'w') for i in range(100)]")
    assert files.error.startswith("OSError") and "Too many open files" in files.error


def test_files_stay_in_the_private_folder_and_vanish_with_it():
    code = "open('notes.txt', 'w').write('kept')\nopen('notes.txt').read()"
    assert run(code).text == "'kept'"
    assert run("open('notes.txt').read()").error.startswith("FileNotFoundError")


def test_tool_call_and_code_size_limits():
    env = Env()
    result = run("while True:\n    find_customer('alice')", SandboxLimits(max_calls=5), env)
    assert "too many tool calls" in result.error and len(env.calls) == 5
    assert "longer than" in run("x = 1\n" * 5000, SandboxLimits(max_code_chars=1000)).error


def test_os_layers_took_where_the_kernel_allows_them():
    """Network namespace and the nobody user (as root); on a kernel without user namespaces
    the netns layer may be off: the import allowlist still keeps `socket` out."""
    layers = run("1").layers
    assert set(layers) == {"netns", "nobody"}
    assert layers["nobody"] == (os.getuid() == 0)


# ------------------------------------------------------------------------------ hostile code
HOSTILE = {
    "import_os": "import os\nos.system('touch {canary}')",
    "from_import_os": "from os import system\nsystem('touch {canary}')",
    "import_subprocess": "import subprocess\nsubprocess.run(['touch', '{canary}'])",
    "import_socket": "import socket\nsocket.create_connection(('1.1.1.1', 80))",
    "import_sys": "import sys\nsys.modules['os'].system('touch {canary}')",
    "import_ctypes": "import ctypes\nctypes.CDLL(None).system(b'touch {canary}')",
    "import_signal": "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)",
    "relative_import": "from . import host",
    "dunder_import": "__import__('os').system('touch {canary}')",
    "importlib": "import importlib\nimportlib.import_module('os')",
    "submodule_walk": "import statistics\nstatistics.sys.modules['os'].system('touch {canary}')",
    "module_decoder": "import json\njson.decoder.scanner",
    "open_passwd": "open('/etc/passwd').read()",
    "open_parent": "open('../{canary_name}', 'w').write('x')",
    "open_absolute_write": "open('{canary}', 'w').write('x')",
    "open_binary": "open('x', 'wb')",
    "subclasses_walk": "().__class__.__bases__[0].__subclasses__()",
    "getattr_subclasses": "getattr(getattr((), '__class__'), '__subclasses__')()",
    "func_globals": "def f(): pass\nf.__globals__",
    "tool_globals": "getattr(find_customer, '__globals__')['os']",
    "builtins_name": "__builtins__['open']('/etc/passwd')",
    "frame_walk": "g = (i for i in [1])\ng.gi_frame.f_back.f_globals",
    "exception_traceback": "try:\n    1/0\nexcept Exception as e:\n    e.__traceback__.tb_frame",
    "str_format_escape": "'{0.__class__.__mro__}'.format(1)",
    "format_map": "'{x.__class__}'.format_map({'x': 1})",
    "exec_builtin": "exec('import os')",
    "eval_builtin": "eval('1+1')",
    "compile_builtin": "compile('1', 'f', 'eval')",
    "globals_builtin": "globals()['__builtins__']",
    "vars_builtin": "vars(find_customer)",
    "type_builtin": "type(1)",
    "class_def": "class A:\n    pass",
    "fork_bomb": "import os\nwhile True:\n    os.fork()",
    "threads": "import threading\nthreading.Thread(target=print).start()",
    "infinite_loop": "while True:\n    pass",
    "deep_recursion": "def f(n):\n    return f(n + 1)\nf(0)",
    "huge_allocation": "x = [0] * 10**10",
    "huge_string": "x = 'a' * 10**10",
    "huge_output": "while True:\n    print('x' * 10000)",
    "exit": "raise SystemExit(0)",
    "keyboard_interrupt": "raise KeyboardInterrupt",
    "catch_base_exception_loop": (
        "while True:\n    try:\n        print('y' * 10**6)\n    except BaseException:\n        pass"
    ),
    "syntax_error": "def (:",
    "tool_flood": "while True:\n    find_customer('alice')",
    "setattr_tool": "setattr(find_customer, 'name', 'x')",
    "regex_bomb": "import re\nre.match('(a+)+$', 'a' * 40 + 'b')",
    "print_to_file": "print('x', file=open('y', 'w'))",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_code_is_an_error_observation_and_nothing_escapes(name, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    canary = outside / "canary"
    code = HOSTILE[name].replace("{canary}", str(canary)).replace("{canary_name}", canary.name)
    cwd, environ = os.getcwd(), dict(os.environ)
    limits = SandboxLimits(cpu_s=1, wall_s=10, memory_mb=256, output_chars=300, max_calls=20)
    t0 = time.monotonic()
    result = run(code, limits)
    assert result.error is not None, f"{name} ran: {result.text!r}"
    assert result.observation().kind == "tool_error"
    assert result.text.startswith("Error:") or "\nError:" in result.text
    assert len(result.text) < 300 + 400  # within the output limit (plus the error line)
    assert time.monotonic() - t0 < 12  # within the wall limit
    assert not canary.exists() and list(outside.iterdir()) == []
    assert (os.getcwd(), dict(os.environ)) == (cwd, environ)


def test_the_corpus_is_big_enough():
    assert len(HOSTILE) >= 30


def test_model_code_is_only_executed_by_the_worker_process():
    """The worker (which runs model code) is started as a script, never imported."""
    root = Path(__file__).resolve().parents[1]
    importers = [
        p for d in ("src", "tasks", "flows", "bench") for p in (root / d).rglob("*.py")
        if "sandbox.worker" in p.read_text() or "sandbox import worker" in p.read_text()
    ]  # fmt: skip
    assert importers == [] and WORKER.exists()
