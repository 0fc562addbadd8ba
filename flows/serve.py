"""`python -m flows.serve` (make ui): serve the `pipeline` deployment until Ctrl-C.

Run it from the project root with PREFECT_API_URL pointing at the Prefect server; runs triggered
from the UI ("Run" on rollwise-pipeline/pipeline, with overrides) then execute here, one at a
time (the stages share the machine's cores). PREFECT_RUNNER_POLL_FREQUENCY sets how often
(seconds, default 10) this process asks the server for new runs.
"""

from __future__ import annotations

import os

from flows.pipeline import pipeline

DEPLOYMENT = "pipeline"


def main() -> None:
    api = os.environ.get("PREFECT_API_URL") or "(PREFECT_API_URL unset: Prefect's own default)"
    print(f"serving deployment {pipeline.name}/{DEPLOYMENT} against {api}", flush=True)
    print(f"trigger: prefect deployment run '{pipeline.name}/{DEPLOYMENT}'", flush=True)
    pipeline.serve(
        name=DEPLOYMENT,
        description="The whole rollwise pipeline with params overrides, in its own work folder.",
        limit=1,
        print_starting_message=False,
    )


if __name__ == "__main__":
    main()
