"""The vLLM backend: an HTTP client of a vLLM server's OpenAI-compatible completions API, and a
launcher that serves a checkpoint from vLLM's own environment.

vLLM cannot share an environment with Prefect (vLLM 0.33 pins fastapi<0.137, Prefect 3.9 needs
>=0.139; stack-notes.md), so it runs as a separate process from `.venv-vllm` (`make vllm-env`)
and rollwise only speaks HTTP to it. Token in, token out: prompts go as token-id lists, and
`return_token_ids` brings back the generated ids (the stop token included) with each one's
log-prob. The launcher starts vLLM with `--logprobs-mode processed_logprobs`, so those log-probs
are of the distribution actually sampled from (temperature and top-p applied, renormalized:
the same definition as policy/hf.py's `sampling_logprobs`), and `--generation-config vllm`, so
no sampling default from the checkpoint's generation_config.json slips in.

Each prompt is its own request carrying its own seed (one seed per request is all the API
takes), sent concurrently; the server batches them. A round's weights are reloaded by restart:
the rollout stage serves `models/round_{r-1}` for its duration (`endpoint`), or `reload` moves a
running server to a new checkpoint on the same port.

Settings that belong to the machine, not to the experiment (so they are not DVC params):
ROLLWISE_VLLM_CMD (default `.venv-vllm/bin/vllm`) and ROLLWISE_VLLM_ARGS (extra `vllm serve`
flags, e.g. `--dtype float32 --gpu-memory-utilization 0.5`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rollwise.policy.hf import Completion

SERVED_NAME = "rollwise-policy"
VLLM_FLAGS = ("--logprobs-mode", "processed_logprobs", "--generation-config", "vllm")
QUIET_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}


# ------------------------------------------------------------------------------ client


class VLLMBackend:
    """`generate(prompts, ...)` with HFBackend's contract, answered by an OpenAI-compatible
    completions server (vLLM, or anything that takes token-id prompts and `return_token_ids`)."""

    def __init__(self, url: str, stop_id: int, concurrency: int = 256, timeout_s: float = 600.0):
        self.url, self.stop_id = url.rstrip("/"), stop_id
        self.concurrency, self.timeout_s = concurrency, timeout_s
        self.model = served_model(self.url, timeout_s)

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int | Sequence[int] | None = None,
        top_p: float = 1.0,
    ) -> list[Completion]:
        """One request per prompt, concurrently, in prompt order. Seeds as HFBackend: a sequence
        is one per prompt; an int gives prompt i the seed `seed + i`; None lets the server draw."""
        seeds = row_seeds(seed, len(prompts))
        bodies = [
            self.body(p, max_new_tokens, temperature, greedy, s, top_p)
            for p, s in zip(prompts, seeds, strict=True)
        ]
        if not bodies:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(bodies))) as pool:
            return list(pool.map(self.complete, bodies))

    def body(
        self,
        prompt: list[int],
        max_new_tokens: int,
        temperature: float,
        greedy: bool,
        seed: int | None,
        top_p: float,
    ) -> dict:
        """The request: stop only on our stop token (ignore_eos: the checkpoint's own EOS may
        differ), greedy as temperature 0, the sampled token's log-prob (logprobs 0)."""
        return {
            "model": self.model,
            "prompt": [int(t) for t in prompt],
            "max_tokens": max_new_tokens,
            "temperature": 0.0 if greedy else temperature,
            "top_p": 1.0 if greedy else top_p,
            "seed": seed,
            "logprobs": 0,
            "stop_token_ids": [self.stop_id],
            "ignore_eos": True,
            "skip_special_tokens": False,
            "return_token_ids": True,
        }

    def complete(self, body: dict) -> Completion:
        answer = post_json(f"{self.url}/v1/completions", body, self.timeout_s)
        return parse_choice(answer["choices"][0], self.stop_id, self.url)


def row_seeds(seed: int | Sequence[int] | None, rows: int) -> list[int | None]:
    if seed is None:
        return [None] * rows
    if isinstance(seed, int):
        return [seed + i for i in range(rows)]
    if len(seed) != rows:
        raise ValueError(f"got {len(seed)} seeds for {rows} prompts")
    return [int(s) for s in seed]


def parse_choice(choice: dict, stop_id: int, url: str) -> Completion:
    """A completion choice -> Completion; a server without token ids or log-probs is refused
    (a text-only answer would force a re-tokenization, which drifts)."""
    ids = choice.get("token_ids")
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    if ids is None or logprobs is None:
        raise RuntimeError(
            f"{url}: the completion has no token_ids/log-probs; the server must honour "
            "`return_token_ids` and `logprobs` (as vLLM's completions API does)"
        )
    if len(ids) != len(logprobs):
        raise RuntimeError(f"{url}: {len(ids)} token ids but {len(logprobs)} log-probs")
    stopped = choice.get("finish_reason") == "stop" and bool(ids) and ids[-1] == stop_id
    return Completion([int(t) for t in ids], [float(x) for x in logprobs], stopped)


def post_json(url: str, body: dict, timeout_s: float) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    return read_json(request, timeout_s)


def read_json(request: urllib.request.Request | str, timeout_s: float) -> dict:
    """The JSON answer, or an error that names the URL and what the server said."""
    url = request if isinstance(request, str) else request.full_url
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:500]
        raise RuntimeError(f"{url}: HTTP {e.code}: {detail}") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
        raise RuntimeError(f"{url}: unreachable ({e}); is the server running?") from None


def served_model(url: str, timeout_s: float = 30.0) -> str:
    """The name the server serves its model under (the first of GET /v1/models)."""
    models = read_json(f"{url.rstrip('/')}/v1/models", timeout_s).get("data") or []
    if not models:
        raise RuntimeError(f"{url}: serves no model")
    return models[0]["id"]


# ------------------------------------------------------------------------------ launcher


@dataclass
class Server:
    """A `vllm serve` process on 127.0.0.1, its own process group, its log file."""

    url: str
    port: int
    checkpoint: Path
    proc: subprocess.Popen
    log: Path
    cmd: list[str]  # the executable part, kept for reload
    extra_args: list[str]
    started_s: float  # seconds from launch to healthy


def vllm_command() -> list[str]:
    return shlex.split(os.environ.get("ROLLWISE_VLLM_CMD", ".venv-vllm/bin/vllm"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    checkpoint: Path,
    port: int | None = None,
    cmd: Sequence[str] | None = None,
    extra_args: Sequence[str] | None = None,
    timeout_s: float = 900.0,
) -> Server:
    """Start `<cmd> serve <checkpoint>` on 127.0.0.1 and wait until GET /health answers 200.
    Fails with the log's tail if the process exits first or is not healthy in time (a first
    start compiles and captures CUDA graphs: minutes)."""
    cmd = list(cmd) if cmd is not None else vllm_command()
    if extra_args is None:
        extra_args = shlex.split(os.environ.get("ROLLWISE_VLLM_ARGS", ""))
    port = port or free_port()
    log = Path(tempfile.gettempdir()) / f"rollwise-vllm-{port}.log"
    argv = [*cmd, "serve", str(checkpoint), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--served-model-name", SERVED_NAME, *VLLM_FLAGS, *extra_args]
    t0 = time.monotonic()
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            argv,
            env={**os.environ, **QUIET_ENV},
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stop() takes its workers down too
        )
    url = f"http://127.0.0.1:{port}"
    server = Server(url, port, Path(checkpoint), proc, log, cmd, list(extra_args), 0.0)
    wait_healthy(server, t0 + timeout_s)
    server.started_s = time.monotonic() - t0
    return server


def wait_healthy(server: Server, deadline: float) -> None:
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"{server.url}: the server exited ({server.proc.returncode}) before it was "
                f"healthy; {server.log}:\n{tail(server.log)}"
            )
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    stop(server)
    raise RuntimeError(f"{server.url}: not healthy in time; {server.log}:\n{tail(server.log)}")


def tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def stop(server: Server, grace_s: float = 30.0) -> None:
    """SIGTERM to the server's process group, SIGKILL if it lingers."""
    if server.proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.proc.pid, signal.SIGTERM)
    try:
        server.proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()


def reload(server: Server, checkpoint: Path, timeout_s: float = 900.0) -> Server:
    """The same server on new weights: stop it, start it on `checkpoint` at the same port."""
    stop(server)
    return launch(checkpoint, server.port, server.cmd, server.extra_args, timeout_s)


@contextlib.contextmanager
def serving(checkpoint: Path, **kwargs) -> Iterator[Server]:
    server = launch(checkpoint, **kwargs)
    try:
        yield server
    finally:
        stop(server)


@contextlib.contextmanager
def endpoint(checkpoint: Path, url: str | None = None) -> Iterator[str]:
    """The URL to send requests to: the user's server (`rollout.vllm_url`, which must already
    serve this checkpoint), else one started on `checkpoint` for the duration."""
    if url:
        yield url
        return
    with serving(checkpoint) as server:
        yield server.url
