"""bench/parallel.py: --workers gives the same results in the same order as one process, and a
SIGTERM to the bench takes its workers down with it (they used to run on, unseen, for the rest
of their arms)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bench.parallel import run_jobs

ROOT = Path(__file__).resolve().parents[1]


def arm(name: str, seed: int) -> dict:
    return {"arm": name, "seed": seed, "pid": os.getpid()}


def test_workers_return_what_one_process_returns_in_job_order():
    jobs = [(name, seed) for seed in (0, 1) for name in ("a", "b", "c")]
    seen = []
    alone = run_jobs(arm, jobs, 1)
    pooled = run_jobs(arm, jobs, 2, done=lambda r: seen.append(r) or r)
    strip = [[(r["arm"], r["seed"]) for r in rs] for rs in (alone, pooled)]
    assert strip[0] == strip[1] == jobs
    assert seen == pooled
    assert {r["pid"] for r in alone} == {os.getpid()}
    assert os.getpid() not in {r["pid"] for r in pooled}


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_sigterm_to_the_bench_terminates_its_workers(tmp_path):
    script = tmp_path / "bench_like.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from bench.parallel import run_jobs

        def nap(seconds):
            os.write(1, f"{{os.getpid()}}\\n".encode())  # one write: two workers share the pipe
            time.sleep(seconds)
            return {{}}

        if __name__ == "__main__":
            run_jobs(nap, [(120,), (120,), (120,)], 2)
        """)
    )
    bench = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(bench.stdout.readline()) for _ in range(2)]
        assert all(running(pid) for pid in workers)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while any(running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(running(pid) for pid in workers), "workers outlived the bench"
    finally:
        bench.kill()
        bench.stdout.close()
