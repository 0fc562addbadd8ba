"""Fuzz the path from model text to tool execution: generated assistant outputs (malformed or
partial JSON, unknown tools, wrong types, nested and huge strings, odd unicode, many calls at
once) go through `parse_action` and then `step` on a synthetic and a BFCL environment, exactly
what the rollout engine does with a turn. A crash is any exception escaping either. Writes
bench/results/fuzz.json with `cases` and `crashes` (target 0), the kinds of observation seen and
the first crashes' inputs.

    .venv/bin/python bench/fuzz.py [--cases 10000] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.provenance import STARTED_AT  # noqa: E402
from rollwise.envs.bfcl import BFCLEnv  # noqa: E402
from rollwise.envs.runtime import load_suite  # noqa: E402
from rollwise.policy.chat import parse_action  # noqa: E402
from rollwise.rollout.engine import clone_env  # noqa: E402
from tests.helpers import make_suite  # noqa: E402

ODD = ["\u0000", "\ud800", "\u202e", "\ufeff", "é", "中", "😀", "\\", '"', "}", "{", "<", ">"]


def junk(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ODD) if rng.random() < 0.3 else chr(rng.randint(32, 0x2FFF))
                   for _ in range(n))  # fmt: skip


def value(rng: random.Random, known: list, depth: int = 0):
    """A JSON-able argument value: real ids and names, wrong types, huge or nested things."""
    pick = rng.randrange(12)
    if pick >= 9 and known:
        return rng.choice(known)
    if pick == 1:
        return rng.choice([10 ** rng.randint(1, 400), -1, 0, 2**63, 1.5, float("inf")])
    if pick == 2:
        return "a" * rng.choice([0, 1, 10_000, 200_000])
    if pick == 3:
        return junk(rng, rng.randint(0, 40))
    if pick == 4 and depth < 3:
        return [value(rng, known, depth + 1) for _ in range(rng.randint(0, 4))]
    if pick == 5 and depth < 3:
        return {junk(rng, 4): value(rng, known, depth + 1) for _ in range(rng.randint(0, 3))}
    return rng.choice([None, True, False, "x' OR '1'='1", "'; DROP TABLE t; --", "?"])


def call_json(rng: random.Random, tools: list, known: list) -> str:
    if rng.random() < 0.7:
        tool = rng.choice(tools)
        keys = list(tool.parameters.get("properties", {})) or ["x"]
    else:
        tool, keys = None, [junk(rng, 6)]
    name = tool.name if tool else rng.choice([junk(rng, 8), "__class__", "_private", "rows"])
    args = {rng.choice(keys): value(rng, known) for _ in range(rng.randint(0, 3))}
    if rng.random() < 0.1:
        args = rng.choice([[1, 2], "not an object", None, 7])
    text = json.dumps({"name": name, "arguments": args}, ensure_ascii=rng.random() < 0.5)
    mangle = rng.randrange(8)
    if mangle == 0:
        return text[: rng.randint(0, len(text))]  # cut mid-way
    if mangle == 1:
        return "[" * rng.choice([10, 1000, 5000]) + text  # deep nesting
    if mangle == 2:
        return text.replace('"', "'")  # not JSON
    return text


def assistant_text(rng: random.Random, tools: list, known: list) -> str:
    """One assistant turn: prose, any number of tool calls, broken tags."""
    parts = [junk(rng, rng.randint(0, 20))]
    for _ in range(rng.choice([0, 1, 1, 1, 1, 2, 3, 8, 50])):
        body = call_json(rng, tools, known)
        opener = "<tool_call>" if rng.random() > 0.05 else rng.choice(["<tool_call", ""])
        closer = "</tool_call>" if rng.random() > 0.05 else rng.choice(["", "</tool_call"])
        parts.append(f"{opener}{body}{closer}")
    if rng.random() < 0.1:
        parts.append("<|im_end|>" + junk(rng, 5))
    return "\n".join(parts)


def fuzz(cases: int, seed: int) -> dict:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        make_suite(Path(tmp))
        suite = load_suite(Path(tmp))
    synthetic = [(clone_env(suite.envs[t.env_id]), t) for t in list(suite.tasks.values())[:6]]
    bfcl = BFCLEnv(["base"], ids=["multi_turn_base_0", "multi_turn_base_15"])
    targets = synthetic + [(bfcl, t) for t in bfcl.tasks()]
    counts: collections.Counter = collections.Counter()
    crashes: list[dict] = []
    for case in range(cases):
        env, task = targets[case % len(targets)]
        env.reset(task, seed=case)
        tools = env.tools()
        known = [k for _, k in env.rows()] if hasattr(env, "rows") else [1, "alice", "/"]
        text = assistant_text(rng, tools, known)
        try:
            action = parse_action(text)
            counts[
                "parse:" + ("error" if action.error else "calls" if action.calls else "answer")
            ] += 1
            for call in action.calls or []:
                counts["obs:" + env.step(call).kind] += 1
        except Exception as e:  # the one thing this bench exists to count
            error = "".join(traceback.format_exception_only(e)).strip()
            crashes.append({"case": case, "env": task.env_id, "text": text[:2000], "error": error})
    return {"counts": dict(counts), "crashes": crashes}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fuzz.json")
    args = parser.parse_args()
    t0 = time.perf_counter()
    found = fuzz(args.cases, args.seed)
    result = {
        "command": "python bench/fuzz.py " + " ".join(sys.argv[1:]),
        "git_commit": STARTED_AT,
        "cases": args.cases,
        "crashes": len(found["crashes"]),
        "target": {"crashes": 0},
        "wall_s": time.perf_counter() - t0,
        "outcomes": found["counts"],
        "first_crashes": found["crashes"][:10],
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("cases", "crashes", "wall_s", "outcomes")}))


if __name__ == "__main__":
    main()
