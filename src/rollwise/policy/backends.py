"""Where the policy generates, picked by `rollout.backend`. One signature, one dispatch dict:
BACKENDS[name](policy_dir, cfg, load=None) is a context manager yielding (backend, tokenizer);
each backend passes the same contract tests (tests/test_backends.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def open_hf(policy_dir: Path, cfg, load: Callable[[], tuple] | None = None) -> Iterator[tuple]:
    """transformers in this process; `load` returns (model, tokenizer), e.g. from a cache."""
    from rollwise.policy.build import load_policy
    from rollwise.policy.hf import HFBackend

    model, tokenizer = load() if load else load_policy(Path(policy_dir))
    yield HFBackend(model, tokenizer), tokenizer


@contextlib.contextmanager
def open_vllm(policy_dir: Path, cfg, load: Callable[[], tuple] | None = None) -> Iterator[tuple]:
    """A vLLM server on the checkpoint (`cfg.vllm_url`, or one started for the duration: a
    new round restarts it on the new weights); this process holds only the tokenizer."""
    from rollwise.policy.build import load_tokenizer
    from rollwise.policy.vllm import VLLMBackend, endpoint

    tokenizer = load_tokenizer(Path(policy_dir))
    with endpoint(Path(policy_dir), cfg.vllm_url) as url:
        yield VLLMBackend(url, tokenizer.eos_token_id), tokenizer


BACKENDS = {"hf": open_hf, "vllm": open_vllm}
