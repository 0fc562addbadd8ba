"""The sandbox's child process: the one place rollwise runs model-written Python.

Never imported by the pipeline: sandbox/host.py starts it as a fresh interpreter
(`python -s -P -B worker.py`, emptied environment, a private temp folder as its working
directory) and speaks JSON lines with it over stdin/stdout. Self-contained (imports no rollwise
code), so nothing of the pipeline's state is reachable from it.

Order matters: read the request, import what the code may use, then lock the process down
(a network namespace where the kernel allows one, the unprivileged `nobody` user when started
as root, rlimits on CPU, memory, file size, open files and processes), and only then compile
the model's text with RestrictedPython (no names or attributes starting with `_`, no frame or
code attributes, no exec/eval) and run it over guarded builtins: imports from an allowlist
(module views without submodules), `open` only for plain names in the temp folder, print into
a bounded buffer, and the environment's tools as functions that ask the host to run the call.
"""

import ast
import builtins
import ctypes
import importlib
import json
import operator
import os
import resource
import sys
import types

from RestrictedPython import compile_restricted_eval, compile_restricted_exec, safe_builtins
from RestrictedPython.Guards import (
    full_write_guard,
    guarded_iter_unpack_sequence,
    guarded_unpack_sequence,
    safer_getattr,
    safer_getattr_raise,
)

ALLOWED_MODULES = (
    "bisect", "collections", "datetime", "decimal", "fractions", "functools", "heapq",
    "itertools", "json", "math", "random", "re", "statistics",
)  # fmt: skip
EXTRA_BUILTINS = (
    "all", "any", "dict", "enumerate", "filter", "frozenset", "iter", "list", "map", "max",
    "min", "next", "reversed", "set", "sorted", "sum", "tuple", "zip",
)  # fmt: skip
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
NOBODY = 65534
MISSING = object()


class ToolError(Exception):
    """A tool answered with an error (the policy called it wrongly, or the environment failed)."""


class OutputLimit(BaseException):
    """Printed output passed its cap; a BaseException so `except Exception` cannot swallow it."""


class Printer:
    """RestrictedPython's `_print_`: print() into a bounded buffer (never the real stdout)."""

    def __init__(self, cap: int):
        self.parts, self.size, self.cap = [], 0, cap

    def __call__(self, _getattr_=None):
        return self

    def write(self, text: str) -> None:
        room = self.cap - self.size
        self.parts.append(text[: max(room, 0)])
        self.size += len(text)
        if self.size > self.cap:
            raise OutputLimit(f"output passed {self.cap} characters")

    def _call_print(self, *objects, sep=" ", end="\n", file=None, flush=False):
        if file is not None:
            raise TypeError("print(file=...) is not available in the sandbox")
        print(*objects, sep=sep, end=end, file=self)

    def text(self) -> str:
        return "".join(self.parts)


class Host:
    """The JSON-lines channel to sandbox/host.py (the process's real stdin and stdout)."""

    def __init__(self):
        self.stdin, self.stdout = sys.stdin, sys.stdout

    def send(self, message: dict) -> None:
        self.stdout.write(json.dumps(message) + "\n")
        self.stdout.flush()

    def receive(self) -> dict:
        line = self.stdin.readline()
        if not line:
            raise SystemExit(3)  # the host went away
        return json.loads(line)


def module_view(name: str) -> types.SimpleNamespace:
    """A module's public attributes minus its submodules and the modules it imported: so
    `statistics.sys` or `json.decoder` lead nowhere."""
    module = sys.modules[name]
    public = {
        k: v
        for k, v in vars(module).items()
        if not k.startswith("_") and not isinstance(v, types.ModuleType)
    }
    return types.SimpleNamespace(**public)


def make_import(views: dict):
    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level != 0 or name not in views:
            raise ImportError(f"import of {name!r} is not allowed (allowed: {', '.join(views)})")
        return views[name]

    return guarded_import


def make_open():
    """open() for plain file names inside the private temp folder (the working directory,
    opened relative to it), text modes only."""

    def guarded_open(name, mode="r"):
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise PermissionError("open() takes a plain file name in the sandbox's own folder")
        if mode not in ("r", "w", "a"):
            raise PermissionError("open() modes: 'r', 'w' or 'a'")
        return open(name, mode, encoding="utf-8")  # noqa: SIM115

    return guarded_open


def make_tool(host: Host, name: str, arg_names: list[str], budget: dict):
    """A tool as a Python function: positional arguments in schema order, or keywords; the host
    runs the call against the environment (one recorded step) and returns its observation."""

    def tool(*args, **kwargs):
        if len(args) > len(arg_names):
            raise TypeError(f"{name}() takes at most {len(arg_names)} positional arguments")
        arguments = dict(zip(arg_names, args, strict=False))
        for key, value in kwargs.items():
            if key in arguments:
                raise TypeError(f"{name}() got multiple values for argument {key!r}")
            arguments[key] = value
        if budget["calls"] <= 0:
            raise ToolError("too many tool calls in one code action")
        budget["calls"] -= 1
        host.send({"op": "call", "name": name, "arguments": json.loads(json.dumps(arguments))})
        reply = host.receive()
        if reply["kind"] != "ok":
            raise ToolError(reply["content"])
        try:
            return json.loads(reply["content"])
        except ValueError:
            return reply["content"]

    tool.__name__ = name
    return tool


def getitem(obj, key):
    return obj[key]


INPLACE = {
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow,
}  # fmt: skip


def inplace(op: str, x, y):
    if op not in INPLACE:
        raise TypeError(f"{op} is not supported in the sandbox")
    return INPLACE[op](x, y)


def namespace(host: Host, request: dict, printer: Printer) -> dict:
    views = {m: module_view(m) for m in ALLOWED_MODULES}
    builtins_ = dict(safe_builtins)
    builtins_.update({k: getattr(builtins, k) for k in EXTRA_BUILTINS})
    builtins_.update(
        __import__=make_import(views),
        open=make_open(),
        getattr=safer_getattr_raise,
        hasattr=lambda obj, name: safer_getattr(obj, name, MISSING) is not MISSING,
        ToolError=ToolError,
    )
    budget = {"calls": request["max_calls"]}
    tools = {n: make_tool(host, n, a, budget) for n, a in request["tools"].items()}
    return {
        "__builtins__": builtins_,
        "__name__": "sandbox",
        "_print_": printer,
        "_print": printer,  # what the body's print binds; set too for a last-expression print
        "_getattr_": safer_getattr_raise,
        "_getitem_": getitem,
        "_getiter_": iter,
        "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
        "_unpack_sequence_": guarded_unpack_sequence,
        "_write_": full_write_guard,
        "_inplacevar_": inplace,
        **tools,
    }


def unshare_network() -> bool:
    """A network namespace of its own (no interfaces but a down loopback), where allowed."""
    libc = ctypes.CDLL(None, use_errno=True)
    for flags in (CLONE_NEWNET, CLONE_NEWUSER | CLONE_NEWNET):
        if libc.unshare(flags) == 0:
            return True
    return False


def lock_down(limits: dict) -> dict:
    """OS limits on this process; returns which optional layers took (for the host's record)."""
    layers = {"netns": unshare_network(), "nobody": False}
    if os.getuid() == 0:  # root ignores RLIMIT_NPROC and can read anything: become nobody
        os.chown(os.getcwd(), NOBODY, NOBODY)  # the private folder stays writable
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        layers["nobody"] = True
    cpu = max(1, int(limits["cpu_s"]))
    memory = limits["memory_mb"] * 2**20
    file_size = limits["file_mb"] * 2**20
    for which, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (memory, memory)),
        (resource.RLIMIT_FSIZE, (file_size, file_size)),
        (resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"])),
        (resource.RLIMIT_NPROC, (0, 0)),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(which, value)
    return layers


def split_last(code: str) -> tuple[str, str | None]:
    """(the statements, the last expression's source or None): its value is shown."""
    tree = ast.parse(code)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop()
        return ast.unparse(tree), ast.unparse(last.value)
    return code, None


def run(code: str, glb: dict) -> object:
    """Compile the model's text under RestrictedPython and run it; the last expression's value."""
    body, last = split_last(code)
    compiled = compile_restricted_exec(body, "<code action>")
    if compiled.errors:
        raise SyntaxError("; ".join(compiled.errors))
    exec(compiled.code, glb)  # the sandboxed child only (see the module docstring)
    if last is None:
        return None
    compiled = compile_restricted_eval(last, "<code action>")
    if compiled.errors:
        raise SyntaxError("; ".join(compiled.errors))
    return eval(compiled.code, glb)  # the sandboxed child only


def main() -> None:
    host = Host()
    request = host.receive()
    for name in ALLOWED_MODULES:
        importlib.import_module(name)
    printer = Printer(request["limits"]["output_chars"])
    glb = namespace(host, request, printer)
    layers = lock_down(request["limits"])
    value, error = None, None
    try:
        value = run(request["code"], glb)
        value = None if value is None else repr(value)[: request["limits"]["output_chars"] + 1]
    except BaseException as exc:  # everything the model's code does wrong is its observation
        error = f"{type(exc).__name__}: {str(exc)[:500]}"
    host.send(
        {
            "op": "done",
            "stdout": printer.text(),
            "value": value,
            "error": error,
            "layers": layers,
        }  # fmt: skip
    )


if __name__ == "__main__":
    main()
