"""Rollout cost: an episode's cost columns priced into one figure (params `rollout.cost`).

cost = prompt_tokens / 1000 * per_1k_prompt_tokens          (the prompt and every observation)
     + generated_tokens / 1000 * per_1k_generated_tokens
     + tool_calls * per_tool_call
     + verifier_calls * per_verifier_call

Prompt tokens are counted once per episode, as a server with a prefix (KV) cache prefills them;
wall seconds are reported beside the cost, not priced (they depend on the machine, not the plan).
"""

from __future__ import annotations

import pandas as pd

PRICED = {  # episode column -> (CostConfig field, units per priced unit)
    "prompt_tokens": ("per_1k_prompt_tokens", 1000.0),
    "generated_tokens": ("per_1k_generated_tokens", 1000.0),
    "tool_calls": ("per_tool_call", 1.0),
    "verifier_calls": ("per_verifier_call", 1.0),
}


def episode_costs(episodes: pd.DataFrame, prices) -> pd.Series:
    """One cost per episode row (`prices`: a CostConfig)."""
    total = pd.Series(0.0, index=episodes.index)
    for column, (field, unit) in PRICED.items():
        total += episodes[column].astype(float) / unit * getattr(prices, field)
    return total
