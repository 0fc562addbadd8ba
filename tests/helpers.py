"""Small shared builders for unit tests: a tiny generated suite, its tokenizer, a tiny model."""

from __future__ import annotations

from pathlib import Path

from rollwise.config import EnvsConfig, PolicyConfig

# 3 environments x 10 tasks, one environment held out: generates in well under a second.
SMALL_ENVS = EnvsConfig(
    seed=0, n_envs=3, tasks_per_env=10, owners_per_env=4, max_records=2, heldout_envs=1
)
TINY_POLICY = PolicyConfig(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, seed=0)


def make_suite(out: Path, cfg: EnvsConfig = SMALL_ENVS) -> dict:
    from rollwise.envs.generate import generate_suite

    return generate_suite(cfg, Path(out))


def suite_and_tokenizer(out: Path):
    """(Suite, tokenizer) the way the warmstart stage builds them."""
    from rollwise.envs.runtime import load_suite
    from tasks.warmstart import suite_tokenizer

    make_suite(out)
    suite = load_suite(out)
    return suite, suite_tokenizer(suite)
