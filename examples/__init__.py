"""Worked examples (importable from the repo root: `examples.notes_env:make_env`)."""
