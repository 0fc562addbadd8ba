"""How BFCL's executor (bfcl_eval multi_turn_utils.execute_multi_turn_func_call) answers a call,
without its eval: the methods run by name on a whitelist (envs/bfcl.py), and the calls it answers
with "Error during execution: ..." before any method body runs get the same text here:

- a call string that does not compile (an unescaped quote in a string literal, ...): Python's
  SyntaxError message, from `compile` (which runs nothing), after BFCL's own rewriting of method
  names (`_process_method_calls`) and eval's stripping of leading blanks;
- a name on BFCL's list of refused functions (kill, exit, ...): its refusal;
- a function the entry's instances lack: the NameError eval raises;
- arguments that do not bind (one the function lacks, a required one missing, too many
  positional): the TypeError Python raises when the method is called with them, which happens
  before its body runs.

A ground-truth call string that parses becomes a ToolCall with named arguments, bound by the
method's signature where they bind; one that does not compile, or has positional arguments that
cannot be named, keeps its text under the single argument RAW, and only its error is ever
computed from it. Departures: a name BFCL's eval would find among Python's builtins or its own
module globals (len, print, json, ...) is "not defined" here, and BFCL's rewriting of method names
inside string literals is not applied to the arguments a method gets.
"""

from __future__ import annotations

import ast
import copy
import decimal
import functools
import inspect
import json
import keyword
import threading
from collections.abc import Callable

import mpmath
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import _process_method_calls

from rollwise.envs.schema import MAX_ARGUMENTS
from rollwise.types import ToolCall

RAW = "bfcl_call"  # the argument that holds a ground-truth call string kept as text
REFUSED = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")  # BFCL's list
MAX_PRECISION = 1000  # digits MathAPI may be asked for (it sets a process-wide precision)
MAX_POWER_BITS = 1_000_000  # int ** int beyond this would run for minutes
_CALLS = threading.Lock()  # one BFCL call at a time: see envs/bfcl.py's docstring


def result_text(value: object) -> str:
    """A call's result as BFCL's executor renders it."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def hazard(name: str, arguments: dict) -> str | None:
    """Arguments that would run for minutes or set precision beyond reason (MathAPI)."""
    precision = arguments.get("precision")
    if isinstance(precision, int) and precision > MAX_PRECISION:
        return f"precision must be at most {MAX_PRECISION}"
    base, exponent = arguments.get("base"), arguments.get("exponent")
    if name == "power" and isinstance(base, int) and isinstance(exponent, int):
        if abs(exponent) * max(abs(base), 1).bit_length() > MAX_POWER_BITS:
            return "the result would be too large"
    return None


def call_method(method: Callable, arguments: dict, positional: tuple = ()) -> tuple[str, bool]:
    """(result text, ok). An exception is a result, as in BFCL; so is an {"error": ...} dict,
    which counts as not ok. Process-wide precision settings are restored after the call.
    The method gets a deep copy of the arguments: BFCL's classes keep list arguments by
    reference and later calls extend them (post_tweet's mentions), which would otherwise change
    the caller's ToolCall, a task's oracle among them. Nothing else leaves the instance: the
    result is rendered to text under the lock, before another call can change what it refers to.
    """
    with _CALLS, mpmath.workdps(mpmath.mp.dps), decimal.localcontext():
        try:
            value = method(*copy.deepcopy(positional), **copy.deepcopy(arguments))
        except Exception as e:
            return f"Error during execution: {e}", False
        return result_text(value), not (isinstance(value, dict) and "error" in value)


@functools.cache
def _signature(function: Callable) -> inspect.Signature:
    return inspect.signature(function)


def bind(method: Callable, args: list | tuple, kwargs: dict) -> dict:
    """The arguments by name, bound as a call of the bound method binds them (TypeError if
    they do not bind); the signature is read once per function."""
    bound = _signature(method.__func__).bind(method.__self__, *args, **kwargs)
    return dict(list(bound.arguments.items())[1:])  # without self


def split_call(text: str) -> tuple[str, list, dict]:
    """(name, positional, keyword) of `name(arg, key=value)`, values by literal_eval. Raises
    SyntaxError where BFCL's eval would, ValueError for anything but a plain call of literals."""
    source = text.lstrip(" \t")  # as eval strips a string
    compile(source, "<string>", "eval")  # compiles, runs nothing: the errors eval would raise
    node = ast.parse(source, mode="eval").body
    plain = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    if not plain or any(k.arg is None for k in node.keywords):
        raise ValueError(f"not a plain call: {text!r}")
    try:
        args = [ast.literal_eval(a) for a in node.args]
        return node.func.id, args, {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except (TypeError, ValueError) as e:  # a nested call, a name, {[1]: 2}: not ours to run
        raise ValueError(f"an argument is not a literal ({e}): {text!r}") from e


def as_json(arguments: dict) -> dict:
    """Arguments as a policy would send them (through JSON: tuples become lists); ValueError
    for what JSON cannot carry (a set, bytes), which a policy could never send."""
    try:
        return json.loads(json.dumps(arguments))
    except TypeError as e:
        raise ValueError(f"arguments are not JSON ({e})") from e


def parse_call(text: str, methods: dict[str, Callable]) -> ToolCall:
    """A ground-truth call string as a ToolCall: named arguments where they bind to the method
    (positional ones named by its signature), as written where they do not (the call is then
    BFCL's error, name_error below), RAW where it does not compile or its positional arguments
    cannot be named. Raises ValueError for what BFCL would evaluate and we cannot: nested
    calls, expressions that are not literals."""
    try:
        name, args, kwargs = split_call(text)
    except SyntaxError:
        return ToolCall(text.split("(")[0].strip(), {RAW: text})
    if name in methods:
        try:
            return ToolCall(name, as_json(bind(methods[name], args, kwargs)))
        except TypeError:
            pass
    return ToolCall(name, as_json(kwargs)) if not args else ToolCall(name, {RAW: text})


def name_error(methods: dict[str, Callable], name: str, args: list, kwargs: dict) -> str | None:
    """BFCL's error for a parsed call that never reaches a method body, else None."""
    if name in REFUSED:
        return f"Error during execution: Function call {name} is not allowed."
    if name not in methods:
        return f"Error during execution: name '{name}' is not defined"
    try:
        bind(methods[name], args, kwargs)
    except TypeError:  # the call raises Python's own TypeError before the body runs
        return call_method(methods[name], kwargs, tuple(args))[0]
    return None


def text_error(methods: dict[str, Callable], text: str) -> str | None:
    """BFCL's error for a call string (rewritten, refused, compiled, then looked up), else None
    (also for a string we cannot take apart: its call then fails as a call with RAW)."""
    processed = _process_method_calls(text, {name: "instance" for name in methods})
    called = processed.split("(")[0]
    called = called.split(".")[1] if "." in called else called
    if called in REFUSED:
        return f"Error during execution: Function call {called} is not allowed."
    try:
        compile(processed.lstrip(" \t"), "<string>", "eval")
    except Exception as e:  # SyntaxError above all, as eval raises it
        return f"Error during execution: {e}"
    try:
        name, args, kwargs = split_call(text)
    except (SyntaxError, ValueError):
        return None
    return name_error(methods, name, args, kwargs)


def executor_error(methods: dict[str, Callable], call: ToolCall) -> str | None:
    """The error BFCL's executor answers `call` with before running any method, else None.
    None too for a name that is no Python identifier: the caller's own checks answer it."""
    arguments, name = call.arguments, call.name
    if not isinstance(arguments, dict):
        return None
    raw = arguments.get(RAW)
    if len(arguments) == 1 and isinstance(raw, str) and len(raw) <= MAX_ARGUMENTS:
        if (error := text_error(methods, raw)) is not None:
            return error
    if not (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)):
        return None
    return name_error(methods, name, [], arguments)


def execute(methods: dict[str, Callable], call: ToolCall) -> tuple[str, bool]:
    """A call as BFCL's executor runs it: its error if it has one, else the method's result."""
    error = executor_error(methods, call)
    return (error, False) if error is not None else call_method(methods[call.name], call.arguments)
