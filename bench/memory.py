"""Memory across episodes (issue 40), fixed-policy half: success by horizon for none / working
memory / skills / both, with a scripted oracle policy, through the real rollout engine.

Skills are induced (memory/bank.py) from a success bank of oracle trajectories on one half of
each environment's multi-call train tasks; episodes run on the other half (held-aside tasks of
the same environments). The policy is fixed and scripted: it makes its task's oracle calls one
per turn, then answers; with skills exposed, when the skill its oracle abstracts is among them
it calls that skill in one turn instead (the engine expands it into the same real calls).
Horizon = rollout max_turns. Also measured: real tool calls and prompt tokens per episode (the
progress note's cost).

RL half (`--rl`): from one warm start per seed (bench/learning.py's recipe), `--rounds` rounds
in each arm at equal rollouts, the arm's memory on in the round (rollout.memory: none, working,
skills managed, both, append, the never-pruned bank, and meta, the managed bank with the
meta-agent gating its updates each round); then greedy held-out success by
horizon (the oracle's call count), each arm with its own memory and bank, and the share of those
episodes whose policy called a skill. Per round: the bank's size, churn, skill calls and their
success share. `warmstart.skill_demos=S` gives every arm a warm start whose demos call skills.
`memory_minus_none_pts_longest`: the best memory arm minus none on the longest tasks (target
>= +10); `skillforge_minus_append_only_pts`: skills minus append over all held-out tasks.
Without `--rl` they are null.

    .venv/bin/python bench/memory.py [--horizons 1 2 3 4 5] [--out bench/results/memory.json]
    .venv/bin/python bench/memory.py --rl [key=value ...] [--recipe smollm2|tiny] [--seeds 0] \
        [--rounds 4] [--eval-tasks 64] [--arms none working skills both append meta] [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
from rollwise.evaluate.full import evaluate_policy  # noqa: E402
from rollwise.memory import bank, wrap  # noqa: E402
from rollwise.memory.skills import SKILL_PREFIX, SkillConfig  # noqa: E402
from rollwise.policy.chat import action_text  # noqa: E402
from rollwise.rollout.engine import Limits  # noqa: E402
from rollwise.train.sft import oracle_skill  # noqa: E402
from rollwise.train.warmstart import suite_tokenizer  # noqa: E402
from rollwise.types import ToolCall  # noqa: E402

ARMS = {"none": (False, False), "working": (False, True), "skills": (True, False),
        "both": (True, True)}  # fmt: skip
# The RL arms as rollout.memory settings; append: SkillForge's comparison; meta: the managed bank
# with the meta-agent's validation-gated updates in every round (8 held-aside tasks a gate).
RL_ARMS = {
    "none": {"skills": "none", "working": False},
    "working": {"skills": "none", "working": True},
    "skills": {"skills": "managed", "working": False},
    "both": {"skills": "managed", "working": True},
    "append": {"skills": "append", "working": False},
    "meta": {"skills": "managed", "working": False, "meta_tasks": 8},
}
ENVS = EnvsConfig(seed=0, n_envs=4, tasks_per_env=60, owners_per_env=6, max_records=3,
                  heldout_envs=0)  # fmt: skip


def own_skill(suite, task):
    return oracle_skill(task, suite.envs[task.env_id])


def split_tasks(suite) -> tuple[list, list]:
    """(bank tasks, evaluation tasks): alternate multi-call train tasks of each environment."""
    multi = [t for t in suite.split("train") if len(t.oracle) >= 2]
    return multi[0::2], multi[1::2]


def skill_table(suite, tasks) -> pd.DataFrame:
    rows = [bank.row_of(own_skill(suite, t), "success", t.task_id, 0)
            for t in tasks]  # fmt: skip
    return bank.add(bank.empty(), pd.DataFrame(rows, columns=bank.SKILL_COLUMNS))


def script(suite, task, exposed: list) -> list[str]:
    want = own_skill(suite, task)
    if any(s.skill_id == want.skill_id for s in exposed):
        return [action_text([ToolCall(want.name, want.example)]), action_text(answer=task.answer)]
    return [action_text([c]) for c in task.oracle] + [action_text(answer=task.answer)]


def coverage(suite, tasks, table, cfg) -> float:
    """Share of evaluation tasks whose oracle's skill is exposed to their episodes."""
    hits = [own_skill(suite, t).skill_id
            in {s.skill_id for s in bank.exposed(table, t.env_id, cfg)} for t in tasks]  # fmt: skip
    return round(sum(hits) / len(hits), 3)


def run_arm(suite, tok, tasks, table, skills: bool, working: bool, horizon: int, cfg) -> dict:
    exposed = {e: bank.exposed(table, e, cfg) if skills else [] for e in suite.envs}
    scripts = {t.prompt: script(suite, t, exposed[t.env_id]) for t in tasks}
    limits = Limits(max_turns=horizon, max_new_tokens=160, max_context=8192, greedy=True)
    frame = evaluate_policy(ScriptedBackend(tok, scripts), tok, suite, tasks, limits,
                            lambda env, env_id: wrap(env, exposed[env_id], working))  # fmt: skip
    return {"success": round(100 * float(frame["success"].mean()), 1),
            "tool_calls": round(float(frame["tool_calls"].mean()), 2),
            "prompt_tokens": round(float(frame["prompt_tokens"].mean()), 1)}  # fmt: skip


def by_horizon(episodes: pd.DataFrame, suite) -> dict[str, float]:
    """Success (points) by the oracle's number of calls, 4+ together."""
    calls = episodes["task_id"].map(lambda t: min(len(suite.tasks[t].oracle), 4))
    return {(f"{h}+" if h == 4 else str(h)): round(100 * float(g.mean()), 1)
            for h, g in episodes["success"].groupby(calls)}  # fmt: skip


def after_rl(args) -> dict:
    """The RL half: every arm from the seed's warm start, its memory on in the rounds and in
    the evaluation."""
    import torch

    from bench.common import (
        arm_params,
        bench_params,
        parse_overrides,
        seeded,
        suite_at,
        warm_start_folder,
    )
    from bench.learning import RECIPES
    from rollwise.evaluate.full import evaluation_tasks

    torch.set_num_threads(args.threads)
    p = bench_params({**RECIPES[args.recipe], **parse_overrides(args.overrides)})
    suite, _ = suite_at(args.cache, p.envs)
    tasks = evaluation_tasks(suite, "heldout", args.eval_tasks)
    runs = []
    for seed in args.seeds:
        base = arm_params(p, {**seeded(seed), "warmstart.seed": seed, "rounds": args.rounds})
        folder = warm_start_folder(base, suite, args.cache)
        for arm in args.arms:
            memory = {f"rollout.memory.{k}": v for k, v in RL_ARMS[arm].items()}
            cfg = arm_params(base, memory)
            runs.append(
                {"seed": seed, "arm": arm, **rl_arm(cfg, folder, suite, tasks, args.rounds)}
            )
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "rounds"}), flush=True)
    return summary(runs)


def rl_arm(cfg, folder: Path, suite, tasks: list, n_rounds: int) -> dict:
    """One arm: `n_rounds` rounds from the warm start in `folder`, then greedy success on
    `tasks` with the arm's memory and its final bank."""
    from rollwise import loop
    from rollwise.evaluate.full import evaluate_policy
    from rollwise.policy.build import load_policy
    from rollwise.policy.hf import HFBackend

    model, tok = load_policy(folder)
    rounds: list[dict] = []

    def on_round(r: int, done: loop.Round) -> None:
        m, sampled = done.curated.metrics, done.rollout.metrics["success_rate"]
        memory = {k: v for k, v in m.items() if k.startswith(("skill", "meta_"))}
        rounds.append({"round": r, "sample_success": sampled, **memory})
        print(json.dumps(rounds[-1]), flush=True)

    model, state = loop.run_rounds(cfg, suite, model, tok, n_rounds, on_round=on_round)
    limits = loop.greedy_limits(cfg, max_turns=cfg.evaluate.max_turns,
                                max_new_tokens=cfg.evaluate.max_new_tokens)  # fmt: skip
    episodes = evaluate_policy(HFBackend(model, tok), tok, suite, tasks, limits,
                               loop.remembering(cfg, state.skills))  # fmt: skip
    return {"success": round(100 * float(episodes["success"].mean()), 1),
            "by_horizon": by_horizon(episodes, suite),
            "skills_offered": int((state.skills["status"] != "retired").sum()),
            "skill_call_share": skill_call_share(episodes, tok),
            "rounds": rounds}  # fmt: skip


def skill_call_share(episodes: pd.DataFrame, tok) -> float:
    """Share of episodes in which the policy's own tokens call a skill (a run_* tool)."""
    called = re.compile(rf'"name"\s*:\s*"{SKILL_PREFIX}')
    pairs = zip(episodes["token_ids"], episodes["loss_mask"], strict=True)
    own = [tok.decode([i for i, m in zip(ids, mask, strict=True) if m]) for ids, mask in pairs]
    return round(sum(bool(called.search(t)) for t in own) / max(len(own), 1), 3)


def summary(runs: list[dict]) -> dict:
    """Medians over seeds of each arm's figures and the two targets' differences."""
    import numpy as np

    def median(arm: str, get) -> float | None:
        values = [get(r) for r in runs if r["arm"] == arm and get(r) is not None]
        return float(np.median(values)) if values else None

    longest = max(h for r in runs for h in r["by_horizon"])
    best = max((a for a in RL_ARMS if a != "none"),
               key=lambda a: median(a, lambda r: r["by_horizon"].get(longest)) or 0.0)  # fmt: skip
    none_longest = median("none", lambda r: r["by_horizon"].get(longest))
    best_longest = median(best, lambda r: r["by_horizon"].get(longest))
    skills, append = (
        median("skills", lambda r: r["success"]),
        median("append", lambda r: r["success"]),
    )
    return {
        "after_rl": {a: median(a, lambda r: r["success"]) for a in RL_ARMS},
        "longest_horizon": longest,
        "memory_arm_longest": best,
        "memory_minus_none_pts_longest": None if none_longest is None or best_longest is None
        else round(best_longest - none_longest, 1),
        "skillforge_minus_append_only_pts": None if skills is None or append is None
        else round(skills - append, 1),
        "rl_runs": runs,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="--rl: dotted params overrides")
    ap.add_argument("--horizons", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "memory.json")
    ap.add_argument("--rl", action="store_true", help="the RL half: arms trained with memory")
    ap.add_argument("--recipe", default="smollm2", help="bench/learning.py's RECIPES")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--arms", nargs="+", choices=list(RL_ARMS), default=list(RL_ARMS),
                    help="--rl: the arms to train (each a run of --rounds)")  # fmt: skip
    ap.add_argument("--eval-tasks", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache", type=Path, default=ROOT / ".rollwise" / "bench" / "memory")
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
        "policy": "scripted oracle (fixed); --rl: the recipe's policy trained in each arm",
        "envs": ENVS.model_dump(),
        "bank_tasks": len(bank_tasks),
        "eval_tasks": len(tasks),
        "skills": len(table),
        "skill_coverage": coverage(suite, tasks, table, cfg),
        "fixed_policy": fixed,
        "after_rl": {arm: None for arm in RL_ARMS},
        "memory_minus_none_pts_longest": None,
        "skillforge_minus_append_only_pts": None,
        "skills_minus_none_pts_at_h2": round(
            fixed["skills"]["2"]["success"] - fixed["none"]["2"]["success"], 1
        )
        if "2" in fixed["none"]
        else None,  # fmt: skip
        "working_note_prompt_tokens": round(
            fixed["working"][last]["prompt_tokens"] - fixed["none"][last]["prompt_tokens"], 1
        ),  # fmt: skip
    }
    if args.rl:
        result |= after_rl(args)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
