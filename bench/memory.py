"""Memory across episodes (issue 40), fixed-policy half: success by horizon for none / working
memory / skills / both, with a scripted oracle policy, through the real rollout engine.

Skills are induced (memory/bank.py) from a success bank of oracle trajectories on one half of
each environment's multi-call train tasks; episodes run on the other half (held-aside tasks of
the same environments). The policy is fixed and scripted: it makes its task's oracle calls one
per turn, then answers; with skills exposed, when the skill its oracle abstracts is among them
it calls that skill in one turn instead (the engine expands it into the same real calls).
Horizon = rollout max_turns. Also measured: real tool calls and prompt tokens per episode (the
progress note's cost). The RL half (the same arms after training) needs a policy that learns
to call skills and read the note; not measured: its figures are null.

    .venv/bin/python bench/memory.py [--horizons 1 2 3 4 5] [--out bench/results/memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import ScriptedBackend  # noqa: E402
from bench.provenance import STARTED_AT  # noqa: E402
from rollwise.config import EnvsConfig  # noqa: E402
from rollwise.envs.generate import generate_suite  # noqa: E402
from rollwise.envs.runtime import load_suite  # noqa: E402
from rollwise.memory import bank, wrap  # noqa: E402
from rollwise.memory.skills import SkillConfig, induce  # noqa: E402
from rollwise.policy.chat import action_text  # noqa: E402
from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes  # noqa: E402
from rollwise.train.warmstart import suite_tokenizer  # noqa: E402
from rollwise.types import ToolCall  # noqa: E402

ARMS = {"none": (False, False), "working": (False, True), "skills": (True, False),
        "both": (True, True)}  # fmt: skip
ENVS = EnvsConfig(seed=0, n_envs=4, tasks_per_env=60, owners_per_env=6, max_records=3,
                  heldout_envs=0)  # fmt: skip


def oracle_pairs(suite, task) -> list[tuple[ToolCall, str]]:
    env = clone_env(suite.envs[task.env_id])
    env.reset(task, 0)
    return [(c, env.step(c).content) for c in task.oracle]


def split_tasks(suite) -> tuple[list, list]:
    """(bank tasks, evaluation tasks): alternate multi-call train tasks of each environment."""
    multi = [t for t in suite.split("train") if len(t.oracle) >= 2]
    return multi[0::2], multi[1::2]


def skill_table(suite, tasks) -> pd.DataFrame:
    rows = [bank.row_of(induce(t.env_id, oracle_pairs(suite, t)), "success", t.task_id, 0)
            for t in tasks]  # fmt: skip
    return bank.add(bank.empty(), pd.DataFrame(rows, columns=bank.SKILL_COLUMNS))


def script(suite, task, exposed: list) -> list[str]:
    want = induce(task.env_id, oracle_pairs(suite, task))
    if any(s.skill_id == want.skill_id for s in exposed):
        return [action_text([ToolCall(want.name, want.example)]), action_text(answer=task.answer)]
    return [action_text([c]) for c in task.oracle] + [action_text(answer=task.answer)]


def coverage(suite, tasks, table, cfg) -> float:
    """Share of evaluation tasks whose oracle's skill is exposed to their episodes."""
    hits = [induce(t.env_id, oracle_pairs(suite, t)).skill_id
            in {s.skill_id for s in bank.exposed(table, t.env_id, cfg)} for t in tasks]  # fmt: skip
    return round(sum(hits) / len(hits), 3)


def run_arm(suite, tok, tasks, table, skills: bool, working: bool, horizon: int, cfg) -> dict:
    exposed = {e: bank.exposed(table, e, cfg) if skills else [] for e in suite.envs}
    scripts = {t.prompt: script(suite, t, exposed[t.env_id]) for t in tasks}
    specs = [EpisodeSpec(t.task_id, t, wrap(clone_env(suite.envs[t.env_id]), exposed[t.env_id],
                                            working), t.task_id) for t in tasks]  # fmt: skip
    limits = Limits(max_turns=horizon, max_new_tokens=160, max_context=8192, greedy=True)
    episodes, _ = run_episodes(specs, ScriptedBackend(tok, scripts), tok, limits)
    frame = pd.DataFrame(episodes)
    return {"success": round(100 * float(frame["success"].mean()), 1),
            "tool_calls": round(float(frame["tool_calls"].mean()), 2),
            "prompt_tokens": round(float(frame["prompt_tokens"].mean()), 1)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--horizons", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "memory.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        generate_suite(ENVS, Path(tmp))
        suite = load_suite(Path(tmp))
    tok = suite_tokenizer(suite)
    bank_tasks, tasks = split_tasks(suite)
    cfg = SkillConfig(per_env=8)
    table = skill_table(suite, bank_tasks)
    fixed = {arm: {str(h): run_arm(suite, tok, tasks, table, *flags, h, cfg)
                   for h in args.horizons} for arm, flags in ARMS.items()}  # fmt: skip
    last = str(args.horizons[-1])
    result = {
        "command": "python bench/memory.py " + " ".join(sys.argv[1:]),
        "git_commit": STARTED_AT,
        "policy": "scripted oracle (fixed); trained-policy figures null: no learning substrate",
        "envs": ENVS.model_dump(),
        "bank_tasks": len(bank_tasks),
        "eval_tasks": len(tasks),
        "skills": len(table),
        "skill_coverage": coverage(suite, tasks, table, cfg),
        "fixed_policy": fixed,
        "after_rl": {arm: None for arm in ARMS},
        "skills_minus_none_pts_at_h2": round(
            fixed["skills"]["2"]["success"] - fixed["none"]["2"]["success"], 1
        )
        if "2" in fixed["none"]
        else None,  # fmt: skip
        "working_note_prompt_tokens": round(
            fixed["working"][last]["prompt_tokens"] - fixed["none"][last]["prompt_tokens"], 1
        ),  # fmt: skip
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
