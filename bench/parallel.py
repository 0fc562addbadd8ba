"""Run a bench's independent arms in worker processes (`--workers`): 2 on 2 cores runs two
arms at once. Each worker gets one torch thread; an arm must be seeded by its job alone, so
its figures do not depend on the process it ran in.

spawn, not fork: a forked child would inherit torch's thread pools. multiprocessing.Pool, not
ProcessPoolExecutor: leaving its `with` (an arm's error, Ctrl-C, or SIGTERM, made to unwind
like Ctrl-C) terminates the workers instead of leaving them to finish their arms unseen."""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable

import torch


def exit_on_sigterm(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def one_torch_thread() -> None:
    torch.set_num_threads(1)


def run_jobs(
    fn: Callable[..., dict],
    jobs: list[tuple],
    workers: int,
    done: Callable[[dict], dict] = lambda result: result,
) -> list[dict]:
    """fn(*job) for every job, results in the jobs' order; `done` sees each as it is collected
    (to print it, so a long bench shows progress). fn must be a module-level function."""
    if workers <= 1:
        return [done(fn(*job)) for job in jobs]
    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(workers, initializer=one_torch_thread) as pool:
            pending = [pool.apply_async(fn, job) for job in jobs]
            return [done(result.get()) for result in pending]
    finally:  # the caller's own handling of SIGTERM comes back
        signal.signal(signal.SIGTERM, previous)
