"""A small OpenAI-compatible completions server wrapping the transformers backend, for the HTTP
half of the backend contract tests (tests/test_backends.py) on a machine without a GPU.

Why not `transformers serve`: in the installed transformers (5.24) its /v1/completions takes a
text prompt only and lists `logprobs` among the fields it ignores, so it can do neither token in
nor log-probs out. vLLM cannot be installed beside Prefect (stack-notes.md) and needs CUDA.

It speaks the part of vLLM's API that policy/vllm.py uses, with vLLM's shapes: POST
/v1/completions with a token-id prompt, `max_tokens`, `temperature` (0 = greedy), `top_p`,
`seed`, `logprobs`, `stop_token_ids`, `return_token_ids`; GET /health and /v1/models. It takes
the command line of `vllm serve` (`serve CHECKPOINT --host H --port P ...`), so policy/vllm.py's
launcher can start it in place of vLLM; it refuses a `--logprobs-mode` other than
processed_logprobs, the only one it implements (HFBackend's log-probs are of the distribution
sampled from). Standard library HTTP; one generation at a time.

    python -m tests.openai_server serve models/round_00 --host 127.0.0.1 --port 8011
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def completion(backend, lock: threading.Lock, name: str, req: dict) -> tuple[int, dict]:
    """(HTTP status, body) of one /v1/completions request, answered by `backend` (HFBackend)."""
    prompt = req.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts = prompt
    else:
        return 400, {"error": {"message": "prompt must be token ids (this server has no text)"}}
    stops = req.get("stop_token_ids") or [backend.tokenizer.eos_token_id]
    temperature = req.get("temperature", 1.0)
    seed = req.get("seed")
    with lock:
        backend.stop_id = stops[0]
        outs = backend.generate(
            prompts,
            int(req.get("max_tokens", 16)),
            temperature or 1.0,
            greedy=temperature == 0,
            seed=None if seed is None else [int(seed)] * len(prompts),
            top_p=float(req.get("top_p", 1.0)),
        )
    return 200, {
        "id": f"cmpl-{time.time_ns()}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": [choice(i, out, req, backend.tokenizer) for i, out in enumerate(outs)],
        "usage": {
            "prompt_tokens": sum(map(len, prompts)),
            "completion_tokens": sum(len(o.token_ids) for o in outs),
        },
    }


def choice(index: int, out, req: dict, tokenizer) -> dict:
    body = {
        "index": index,
        "text": tokenizer.decode(out.token_ids, skip_special_tokens=False),
        "finish_reason": "stop" if out.stopped else "length",
        "stop_reason": out.token_ids[-1] if out.stopped else None,
        "logprobs": None,
    }
    if req.get("logprobs") is not None:
        body["logprobs"] = {
            "tokens": [f"token_id:{t}" for t in out.token_ids],
            "token_logprobs": out.logprobs,
            "top_logprobs": [],
            "text_offset": [],
        }
    if req.get("return_token_ids"):
        body["token_ids"] = out.token_ids
    return body


def make_handler(backend, name: str, checkpoint: str) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self.reply(200, {})
            elif self.path == "/v1/models":
                self.reply(200, {"object": "list", "data": [{"id": name, "root": checkpoint}]})
            else:
                self.reply(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            if self.path != "/v1/completions":
                self.reply(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            except (ValueError, TypeError):
                self.reply(400, {"error": {"message": "body is not JSON"}})
                return
            self.reply(*completion(backend, lock, name, req))

        def reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:  # quiet: the tests read results, not access logs
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description="vllm-serve-like test server (see docstring)")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("checkpoint")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--logprobs-mode", default="raw_logprobs")
    args, _ = parser.parse_known_args()  # other vLLM flags (e.g. --generation-config) ignored
    if args.logprobs_mode != "processed_logprobs":
        parser.error("only --logprobs-mode processed_logprobs is implemented")

    import torch

    from rollwise.policy.build import load_policy
    from rollwise.policy.hf import HFBackend

    torch.set_num_threads(1)  # a test server shares the cores with the tests
    model, tokenizer = load_policy(Path(args.checkpoint))
    name = args.served_model_name or args.checkpoint
    handler = make_handler(HFBackend(model, tokenizer), name, args.checkpoint)
    ThreadingHTTPServer((args.host, args.port), handler).serve_forever()


if __name__ == "__main__":
    main()
