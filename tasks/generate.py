"""Stage `generate`: the synthetic tool-use suite -> data/envs/."""

from __future__ import annotations

from pathlib import Path

from rollwise.config import Params
from rollwise.envs.generate import generate_suite
from tasks.common import atomic_dir, envs_dir, log, stage_main


def run(params: Params, root: Path) -> dict:
    with atomic_dir(envs_dir(root)) as out:
        counts = generate_suite(params.envs, out)
    log(
        "generate",
        f"{counts['envs']} environments, {counts['tasks']} tasks "
        f"({counts['oracle_rejected']} rejected by oracle replay)",
    )
    return counts


def main() -> None:
    stage_main("generate", run)


if __name__ == "__main__":
    main()
