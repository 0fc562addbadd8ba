"""SMITH's tool pool: the tools use tasks call, admitted only on evidence, versioned per round.

A submitted tool (a build episode's schema and code) joins the pool only when its schema is
valid and its code, run in the sandbox, matches the family's reference on `checks` fresh inputs
that no prompt showed, among them one that the sibling family's rule gets wrong; the evidence is
kept with it. Use tasks call a family's newest admitted version (envs/toolsmith.py); the
reference tools stand in where nothing was admitted. One JSON file per round
(`pool_round_NN.json`): what the policy had built by then, as data a later round or another
machine reads back. In the pipeline the curate stage harvests each round into
`data/curated/round_NN/tool_pool.json` (POOL_FILE, a DVC output) and the next rollout calls it
(rollwise.loop: `RoundState.tools`).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from rollwise.envs.toolsmith import AXES, FAMILIES, run_cases, same, schema_errors, telling_cases

POOL_FILE = "tool_pool.json"


@dataclass(frozen=True)
class PooledTool:
    name: str
    schema: dict
    code: str
    origin: str  # "reference", or where it was built: "round 3 episode <id>"
    checks: int  # fresh inputs it matched the reference on


@dataclass
class ToolPool:
    tools: list[PooledTool] = field(default_factory=list)
    submitted: int = 0  # every submission seen, admitted or not (the verified share's base)

    def code(self, name: str) -> str | None:
        """The newest admitted version of `name`'s code (None: nothing admitted)."""
        versions = [t for t in self.tools if t.name == name]
        return versions[-1].code if versions else None

    def admit(
        self, name: str, schema: object, code: str, origin: str, checks: int = 8
    ) -> str | None:
        """Admit the tool as family `name`'s (its key: a sibling pair shares the tool name) if it
        earns it; None when admitted, else why not."""
        self.submitted += 1
        family = FAMILIES.get(name)
        if family is None:
            return f"no family {name!r}"
        rng = random.Random(f"pool/{name}/{origin}")
        cases = telling_cases(family, rng, checks, checks)  # a sibling's rule fails them
        errors = schema_errors(schema, family.name, cases[0])
        if errors:
            return "; ".join(errors)
        values, error = run_cases(code, family.name, cases)
        wrong = sum(not same(v, family.fn(**c)) for v, c in zip(values, cases, strict=True))
        if wrong:
            return error or f"{wrong} of {checks} fresh inputs wrong"
        self.tools.append(PooledTool(name, schema, code, origin, checks))
        return None

    def built(self) -> list[PooledTool]:
        return [t for t in self.tools if t.origin != "reference"]

    def verified_share(self) -> float | None:
        """Admitted policy-built tools over submissions (None before any submission)."""
        return len(self.built()) / self.submitted if self.submitted else None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"submitted": self.submitted, "tools": [asdict(t) for t in self.tools]}
        path.write_text(json.dumps(body, indent=1) + "\n")

    def copy(self) -> ToolPool:
        """A new version to extend: a round's harvest never edits the pool it continues from."""
        return ToolPool(list(self.tools), self.submitted)

    @classmethod
    def load(cls, path: Path) -> ToolPool:
        try:
            body = json.loads(Path(path).read_text())
            return cls([PooledTool(**t) for t in body["tools"]], int(body["submitted"]))
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{path}: not a tool pool ({type(err).__name__}: {err})") from err


def harvest(pool: ToolPool, episodes: pd.DataFrame, steps: pd.DataFrame, r: int) -> dict:
    """Offer the pool each successful build episode's last define_tool submission of round r;
    returns the round's counts (submitted, admitted)."""
    builds = episodes[episodes["task_id"].str.contains("-build-") & episodes["success"]]
    offered = admitted = 0
    for episode_id, task_id in zip(builds["episode_id"], builds["task_id"], strict=True):
        mine = steps[(steps["episode_id"] == episode_id) & (steps["tool"] == "define_tool")]
        if mine.empty:
            continue
        arguments = mine["arguments"].iloc[-1]
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
        name = task_id.split("-build-")[0]
        offered += 1
        why = pool.admit(
            name, args.get("schema"), str(args.get("code", "")), f"round {r} episode {episode_id}"
        )
        admitted += why is None
    return {"submitted": offered, "admitted": admitted}


def build_axes(episodes: pd.DataFrame) -> dict[str, float]:
    """SMITH's three axes (schema valid, examples pass, answer correct), each a mean over the
    round's build episodes, apart so each shows its own failures ({} without builds)."""
    builds = episodes[episodes["task_id"].str.contains("-build-")]
    if builds.empty:
        return {}
    rubrics = [json.loads(r) if isinstance(r, str) else r for r in builds["rubric"]]
    scores = [r.get("scores", r) for r in rubrics]
    return {a: float(sum(s.get(a, 0.0) for s in scores) / len(scores)) for a in AXES}


def harvest_round(
    pool: ToolPool | None, episodes: pd.DataFrame, steps: pd.DataFrame, r: int
) -> tuple[ToolPool, dict]:
    """Round r's pool version (the previous one extended by its admitted builds; None: an empty
    start) and the round's tool metrics: the axes, submissions, admissions, pool size."""
    pool = ToolPool() if pool is None else pool.copy()
    counts = harvest(pool, episodes, steps, r)
    share = pool.verified_share()
    metrics = {**build_axes(episodes), "tools_submitted": counts["submitted"],
               "tools_admitted": counts["admitted"], "tools_built": len(pool.built()),
               **({} if share is None else {"tools_verified_share": share})}  # fmt: skip
    return pool, metrics
