"""One module per pipeline stage: `run(...)` does the stage, `main()` is its `dvc repro` entry."""
