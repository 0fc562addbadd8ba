"""Bounded run of bench/fuzz.py's generator: model text -> parse_action -> env.step on the
synthetic and BFCL environments never raises (the full 10,000-case run is the benchmark)."""

from __future__ import annotations

from bench.fuzz import fuzz


def test_fuzzed_assistant_text_never_escapes_as_an_exception():
    found = fuzz(cases=600, seed=1)
    assert found["crashes"] == [], found["crashes"][:3]
    counts = found["counts"]
    # The generator reached every branch it exists for: broken turns, clean calls, prose
    # answers, and calls that executed as well as calls refused.
    for outcome in ("parse:error", "parse:calls", "parse:answer", "obs:ok", "obs:tool_error"):
        assert counts.get(outcome, 0) > 0, (outcome, counts)
