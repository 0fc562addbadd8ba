"""Learning bench: does RL, run as the pipeline runs it, raise held-out success?

Per seed: the warm start (the pipeline's round_00 for these params: a pretrained model SFT'd
briefly on oracle demos, or the built tiny model; cached), greedy success on the held-out split,
then `--rounds` rounds of rollwise.loop.run_rounds (the stages' own functions; fresh train tasks
from the scheduler every round), held-out success every `--eval-every` rounds. With
`--control`, the oracle-demo control beside it from the same warm start: the same rounds, but
each round's episodes replaced by as many oracle trajectories of train tasks (advantage +1)
through the same trainer (bench/common.py run_oracle_rounds): the supervised signal RL's
episodes are compared against, `rl_vs_oracle_control_ratio`. `--control sft`: instead the warm
start's own SFT continued on as many demos a round (run_sft_control): the update's cost.
`--spread-seeds`: more seeds whose warm start is only built and evaluated
(`warmstart_spread_pts` over all seeds; `--seeds` with no seed: those alone). `--merge A.json
B.json ...`: one file from per-seed files run apart (a seed per process, so two share the cores
and each lands on its own), refused unless they share commit, recipe, overrides and plan: the
merged file keeps that commit and each source's command. `--headroom K`:
the warm start's pass@K at the rollout temperature minus its greedy success on the same tasks,
the most sharpening can add (`warmstart_headroom_pts_median`).

Held-out success is split into the suite's held-out tasks in trained environments and those in
environments no stage trained on (`unseen`). A seed's gain carries a 95% interval over its
paired tasks (each task's final minus start success).

    .venv/bin/python bench/learning.py [--seeds 0 1 2] [--rounds 8] [--eval-every 2] \
        [--eval-tasks 128] [--control [trainer|sft]] [--recipe smollm2|tiny] \
        [--out bench/results/learning.json] [--spread-seeds 3 4] [--headroom 8]
    .venv/bin/python bench/learning.py --merge seed0.json seed1.json seed2.json [--out ...]
        (key=value overrides go first: --seeds and --spread-seeds take lists)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    arm_params,
    bench_params,
    parse_overrides,
    run_oracle_rounds,
    run_sft_control,
    seeded,
    suite_at,
    warm_start_folder,
)
from bench.provenance import STARTED_AT  # noqa: E402
from rollwise import loop  # noqa: E402
from rollwise.evaluate.full import evaluate_policy, evaluation_tasks  # noqa: E402
from rollwise.evaluate.report import paired_difference  # noqa: E402
from rollwise.policy.build import load_policy  # noqa: E402
from rollwise.policy.hf import HFBackend  # noqa: E402

# The recipes this bench knows, as params overrides. smollm2: grown from the measurement of the
# issue (20 AdamW SFT steps at lr 2e-4 on the suite's own demos, then rounds of 16 fresh tasks x
# 4 samples at T 0.7, success reward, one epoch of two minibatches, full fine-tuning); each
# change since carries its reason below. The warm-start keys are spelled out: params.yaml's
# tiny-model choices (Muon at 0.02, weight decay 0.1, four augment suites) would otherwise apply.
# Since 5a4716b its demos are drawn round-robin over task kinds (warmstart.balance_kinds):
# drawn uniformly, 8-20 of each kind, the warm start solved 23-30% of the held-out tasks at
# seeds 0-2; balanced, 31-52% (bench/results/archive/learning_smollm2_balanced_warmstarts.json).
RECIPES = {
    "smollm2": {
        "policy.model": "SmolLM2-135M-Instruct",
        "policy.max_context": 1024,
        "warmstart.finetune_model": True,
        "warmstart.steps": 20,
        # 160 demos in batches of 8: five seeds' warm starts within 14.8 points on 128 tasks
        # (batches of 4: 25.8), and RL from them never fell more than 1.6 points below its start
        # (docs/experiments/2026-12-07-smollm2-warm-starts-of-batch-8-under-rl.md).
        "warmstart.batch_size": 8,
        "warmstart.lr": 2e-4,
        "warmstart.optimizer": "adamw",
        "warmstart.weight_decay": 0.0,
        "warmstart.augment_suites": 0,
        "warmstart.balance_kinds": True,
        "train.warmup_steps": 0,
        "schedule.tasks_per_round": 16,
        "rollout.samples_per_task": 4,
        "rollout.temperature": 0.7,
        "rollout.max_new_tokens": 64,
        "rollout.batch_size": 64,
        "credit.reward": "success",
        # lr 5e-6 from 747f11c (2e-5 + KL 0.04 fell 14 points by round 2 from seed 2's warm
        # start): median +14.1 over seeds 0-2. lr 1e-5 gave seed 0 +20.3 but collapsed seed 1 by
        # 25 points in one round (approx_kl 4.8e-3); the round's trust region (max_kl) caps
        # such a round (docs/experiments/2026-12-06-a-trust-region-for-smollm2-rounds.md).
        "train.lr": 1e-5,
        "train.max_kl": 8e-3,
        "train.epochs": 1,
        "train.minibatches": 2,
        "train.micro_batch": 8,
        "train.lora_above_m": None,
        "evaluate.max_new_tokens": 64,
    },
    "tiny": {},  # params.yaml's own default
}


def unseen_envs(suite) -> set[str]:
    """Environments with no train task: no demo and no rollout ever came from them."""
    cat = suite.catalog
    trained = set(cat.loc[cat["split"] == "train", "env_id"])
    return set(cat["env_id"]) - trained


def heldout_episodes(model, tok, suite, p, n: int) -> pd.DataFrame:
    """Greedy episodes on the first `n` held-out tasks (evaluate/full.py's stable order), every
    column the rollout engine writes."""
    tasks = evaluation_tasks(suite, "heldout", n)
    limits = loop.greedy_limits(p, max_turns=p.evaluate.max_turns,
                                max_new_tokens=p.evaluate.max_new_tokens)  # fmt: skip
    return evaluate_policy(HFBackend(model, tok), tok, suite, tasks, limits)


def heldout(model, tok, suite, p, n: int) -> pd.DataFrame:
    """heldout_episodes' task, environment and success (as a float) only."""
    episodes = heldout_episodes(model, tok, suite, p, n)
    return episodes[["task_id", "env_id", "success"]].assign(success=lambda e: e.success * 1.0)


def headroom(model, tok, suite, p, start: pd.DataFrame, k: int) -> dict:
    """pass@k at the rollout temperature minus greedy success, on the held-out tasks `start`
    ran: the most RL's sharpening can add (docs/experiments/2026-12-05-headroom.md)."""
    from bench.generalization import pass_at_k, sampled

    tasks = [suite.tasks[t] for t in start["task_id"]]
    drawn = pass_at_k(sampled(model, tok, suite, tasks, p, k, p.rollout.temperature))
    return {"k": k, "temperature": p.rollout.temperature, "sampled_success": drawn["success"],
            "pass_at_k": drawn["pass_at_k"],
            "gap_pts": 100 * (drawn["pass_at_k"] - float(start["success"].mean()))}  # fmt: skip


def paired_gain(start: pd.DataFrame, end: pd.DataFrame) -> dict:
    """Gain in points over the tasks both ran, with a 95% normal interval of the paired mean."""
    d = (end.set_index("task_id")["success"] - start.set_index("task_id")["success"]).dropna()
    if d.empty:
        return {"gain_pts": 0.0, "lo": 0.0, "hi": 0.0, "tasks": 0}
    return paired_difference(d)._asdict()


def scores(episodes: pd.DataFrame, unseen: set[str]) -> dict:
    new = episodes["env_id"].isin(unseen)
    return {"success": float(episodes["success"].mean()),
            "unseen_success": float(episodes.loc[new, "success"].mean()) if new.any() else None,
            "seen_success": float(episodes.loc[~new, "success"].mean())}  # fmt: skip


TRUST_KEYS = ("round_kl_full", "round_kl", "trust_scale")


def run_seed(seed: int, p, suite, args, save=None) -> dict:
    """The warm start of `seed`, then its RL rounds, held-out success along the way; `save(run)`
    after every evaluation writes the partial run (a long run stopped early keeps its curve)."""
    t0 = time.perf_counter()
    cfg = arm_params(p, {**seeded(seed), "warmstart.seed": seed, "rounds": args.rounds})
    folder = warm_start_folder(cfg, suite, args.cache)
    warm_s = time.perf_counter() - t0
    model, tok = load_policy(folder)
    unseen = unseen_envs(suite)
    start = heldout(model, tok, suite, cfg, args.eval_tasks)
    curve = [{"round": 0, **scores(start, unseen), "wall_s": time.perf_counter() - t0}]
    room = headroom(model, tok, suite, cfg, start, args.headroom) if args.headroom else None
    rounds: list[dict] = []
    print(json.dumps({"seed": seed, "warm_start": curve[0], "headroom": room,
                      "warm_s": round(warm_s)}), flush=True)  # fmt: skip

    def on_round(r: int, done: loop.Round) -> None:
        m, t = done.rollout.metrics, done.trained.metrics
        rounds.append({"round": r, "sample_success": m["success_rate"],
                       "zero_variance_groups": m["zero_variance_groups"],
                       "episodes_trained": int(t.get("episodes", 0)),
                       "approx_kl": float(t.get("approx_kl", 0.0)),
                       "entropy": float(t.get("entropy", 0.0)),
                       **{k: float(t[k]) for k in TRUST_KEYS if k in t},  # train.max_kl
                       "wall_s": time.perf_counter() - t0})  # fmt: skip
        print(json.dumps({"seed": seed, **rounds[-1]}), flush=True)
        if r % args.eval_every == 0 or r == args.rounds:
            ep = heldout(done.trained.model, tok, suite, cfg, args.eval_tasks)
            curve.append({"round": r, **scores(ep, unseen), "wall_s": time.perf_counter() - t0})
            print(json.dumps({"seed": seed, **curve[-1]}), flush=True)
            curve[-1]["episodes"] = ep
            if save is not None:
                left = r < args.rounds  # the last round's save is whole but for a control
                save({**finished(seed, start, ep, curve, rounds, unseen, warm_s, t0, partial=left),
                      "headroom": room})  # fmt: skip

    loop.run_rounds(cfg, suite, model, tok, args.rounds, on_round=on_round)
    run = finished(seed, start, curve[-1]["episodes"], curve, rounds, unseen, warm_s, t0)
    run["headroom"] = room
    if args.control:
        run["control"] = control_run(seed, cfg, folder, suite, args, start, unseen)
    return run


def control_run(seed: int, cfg, folder: Path, suite, args, start, unseen: set[str]) -> dict:
    """The oracle-demo control from the same warm start: each round as many oracle
    trajectories as RL's round has episodes (tasks x samples), through the same trainer."""
    t0 = time.perf_counter()
    model, tok = load_policy(folder)
    n = cfg.schedule.tasks_per_round * cfg.rollout.samples_per_task
    curve, last = [{"round": 0, **scores(start, unseen)}], start

    def on_round(r: int, model, stats: dict) -> None:
        nonlocal last
        if r % args.eval_every == 0 or r == args.rounds:
            last = heldout(model, tok, suite, cfg, args.eval_tasks)
            curve.append({"round": r, **scores(last, unseen), "wall_s": time.perf_counter() - t0})
            print(json.dumps({"seed": seed, "control": True, **curve[-1]}), flush=True)

    if args.control == "sft":
        run_sft_control(cfg, suite, model, tok, args.rounds, n, lambda r, m: on_round(r, m, {}))
    else:
        run_oracle_rounds(cfg, suite, model, tok, args.rounds, n, on_round)
    new = start["env_id"].isin(unseen)
    return {"kind": args.control, "demos_a_round": n, "heldout": paired_gain(start, last),
            "unseen": paired_gain(start[new], last[last["env_id"].isin(unseen)]),
            "curve": curve, "wall_s": time.perf_counter() - t0}  # fmt: skip


def finished(seed, start, end, curve, rounds, unseen, warm_s, t0, partial=False) -> dict:
    """A seed's figures from its start and latest evaluation (`partial`: rounds remain)."""
    new = start["env_id"].isin(unseen)
    return {"seed": seed, "partial": partial, "warmstart_success": curve[0]["success"],
            "heldout": paired_gain(start, end),
            "unseen": paired_gain(start[new], end[end["env_id"].isin(unseen)]),
            "curve": [{k: v for k, v in c.items() if k != "episodes"} for c in curve],
            "rounds": list(rounds),
            "worst_round_drop_pts": max(0.0, 100 * max(curve[0]["success"] - c["success"]
                                                       for c in curve)),
            "warm_start_s": warm_s, "wall_s": time.perf_counter() - t0}  # fmt: skip


def controls_by_kind(runs: list[dict]) -> dict[str, dict]:
    """Each control kind (--control trainer|sft) against RL on the seeds that ran it: the same
    warm starts, so the ratio compares the two updates and not two lottery tickets. The file's
    `rl_vs_oracle_control_ratio` is the strongest control's (the hardest comparison for RL);
    a control that gained nothing has no ratio (RL's gain over a loss is no multiple)."""
    out = {}
    for kind in sorted({r["control"].get("kind", "trainer") for r in runs if "control" in r}):
        ran = [r for r in runs if "control" in r and r["control"].get("kind", "trainer") == kind]
        rl = float(np.median([r["heldout"]["gain_pts"] for r in ran]))
        control = float(np.median([r["control"]["heldout"]["gain_pts"] for r in ran]))
        out[kind] = {"seeds": [r["seed"] for r in ran], "gain_pts_median": control,
                     "rl_gain_pts_median": rl,
                     "rl_vs_control_ratio": rl / control if control > 0 else None}  # fmt: skip
    return out


def summarize(runs: list[dict], args, overrides: dict, spread: dict | None = None) -> dict:
    med = lambda xs: float(np.median(xs)) if xs else None  # noqa: E731
    by_kind = controls_by_kind(runs)
    strongest = max(by_kind.values(), key=lambda c: c["gain_pts_median"], default=None)
    starts = {**{r["seed"]: r["warmstart_success"] for r in runs}, **(spread or {})}
    return {
        "command": "python bench/learning.py " + " ".join(sys.argv[1:]),
        "git_commit": STARTED_AT,
        "recipe": args.recipe,
        "overrides": overrides,
        "heldout_gain_pts_median": med([r["heldout"]["gain_pts"] for r in runs]),
        "unseen_gain_pts_median": med([r["unseen"]["gain_pts"] for r in runs]),
        "every_seed_interval_excludes_0": bool(runs) and all(r["heldout"]["lo"] > 0 for r in runs),
        "partial": any(r["partial"] for r in runs),
        "worst_round_drop_pts": max((r["worst_round_drop_pts"] for r in runs), default=None),
        "wall_s_per_seed": med([r["wall_s"] for r in runs]),
        "controls": by_kind,
        "control_gain_pts_median": strongest and strongest["gain_pts_median"],
        "rl_vs_oracle_control_ratio": strongest and strongest["rl_vs_control_ratio"],
        "warmstart_headroom_pts_median": med([r["headroom"]["gap_pts"] for r in runs
                                              if r.get("headroom")]),  # --headroom K
        "warmstart_spread_pts": 100 * (max(starts.values()) - min(starts.values())),
        "warmstart_success_by_seed": starts,
        "eval_tasks": args.eval_tasks,
        "rounds": args.rounds,
        "runs": runs,
    }  # fmt: skip


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, run in enumerate(result["runs"]):  # one colour a seed: solid, dashed, dotted
        color, xs = f"C{k % 10}", [c["round"] for c in run["curve"]]
        ax.plot(xs, [100 * c["success"] for c in run["curve"]], marker="o", color=color,
                label=f"seed {run['seed']} held-out")  # fmt: skip
        unseen = [c["unseen_success"] for c in run["curve"]]
        if all(u is not None for u in unseen):
            ax.plot(xs, [100 * u for u in unseen], ls="--", color=color, alpha=0.6,
                    label=f"seed {run['seed']} unseen envs")  # fmt: skip
        if "control" in run:
            cs = run["control"]["curve"]
            ax.plot([c["round"] for c in cs], [100 * c["success"] for c in cs], ls=":",
                    marker="x", color=color, label=f"seed {run['seed']} "
                    f"{run['control'].get('kind', 'trainer')} control")  # fmt: skip
    ax.set_xlabel("RL round")
    ax.set_ylabel("greedy success (%)")
    ax.set_title(f"learning bench ({result['recipe']})")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


MERGE_MUST_AGREE = ("git_commit", "recipe", "overrides", "eval_tasks", "rounds")


def merge(paths: list[Path], out: Path) -> dict:
    """Per-seed results files of one plan as one: the seeds' runs side by side, summarized as if
    one process had run them. Why refuse a mismatch: a median over different code or params is
    no figure of either."""
    parts = []
    for path in paths:
        try:
            parts.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as err:
            raise SystemExit(f"--merge: cannot read {path}: {err}") from err
    for key in MERGE_MUST_AGREE:
        values = {json.dumps(part.get(key), sort_keys=True) for part in parts}
        if len(values) > 1:
            raise SystemExit(f"--merge: the files differ in {key!r}: {sorted(values)}")
    runs = [run for part in parts for run in part["runs"]]
    seeds = [run["seed"] for run in runs]
    if len(set(seeds)) < len(seeds):
        raise SystemExit(f"--merge: a seed appears twice: {sorted(seeds)}")
    first = parts[0]
    args = argparse.Namespace(recipe=first["recipe"], eval_tasks=first["eval_tasks"],
                              rounds=first["rounds"])  # fmt: skip
    spread = {int(k): v for part in parts for k, v in part["warmstart_success_by_seed"].items()}
    result = summarize(sorted(runs, key=lambda r: r["seed"]), args, first["overrides"], spread)
    result["git_commit"] = first["git_commit"]  # the code that ran, not the merge's
    result["seed_commands"] = [part["command"] for part in parts]
    out.parent.mkdir(parents=True, exist_ok=True)
    plot(result, out.with_suffix(".png"))
    result["plot"] = os.path.relpath(out.with_suffix(".png"), ROOT)
    out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*", help="dotted params overrides key=value")
    parser.add_argument("--recipe", choices=list(RECIPES), default="smollm2")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2],
                        help="seeds through RL (none: spread seeds only)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--eval-tasks", type=int, default=128,
                        help="held-out tasks an evaluation; why 128: on 64, five identical warm "
                        "starts spread over more than 15 points 40%% of the time by sampling "
                        "alone (docs/experiments/2026-12-07-stretching-rounds-to-the-trust-"
                        "region.md)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--control", nargs="?", const="trainer", choices=["trainer", "sft"],
                        help="the oracle-demo control too: through RL's trainer (default), or "
                        "the warm start's SFT continued on as many demos")  # fmt: skip
    parser.add_argument(
        "--headroom",
        type=int,
        default=0,
        metavar="K",
        help="also the warm start's pass@K minus greedy on the held-out tasks",
    )
    parser.add_argument("--spread-seeds", type=int, nargs="*", default=[],
                        help="more seeds whose warm start is only evaluated")  # fmt: skip
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise" / "bench" / "learning")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "learning.json")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="FILE",
                        help="per-seed results files of one plan, merged into --out")  # fmt: skip
    args = parser.parse_args()
    if args.merge:
        result = merge(args.merge, args.out)
        print(json.dumps({k: v for k, v in result.items() if k != "runs"}, default=float))
        return
    torch.set_num_threads(args.threads)
    overrides = {**RECIPES[args.recipe], **parse_overrides(args.overrides)}
    p = bench_params(overrides)
    args.cache.mkdir(parents=True, exist_ok=True)
    suite, _ = suite_at(args.cache, p.envs)
    runs: list[dict] = []
    spread: dict[int, float] = {}

    def write(latest: dict | None = None) -> dict:
        result = summarize([*runs, *([latest] if latest else [])], args, overrides, spread)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        plot(result, args.out.with_suffix(".png"))
        result["plot"] = os.path.relpath(args.out.with_suffix(".png"), ROOT)
        args.out.write_text(json.dumps(result, indent=1, default=float) + "\n")
        return result

    for seed in args.seeds:  # each seed's figures are written as they land, rounds too
        runs.append(run_seed(seed, p, suite, args, save=write))
        result = write()
    for seed in (s for s in args.spread_seeds if s not in args.seeds):  # warm starts only
        cfg = arm_params(p, {**seeded(seed), "warmstart.seed": seed})
        model, tok = load_policy(warm_start_folder(cfg, suite, args.cache))
        spread[seed] = float(heldout(model, tok, suite, cfg, args.eval_tasks)["success"].mean())
        print(json.dumps({"seed": seed, "warmstart_success": spread[seed]}), flush=True)
        result = write()
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, default=float))


if __name__ == "__main__":
    main()
