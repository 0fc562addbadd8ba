"""The base of every params section: frozen, and unknown keys fail by name."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


SEED = "Seed of this section's randomness; in params.yaml, absent or null: the top-level `seed`."
