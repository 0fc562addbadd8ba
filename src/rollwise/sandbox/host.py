"""The pipeline's side of the code sandbox: start the child, serve its tool calls, enforce the
wall clock, and turn whatever happened into one observation.

The model's text never runs in this process: it goes to sandbox/worker.py, a fresh interpreter
started with an emptied environment in a private temp folder (deleted afterwards), in its own
process group. The worker limits itself before touching the text (CPU seconds, address space,
file size, open files, no child processes, no network namespace where the kernel allows it,
`nobody` when started as root); this side adds the wall clock (the whole group is killed at
`wall_s`), a cap on every line it reads back, and a cap on tool calls. Each tool call the code
makes comes here as data (name, arguments) and runs through `call_tool`, which the rollout
engine makes into one recorded step with its fingerprints, exactly like a direct call.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rollwise.types import Observation

WORKER = Path(__file__).with_name("worker.py")
LINE_CAP = 8 * 2**20  # the most one message from the child may hold (a call's arguments)
ERROR_CHARS = 300  # an error's share of the observation, past `output_chars`


@dataclass(frozen=True)
class SandboxLimits:
    """What one code action may spend (params rollout.sandbox)."""

    cpu_s: float = 5.0  # CPU seconds (RLIMIT_CPU; the kernel kills past it)
    wall_s: float = 20.0  # wall seconds, tool calls included (the host kills past it)
    memory_mb: int = 512  # address space of the child (RLIMIT_AS)
    output_chars: int = 2000  # observation text; printing past 4x this stops the code
    file_mb: int = 1  # largest file it may write in its temp folder (RLIMIT_FSIZE)
    open_files: int = 32  # RLIMIT_NOFILE
    max_calls: int = 64  # tool calls per code action
    max_code_chars: int = 20000


@dataclass(frozen=True)
class CodeResult:
    """One code action's outcome: the observation text and whether it was an error."""

    text: str
    error: str | None = None
    calls: int = 0
    layers: dict = field(default_factory=dict)  # OS layers the child reported (netns, nobody)

    def observation(self) -> Observation:
        return Observation(self.text, "ok" if self.error is None else "tool_error")


CallTool = Callable[[str, dict], Observation]


def run_code(
    code: str, tools: dict[str, list[str]], call_tool: CallTool, limits: SandboxLimits
) -> CodeResult:
    """Run `code` in a fresh sandboxed process; `tools` maps each tool name to its argument
    names in order (positional calls); `call_tool(name, arguments)` runs one call."""
    if len(code) > limits.max_code_chars:
        return failed(f"code action longer than {limits.max_code_chars} characters", limits)
    folder = tempfile.mkdtemp(prefix="rollwise-sandbox-")
    try:
        proc = start(folder)
        try:
            return serve(proc, code, tools, call_tool, limits)
        finally:
            stop(proc)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def start(folder: str) -> subprocess.Popen:
    """The child: the venv's interpreter, no user site, no script dir on the path, no .pyc
    writes, an environment of one variable (a fixed hash seed: same code, same output)."""
    return subprocess.Popen(
        [sys.executable, "-s", "-P", "-B", str(WORKER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=folder,
        env={"PYTHONHASHSEED": "0"},
        start_new_session=True,  # its own process group: killed as one
        close_fds=True,
    )


def stop(proc: subprocess.Popen) -> None:
    """Kill the child's process group (it may not have children; kill it whole anyway)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        pipe.close()


def reader(proc: subprocess.Popen, lines: queue.Queue) -> None:
    """Lines from the child, each capped; None at the end (or on an oversized line)."""
    while True:
        line = proc.stdout.readline(LINE_CAP)
        if not line or not line.endswith(b"\n"):
            lines.put(None)
            return
        lines.put(line)


def serve(proc, code: str, tools: dict, call_tool: CallTool, limits: SandboxLimits) -> CodeResult:
    """Send the request, answer tool calls until the child is done, dies, or runs out of time."""
    deadline = time.monotonic() + limits.wall_s
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=reader, args=(proc, lines), daemon=True).start()
    request = {"code": code, "tools": tools, "max_calls": limits.max_calls,
               "limits": {**limits.__dict__, "output_chars": 4 * limits.output_chars}}  # fmt: skip
    calls = 0
    if not send(proc, request):
        return failed("sandbox: the process did not start", limits)
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return failed(f"wall time limit exceeded ({limits.wall_s:g} s)", limits, calls)
        if line is None:
            return failed(death(proc), limits, calls)
        message = json.loads(line)
        if message.get("op") == "done":
            return finished(message, limits, calls)
        calls += 1
        if calls > limits.max_calls:
            return failed("too many tool calls in one code action", limits, calls)
        obs = call_tool(message["name"], message["arguments"])
        if not send(proc, {"kind": obs.kind, "content": obs.content}):
            return failed(death(proc), limits, calls)


def send(proc: subprocess.Popen, message: dict) -> bool:
    try:
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()
        return True
    except (BrokenPipeError, OSError):
        return False


def death(proc: subprocess.Popen) -> str:
    """Why the child ended without an answer (its exit status, read as a limit where it is)."""
    try:
        code = proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        return "sandbox: the process stopped answering"
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        return "CPU time limit exceeded"
    if code == -signal.SIGXFSZ:
        return "file size limit exceeded"
    return f"sandbox: the process ended with status {code}"


def failed(error: str, limits: SandboxLimits, calls: int = 0) -> CodeResult:
    return CodeResult(f"Error: {error[:ERROR_CHARS]}", error, calls)


def finished(message: dict, limits: SandboxLimits, calls: int) -> CodeResult:
    """The observation: what the code printed, then the last expression's value (repr), cut to
    `output_chars`; then its error, if it raised (never cut away: at most ERROR_CHARS more)."""
    parts = [message["stdout"].rstrip("\n")] if message["stdout"] else []
    parts += [message["value"]] if message["value"] is not None else []
    text = clip("\n".join(parts), limits.output_chars)
    if message["error"]:
        text = (text + "\n" if text else "") + f"Error: {message['error'][:ERROR_CHARS]}"
    return CodeResult(text or "(no output)", message["error"], calls, message["layers"])


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [truncated: {len(text) - limit} more characters]"
