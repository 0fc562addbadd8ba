"""Where a rollout plan runs: `local` (this process) or `ray` (contiguous shards on Ray workers,
each holding its own policy replica and suite). Both give the same rows in plan order, episode
for episode: sampling is seeded per episode and turn (engine.turn_seed, policy/hf.py), so how the
plan is split or batched changes no episode.

One signature, one dispatch dict: EXECUTORS[name](specs, policy_dir, suite_dir, limits, cfg,
load=None) -> (episode rows, step rows). Either runs on either backend (policy/backends.py); with
`vllm`, Ray workers share the one server. Ray is imported only inside the ray executor (the `ray`
extra).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes

Rows = tuple[list[dict], list[dict]]  # (episode rows, step rows), as run_episodes returns them


def run_local(
    specs: list[EpisodeSpec],
    policy_dir: Path,
    suite_dir: Path,
    limits: Limits,
    cfg,
    load: Callable[[], tuple] | None = None,
) -> Rows:
    """The whole plan in this process, on the caller's specs (their envs are used as given).
    `load` returns (model, tokenizer) of policy_dir, e.g. from the caller's cache."""
    from rollwise.policy.backends import BACKENDS

    with BACKENDS[cfg.backend](Path(policy_dir), cfg, load) as (backend, tokenizer):
        return run_episodes(specs, backend, tokenizer, limits)


def spec_row(spec: EpisodeSpec) -> dict:
    """What a worker needs to rebuild a spec from its own suite: environments never travel, an
    opening demonstration (curate.demonstrations) does, as plain messages."""
    return {
        "episode_id": spec.episode_id,
        "task_id": spec.task.task_id,
        "group": spec.group,
        "sample": spec.sample,
        "seed": spec.seed,
        "demo": getattr(spec.env, "demo", None),
    }


class RolloutWorker:
    """One policy replica (or a client of the vLLM server at `vllm_url`) and one copy of the
    suite, loaded once, that runs shards of a plan. A plain class: the ray executor wraps it
    with `ray.remote`; tests may call it directly."""

    def __init__(
        self, policy_dir: str, suite_dir: str, threads: int = 1, vllm_url: str | None = None
    ):
        import torch

        from rollwise.envs.runtime import load_suite
        from rollwise.policy.build import load_policy, load_tokenizer
        from rollwise.policy.hf import HFBackend
        from rollwise.policy.vllm import VLLMBackend

        torch.set_num_threads(threads)  # one per worker: workers share the machine's cores
        if vllm_url:
            self.tokenizer = load_tokenizer(Path(policy_dir))
            self.backend = VLLMBackend(vllm_url, self.tokenizer.eos_token_id)
        else:
            model, self.tokenizer = load_policy(Path(policy_dir))
            self.backend = HFBackend(model, self.tokenizer)
        self.suite = load_suite(Path(suite_dir))

    def run(self, rows: list[dict], limits: Limits) -> Rows:
        from rollwise.curate.success_bank import Demonstrated

        specs = []
        for r in rows:
            task = self.suite.tasks[r["task_id"]]
            env = clone_env(self.suite.envs[task.env_id])
            env = Demonstrated(env, r["demo"]) if r.get("demo") else env
            specs.append(
                EpisodeSpec(r["episode_id"], task, env, r["group"], r["sample"], r["seed"])
            )
        return run_episodes(specs, self.backend, self.tokenizer, limits)


def shards(items: list, n: int) -> list[list]:
    """n contiguous, near-equal slices in order (empty ones dropped): concatenating their
    results restores plan order."""
    size, extra = divmod(len(items), n)
    bounds = [i * size + min(i, extra) for i in range(n + 1)]
    return [items[lo:hi] for lo, hi in zip(bounds, bounds[1:], strict=False) if hi > lo]


def run_ray(
    specs: list[EpisodeSpec],
    policy_dir: Path,
    suite_dir: Path,
    limits: Limits,
    cfg,
    load: Callable[[], tuple] | None = None,
) -> Rows:
    """`cfg.workers` actors, each loading the checkpoint and the suite (same paths on every node:
    a local Ray or a shared filesystem), each running one contiguous shard; merged in plan order.
    Episodes are rebuilt from the suite as clone_env(suite.envs[task.env_id]). `load` is unused:
    the driver never needs the model. With the vllm backend every worker talks to one server
    (`cfg.vllm_url`, or one the driver starts on the checkpoint)."""
    import ray

    from rollwise.policy.vllm import endpoint

    parts = shards([spec_row(s) for s in specs], cfg.workers)
    if not parts:
        return [], []
    vllm = cfg.backend == "vllm"
    server = endpoint(Path(policy_dir), cfg.vllm_url) if vllm else contextlib.nullcontext()
    with ray_session(cfg.ray_address, cfg.workers), server as url:
        actor = ray.remote(num_cpus=1)(RolloutWorker)
        paths = str(Path(policy_dir).resolve()), str(Path(suite_dir).resolve())
        workers = [actor.remote(*paths, vllm_url=url) for _ in parts]
        try:
            results = ray.get(
                [w.run.remote(p, limits) for w, p in zip(workers, parts, strict=True)]
            )
        finally:
            for w in workers:
                ray.kill(w)
    return [e for eps, _ in results for e in eps], [s for _, steps in results for s in steps]


@contextlib.contextmanager
def ray_session(address: str | None, workers: int) -> Iterator[None]:
    """Use a Ray this process already joined; else connect to `address` (params, then
    RAY_ADDRESS); else start a local Ray with `workers` CPUs, no token auth and its files in a
    temp dir (stack-notes.md: otherwise it writes ~/.ray). Disconnects only what it opened."""
    import ray

    if ray.is_initialized():
        yield
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(num_cpus=workers, include_dashboard=False, _temp_dir=ray_temp_dir())
    try:
        yield
    finally:
        ray.shutdown()


def ray_temp_dir() -> str:
    """$TMPDIR/ray, or /tmp/ray-<uid> when that path is long: Ray's socket paths under it must
    stay within the 107-byte AF_UNIX limit."""
    path = Path(tempfile.gettempdir()) / "ray"
    if len(str(path)) > 40:
        path = Path("/tmp") / f"ray-{os.getuid()}"
    return str(path)


EXECUTORS = {"local": run_local, "ray": run_ray}
