"""ProgAgent, first part: scripted oracle policies calling tools directly and through code
actions, on the same tasks at four state sizes (envs/scale.py), under `policy.max_context`.

Both policies know each task's oracle (the calls, their arguments, the answer); they differ only
in what enters the context. Direct: one <tool_call> turn per oracle call, every result appended
as an observation. Code: one ```python turn making all the calls in the sandbox, results kept in
variables, only the last call's value shown (rollout/code.py `oracle_code`), then the answer.
Per mode and scale: success under policy.max_context, and the context tokens an episode needs
(the same episodes with unbounded context). Turns may be up to 256 tokens (the code turn's
length; rollout.max_new_tokens is 48 by default). Token counts are the word-level tokenizer's
of the tiny policy (policy/build.py), fit on the base suite; ids past 999 count as one token.

Second part (`--trained`): policies trained on direct-mode and on code-mode demos (the recipe's
warm start with `rollout.action_mode` direct or code: train/sft.py demonstrates in the rollout's
mode), then `--rounds` RL rounds in that mode (0: the warm starts only), each evaluated greedily
on the same held-out tasks at every scale under both interfaces (`evaluate.action_mode`).
`code_minus_direct_pts_at_largest_scale`: the code-trained policy in code minus the
direct-trained policy in direct at the largest scale, median over seeds (target >= +20).
Without `--trained` it is null.

    .venv/bin/python bench/progagent.py [--out bench/results/progagent.json]
    .venv/bin/python bench/progagent.py --trained [key=value ...] [--recipe smollm2|tiny] \
        [--seeds 0] [--rounds 0] [--eval-tasks 48] [--threads 1] [--cache DIR]
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
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    ScriptedBackend,
    arm_params,
    bench_params,
    key_of,
    parse_overrides,
    seeded,
    suite_at,
    warm_start_folder,
)
from bench.provenance import STARTED_AT  # noqa: E402
from rollwise.config import EnvsConfig, PolicyConfig  # noqa: E402
from rollwise.envs.generate import generate_suite  # noqa: E402
from rollwise.envs.runtime import load_suite  # noqa: E402
from rollwise.envs.scale import scale_suite  # noqa: E402
from rollwise.policy.build import train_tokenizer  # noqa: E402
from rollwise.policy.chat import action_text, code_action_text, code_messages  # noqa: E402
from rollwise.rollout.code import oracle_code  # noqa: E402
from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes  # noqa: E402

SCALES = (8, 64, 512, 4096)
MODES = ("direct", "code")
KINDS = ["city_by_name", "status", "amount", "cancel"]
ENVS = EnvsConfig(seed=0, n_envs=3, tasks_per_env=10, owners_per_env=4, max_records=2,
                  heldout_envs=0, task_kinds=KINDS)  # fmt: skip
MAX_CONTEXT = PolicyConfig().max_context  # params policy.max_context's default
UNBOUNDED = 10**8


def oracle_turns(task, mode: str) -> list[str]:
    if mode == "code":
        return [code_action_text(oracle_code(list(task.oracle))), task.answer + "<|im_end|>"]
    return [action_text([c]) for c in task.oracle] + [action_text(answer=task.answer)]


def tokenizer_for(suite):
    """Word-level vocabulary over both modes' rendered prompts, turns and observations."""
    scratch, corpus = train_tokenizer([]), []
    for task in suite.tasks.values():
        env = clone_env(suite.envs[task.env_id])
        opening = env.reset(task, 0)
        for messages, tools in ((opening, env.tools()), (code_messages(opening, env.tools()), [])):
            corpus.append(scratch.apply_chat_template(
                messages, tools=[t.to_openai() for t in tools], tokenize=False,
                add_generation_prompt=True))  # fmt: skip
        corpus += [*oracle_turns(task, "direct"), *oracle_turns(task, "code")]
        corpus += [env.step(c).content for c in task.oracle]
    return train_tokenizer(corpus)


def run_mode(suite, tok, mode: str, max_context: int) -> list[dict]:
    tasks = sorted(suite.tasks.values(), key=lambda t: t.task_id)
    scripts = {t.prompt: oracle_turns(t, mode) for t in tasks}
    specs = [EpisodeSpec(t.task_id, t, clone_env(suite.envs[t.env_id])) for t in tasks]
    limits = Limits(max_turns=8, max_new_tokens=256, max_context=max_context, greedy=True,
                    action_mode=mode)  # fmt: skip
    backend = ScriptedBackend(tok, scripts, cut_is_stop=True)
    episodes, _ = run_episodes(specs, backend, tok, limits)
    return episodes


def figures(bounded: list[dict], unbounded: list[dict]) -> dict:
    n = len(bounded)
    terminations: dict[str, int] = {}
    for ep in bounded:
        terminations[ep["termination"]] = terminations.get(ep["termination"], 0) + 1
    return {
        "success": sum(ep["success"] for ep in bounded) / n,
        "success_unbounded_context": sum(ep["success"] for ep in unbounded) / n,
        "context_tokens_mean": sum(len(ep["token_ids"]) for ep in unbounded) / n,
        "context_tokens_max": max(len(ep["token_ids"]) for ep in unbounded),
        "terminations": terminations,
        "episodes": n,
    }


def scaled_suites(cache: Path, envs, folder: Path) -> dict:
    """The generated suite at every scale (envs/scale.py), built once under `cache`."""
    from rollwise.artifacts import atomic_dir

    out = {}
    for n in SCALES:
        target = cache / f"scaled_{key_of(envs.model_dump(), n)}"
        if not target.exists():
            with atomic_dir(target, keep_existing=True) as tmp:
                scale_suite(folder, tmp, n)
        out[n] = load_suite(target)
    return out


def cell(episodes) -> dict:
    """Success, context tokens and how episodes ended, of one (policy, interface, scale)."""
    ends = episodes["termination"].value_counts().to_dict()
    return {"success": float(episodes["success"].mean()),
            "context_tokens_mean": float(episodes["token_ids"].map(len).mean()),
            "terminations": {k: int(v) for k, v in ends.items()},
            "episodes": len(episodes)}  # fmt: skip


def trained(args) -> dict:
    """Part two: a direct-trained and a code-trained policy per seed, every scale, both
    interfaces. Cells keyed `<interface>@<scale>`, under `sft` (the warm start) and, with
    --rounds, `rl` (after the rounds in the policy's own mode)."""
    import torch

    from bench.learning import RECIPES, heldout_episodes
    from rollwise import loop
    from rollwise.policy.build import load_policy

    torch.set_num_threads(args.threads)
    p = bench_params({**RECIPES[args.recipe], **parse_overrides(args.overrides)})
    suite, folder = suite_at(args.cache, p.envs)
    scaled = scaled_suites(args.cache, p.envs, folder)
    runs = []
    for seed in args.seeds:
        for mode in MODES:
            pm = arm_params(p, {**seeded(seed), "warmstart.seed": seed, "rollout.action_mode": mode,
                                "rounds": max(args.rounds, 1)})  # fmt: skip
            model, tok = load_policy(warm_start_folder(pm, suite, args.cache))
            run = {"seed": seed, "trained": mode}
            stages = [("sft", None)] + ([("rl", args.rounds)] if args.rounds else [])
            for stage, rounds in stages:
                if rounds:
                    model, _ = loop.run_rounds(pm, suite, model, tok, rounds)
                run[stage] = {}
                for interface in MODES:
                    pi = arm_params(pm, {"evaluate.action_mode": interface})
                    for n in SCALES:
                        episodes = heldout_episodes(model, tok, scaled[n], pi, args.eval_tasks)
                        figures = run[stage][f"{interface}@{n}"] = cell(episodes)
                        print(json.dumps({"seed": seed, "trained": mode, "stage": stage,
                                          "interface": interface, "scale": n, **figures}),
                              flush=True)  # fmt: skip
            runs.append(run)
    top, last = SCALES[-1], "rl" if args.rounds else "sft"
    own = {(r["seed"], r["trained"]): r[last][f"{r['trained']}@{top}"]["success"] for r in runs}
    diffs = [100 * (own[(s, "code")] - own[(s, "direct")]) for s in args.seeds]
    return {"trained_recipe": args.recipe, "trained_overrides": parse_overrides(args.overrides),
            "trained_rounds": args.rounds, "trained_eval_tasks": args.eval_tasks,
            "trained_max_context": p.policy.max_context,
            "code_minus_direct_pts_at_largest_scale": float(sorted(diffs)[len(diffs) // 2]),
            "code_minus_direct_pts_by_seed": diffs, "trained_runs": runs}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("overrides", nargs="*", help="--trained: dotted params overrides")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/progagent.json")
    parser.add_argument("--trained", action="store_true", help="part two: trained policies")
    parser.add_argument("--recipe", default="smollm2", help="bench/learning.py's RECIPES")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rounds", type=int, default=0, help="RL rounds in each mode")
    parser.add_argument("--eval-tasks", type=int, default=48, help="held-out tasks a cell")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise/bench/progagent")
    args = parser.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="progagent-") as tmp:
        generate_suite(ENVS, Path(tmp) / "base")
        suites = {n: Path(tmp) / f"s{n}" for n in SCALES}
        for n, folder in suites.items():
            scale_suite(Path(tmp) / "base", folder, n)
        tok = tokenizer_for(load_suite(suites[SCALES[0]]))
        table = {}
        for mode in MODES:
            for n in SCALES:
                suite = load_suite(suites[n])
                bounded = run_mode(suite, tok, mode, MAX_CONTEXT)
                table[f"{mode}@{n}"] = figures(bounded, run_mode(suite, tok, mode, UNBOUNDED))
                print(mode, n, table[f"{mode}@{n}"], flush=True)
    top = SCALES[-1]
    breaks = [n for n in SCALES if table[f"direct@{n}"]["success"] < 1.0]
    result = {
        "command": "python bench/progagent.py " + " ".join(sys.argv[1:]),
        "git_commit": STARTED_AT,
        "scales_records_per_table": list(SCALES),
        "max_context": MAX_CONTEXT,
        "scripted_success": {
            m: {str(n): table[f"{m}@{n}"]["success"] for n in SCALES} for m in MODES
        },  # fmt: skip
        "context_tokens_ratio_at_largest_scale": round(
            table[f"direct@{top}"]["context_tokens_mean"]
            / table[f"code@{top}"]["context_tokens_mean"],
            2,
        ),
        "direct_breaks_at_scale": breaks[0] if breaks else None,
        "code_minus_direct_pts_at_largest_scale": None,
        "code_minus_direct_pts_note": "null: run with --trained",
        "per_mode_and_scale": table,
    }
    if args.trained:
        result |= trained(args)
        del result["code_minus_direct_pts_note"]
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    hidden = ("per_mode_and_scale", "trained_runs")
    print(json.dumps({k: v for k, v in result.items() if k not in hidden}, indent=1))


if __name__ == "__main__":
    main()
