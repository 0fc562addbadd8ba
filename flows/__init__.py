"""Entry points: `run` (make run: dvc repro + summary), `pipeline` (the Prefect flow), `serve`."""
