"""`python -m flows.serve` (make ui): serve the `pipeline` and `evaluate` deployments until Ctrl-C.

Run it from the project root with PREFECT_API_URL pointing at the Prefect server; runs triggered
from the UI then execute here, each as its own experiment (a git worktree sharing the DVC cache,
see flows/workspace.py), one at a time by default: the stages share the machine's cores.
ROLLWISE_CONCURRENT_RUNS raises that limit (runs never share a folder, so it is safe).
PREFECT_RUNNER_POLL_FREQUENCY sets how often (seconds, default 10) this process asks for new runs.
"""

from __future__ import annotations

import os

from prefect import serve

from flows.pipeline import evaluate_only, pipeline

DEPLOYMENTS = {"pipeline": pipeline, "evaluate": evaluate_only}


def main() -> None:
    api = os.environ.get("PREFECT_API_URL") or "(PREFECT_API_URL unset: Prefect's own default)"
    print(f"serving {', '.join(DEPLOYMENTS)} against {api}", flush=True)
    print(f"trigger: prefect deployment run '{pipeline.name}/pipeline'", flush=True)
    serve(
        *(flow.to_deployment(name=name) for name, flow in DEPLOYMENTS.items()),
        limit=int(os.environ.get("ROLLWISE_CONCURRENT_RUNS", "1")),
        print_starting_message=False,
    )


if __name__ == "__main__":
    main()
