"""Tool-use environments: synthetic suites over SQLite state, their runtime and verifiers."""
