"""Credit bench: how well each estimator's per-turn credit tracks true action values, and what
it does to held-out success at an equal rollout budget.

One process, no orchestration, one torch thread. Three panels:
  value (LLM)   the warm-start policy on the synthetic suite's longest tasks (3 dependent calls
                and the answer: the suite has no longer ones). A batch of G samples per task; for
                every turn a Monte-Carlo reference Q (`--mc` continuations from that exact
                prefix, the environment replayed to it; a last turn's Q is its reward, exactly);
                per method: credit/diagnostics.py value_report (value error, Kendall tau,
                advantage variance, same-action spread).
  value (toy)   the same report against the exact Q of credit/diagnostics.py ToyChain (4-6
                dependent calls), over `--toy-seeds` batches.
  learning      per arm and seed, `--rounds` rounds of rollout -> credit -> PPO from the warm
                start, then greedy held-out success on the long held-out tasks (with
                --unseen-suite also on the ~500 long tasks of the warm start's validation
                suite, whose environments no stage trained on). Every arm gets
                tasks x G episodes a round: spo and spo_pp get tasks x G tasks of one sample
                (single stream), their tracker carried across rounds as the pipeline does.
                The toy chain runs the same comparison with a tabular softmax policy (token-mean
                policy gradient), its success computed exactly.
Writes bench/results/credit.json (+ .png). The warm start (the pipeline's round_00 for these
params: rollwise.train.warmstart.sft_warm_start) is cached under `--cache`.

    .venv/bin/python bench/credit.py warmstart.steps=800 [--seeds 0 1 2] [--rounds 2] [--tasks 8] \
        [--mc 12] [--value-tasks 12] [--eval-tasks 64] [--toy-seeds 5] [--arms grpo gigpo ...] \
        [--unseen-suite] [--skip-llm-learning] \
        [--only-value] [key=value overrides]
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import random
import sys
import time
import typing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    arm_params,
    round_figures,
    run_arm_rounds,
    seeded,
    suite_at,
    warm_start_folder,
)
from bench.parallel import run_jobs  # noqa: E402
from bench.provenance import STARTED_AT  # noqa: E402
from bench.unseen import guard_suite, unseen_suite, unseen_tasks  # noqa: E402
from rollwise.config import BaseEstimator, apply_overrides, read_raw, validate  # noqa: E402
from rollwise.credit import ESTIMATORS  # noqa: E402
from rollwise.credit.concal import calibrated_returns  # noqa: E402
from rollwise.credit.diagnostics import ToyChain, reference_q, value_report  # noqa: E402
from rollwise.credit.gigpo import combine, step_returns  # noqa: E402
from rollwise.credit.tracker import attach, empty_tracker, next_drift, next_tracker  # noqa: E402
from rollwise.credit.turns import turn_table  # noqa: E402
from rollwise.envs.runtime import load_suite  # noqa: E402
from rollwise.evaluate.full import evaluate_policy, evaluation_tasks, summarize  # noqa: E402
from rollwise.policy.build import load_policy  # noqa: E402
from rollwise.policy.hf import HFBackend  # noqa: E402
from rollwise.rollout import engine  # noqa: E402
from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes  # noqa: E402
from rollwise.types import STEP_COLUMNS, ToolCall  # noqa: E402

ARMS = ("grpo", "gigpo", "concal", "iapo", "spo", "spo_pp")  # the learning arms
SINGLE_STREAM = {"spo", "spo_pp"}
LONG_KINDS = {"status", "amount", "cancel"}  # 3 dependent calls, then the answer
# The value panels score the estimators of an episode's turns: opd, opdvr and farca add token
# terms that need a teacher or fact checks, cosir needs team episodes (their own benches).
VALUE_METHODS = typing.get_args(BaseEstimator)
REPLAY = {"calls": 0, "mismatches": 0}  # replayed calls whose observation differed (should be 0)


def setup(p, cache: Path, given: Path | None = None):
    """(suite, its folder, warm-start folder), cached by their params; `given` (a saved policy
    folder) replaces the built warm start."""
    suite, suite_dir = suite_at(cache, p.envs)
    return suite, suite_dir, warm_start_folder(p, suite, cache, given)


def long_tasks(suite, split: str) -> list[str]:
    return sorted(t.task_id for t in suite.split(split) if t.kind in LONG_KINDS)


def long_heldout_tasks(suite) -> list:
    """The long held-out tasks every arm is scored on, in evaluate/full.py's order."""
    long = set(long_tasks(suite, "heldout"))
    return [t for t in evaluation_tasks(suite, "heldout", 10**6) if t.task_id in long]


def limits_of(p, seed: int, greedy: bool = False) -> Limits:
    r = p.rollout
    return Limits(
        max_turns=r.max_turns,
        max_new_tokens=r.max_new_tokens,
        greedy=greedy,
        max_context=p.policy.max_context,
        temperature=r.temperature,
        seed=seed,
    )


def sample(model, tok, suite, p, task_ids: list[str], g: int, seed: int, tag: str):
    """G episodes of each task with the current policy: (episodes, steps) tables."""
    specs = [
        EpisodeSpec(f"{tag}/{tid}/s{k}", suite.tasks[tid],
                    clone_env(suite.envs[suite.tasks[tid].env_id]), group=tid, sample=k,
                    seed=seed * 100000 + k)
        for tid in task_ids for k in range(g)
    ]  # fmt: skip
    rows, steps = run_episodes(specs, HFBackend(model, tok), tok, limits_of(p, seed))
    return pd.DataFrame(rows), pd.DataFrame(steps, columns=STEP_COLUMNS)


# ---------------------------------------------------------------------------- LLM reference Q
def prefix_live(ep, k: int, calls: pd.DataFrame, suite, tok, j: int, seed: int) -> engine.Live:
    """A live episode standing right after turn k's observation of `ep`: same tokens, the
    environment replayed through the same calls (deterministic suite: same observations)."""
    task = suite.tasks[ep.task_id]
    spec = EpisodeSpec(f"mc/{ep.episode_id}/{k}/{j}", task, clone_env(suite.envs[task.env_id]),
                       group=ep.group, sample=j, seed=seed * 100000 + j)  # fmt: skip
    e = engine.start(spec, tok)
    spans = [list(map(int, s)) for s in ep.turn_spans]
    for c in calls[calls["span_start"] <= spans[k][0]].itertuples():
        call = ToolCall(c.tool, json.loads(c.arguments))
        REPLAY["calls"] += 1
        REPLAY["mismatches"] += spec.env.step(call).content != c.observation
        e.calls.append(call)
    cut = spans[k + 1][0]
    e.ids, e.logprobs = list(ep.token_ids[:cut]), list(ep.logprobs[:cut])
    e.mask, e.turn_spans = list(ep.loss_mask[:cut]), spans[: k + 1]
    return e


def continue_lives(lives: list, left: list[int], model, tok, limits: Limits) -> np.ndarray:
    """Run each live episode for at most its `left` turns more; their rewards."""
    backend = HFBackend(model, tok)
    with ThreadPoolExecutor(max_workers=engine.TOOL_WORKERS) as pool:
        for t in range(max(left, default=0)):
            active = [
                e for e, n in zip(lives, left, strict=True) if e.termination is None and n > t
            ]
            active = [e for e in active if engine.fits(e, limits)]
            for lo in range(0, len(active), limits.batch_size):
                engine.advance(active[lo : lo + limits.batch_size], backend, tok, limits, pool)
    for e in lives:
        if e.termination is None:
            e.end("max_turns")
    return np.array([engine.finish(e, limits)["reward"] for e in lives])


def prefix_key(t, ep) -> str:
    """One reference point per (task, tokens through the action); a last turn is its own."""
    if t.last:
        return "T:" + t.episode_id
    text = t.group + ":" + ",".join(map(str, ep.token_ids[: t.span_end]))
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def llm_reference(turns, episodes, steps, model, tok, suite, p, n: int, seed: int):
    """(keys, Q mean, Q standard error) per turn. A last turn's Q is the episode's reward; every
    other distinct prefix-through-the-action gets n continuations."""
    by_id = {e.episode_id: e for e in episodes.itertuples()}
    calls = {ep: g.sort_values("step") for ep, g in steps.groupby("episode_id")}
    keys = pd.Series([prefix_key(t, by_id[t.episode_id]) for t in turns.itertuples()], turns.index)

    def returns(rows: pd.DataFrame, n: int) -> np.ndarray:
        out = np.zeros((len(rows), n))
        lives, left, where = [], [], []
        for r, t in enumerate(rows.itertuples()):
            ep = by_id[t.episode_id]
            if t.last:
                out[r] = ep.reward
                continue
            empty = steps.iloc[:0]
            for j in range(n):
                lives.append(prefix_live(ep, t.step, calls.get(t.episode_id, empty), suite, tok,
                                         j, seed))  # fmt: skip
                left.append(p.rollout.max_turns - t.step - 1)
                where.append((r, j))
        rewards = continue_lives(lives, left, model, tok, limits_of(p, seed))
        for (r, j), v in zip(where, rewards, strict=True):
            out[r, j] = v
        return out

    mean, se = reference_q(turns, keys, returns, n)
    return keys, mean, se


def llm_value_panel(model, tok, suite, p, args) -> dict:
    t0 = time.perf_counter()
    picked = random.Random(args.value_seed).sample(long_tasks(suite, "train"), args.value_tasks)
    episodes, steps = sample(model, tok, suite, p, picked, p.rollout.samples_per_task,
                             args.value_seed, "value")  # fmt: skip
    turns = turn_table(episodes, steps)
    keys, q, se = llm_reference(turns, episodes, steps, model, tok, suite, p, args.mc,
                                args.value_seed)  # fmt: skip
    names = [*VALUE_METHODS, *VARIANTS]
    methods = {m: report(turns, episodes, steps, q, p.credit, m) for m in names}
    return {
        "decomposition": decomposition(turns, episodes, steps, q, p.credit),
        "episodes": len(episodes), "turns": len(turns), "sample_success":
        float(episodes["success"].mean()), "reward_mean": float(episodes["reward"].mean()),
        "mc_continuations": args.mc, "mc_points": int((~keys.duplicated() & ~turns["last"]).sum()),
        "reference_se_mean": float(se[~turns["last"].to_numpy()].mean()),
        "replayed_calls": REPLAY["calls"], "replay_mismatches": REPLAY["mismatches"],
        "methods": methods, "wall_s": time.perf_counter() - t0,
    }  # fmt: skip


def decomposition(turns, episodes, steps, q, credit) -> dict:
    """Value error of the parts of A = A^E + omega A^S: the episode term both methods share, each
    step term alone, and the GiGPO form fed the reference Q itself (what no return estimate in
    that form can beat: its A^E and per-cluster std normalization stay). `*_step_values` score
    the per-turn action values each method puts into the clusters (GiGPO's raw returns, ConCal's
    calibrated ones) before any normalization: what calibration itself does to the values."""
    flat = credit.model_copy(update={"gigpo": credit.gigpo.model_copy(update={"omega": 0.0})})
    episode = combine(episodes, turns, np.zeros(len(turns)), flat)  # [N] A^E
    raw = step_returns(turns, credit.gigpo.gamma)  # [N]
    cal = calibrated_returns(turns, credit.gigpo.gamma, credit.concal.pool_cap)  # [N]
    parts = {
        "episode_term": episode,
        "gigpo_step_term": combine(episodes, turns, raw, credit) - episode,
        "concal_step_term": combine(episodes, turns, cal, credit) - episode,
        "reference_q_step_term": combine(episodes, turns, q, credit) - episode,
        "reference_q_in_gigpo_form": combine(episodes, turns, q, credit),
        "gigpo_step_values": raw,
        "concal_step_values": cal,
    }
    return {k: value_report(turns, v, q)["value_error"] for k, v in parts.items()}


# Knob variants reported next to the methods (value panels only: they cost no rollouts).
VARIANTS = {
    "dr_grpo": ("grpo", {"std_norm": False}),
    "gigpo_mean_norm": ("gigpo", {"gigpo": {"norm": "mean_norm"}}),
    "gigpo_mean_std_norm": ("gigpo", {"gigpo": {"norm": "mean_std_norm"}}),
    "concal_mean_norm": ("concal", {"gigpo": {"norm": "mean_norm"}}),
    "concal_mean_std_norm": ("concal", {"gigpo": {"norm": "mean_std_norm"}}),
    "concal_full_pool": ("concal", {"concal": {"pool_cap": 1.0}}),
    "concal_outcome_episode": ("concal", {"concal": {"episode_term": "outcome"}}),
}


def configured(credit, name: str):
    """(estimator, its credit config) for a method or a VARIANTS name."""
    method, patch = VARIANTS.get(name, (name, {}))
    raw = credit.model_dump() | {"method": method}
    for key, value in patch.items():
        raw[key] = raw[key] | value if isinstance(value, dict) else value
    return ESTIMATORS[method], type(credit).model_validate(raw)


def report(turns, episodes, steps, q, credit, name: str) -> dict:
    estimator, cfg = configured(credit, name)
    return value_report(turns, estimator(episodes, steps, cfg)["advantage"].to_numpy(), q)


# ---------------------------------------------------------------------------- toy chain
TOY_LENGTHS = (4, 5, 6)


def toy_start() -> np.ndarray:
    """A weak starting policy over (calls left, last was an error): P(call, wrong, answer)."""
    p = np.zeros((max(TOY_LENGTHS) + 1, 2, 3))
    p[1:, 0] = [0.6, 0.25, 0.15]
    p[1:, 1] = [0.5, 0.3, 0.2]
    p[0] = [0.0, 0.4, 0.6]
    return p


def toy_value_panel(args, credit) -> dict:
    chain = ToyChain(toy_start(), max_turns=8)
    rows, parts = [], []
    for seed in range(args.toy_seeds):
        tasks = [(f"t{i}", TOY_LENGTHS[i % 3]) for i in range(args.toy_tasks)]
        episodes, steps = chain.sample(tasks, 8, seed)
        turns = turn_table(episodes, steps)
        q = chain.exact_q(turns, episodes)
        rows += [{"method": m, "seed": seed, **report(turns, episodes, steps, q, credit, m)}
                 for m in [*VALUE_METHODS, *VARIANTS]]  # fmt: skip
        parts.append(decomposition(turns, episodes, steps, q, credit))
    return {"seeds": args.toy_seeds, "methods": mean_by_method(pd.DataFrame(rows)),
            "decomposition": pd.DataFrame(parts).mean().to_dict()}  # fmt: skip


def mean_by_method(df: pd.DataFrame) -> dict:
    figures = ["value_error", "kendall_tau", "advantage_var", "same_action_sd"]
    return {m: {k: float(g[k].mean()) for k in figures} for m, g in df.groupby("method")}


def softmax(theta: np.ndarray) -> np.ndarray:
    z = np.exp(theta - theta.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def toy_success(policy: np.ndarray) -> float:
    chain = ToyChain(policy, max_turns=8)
    return float(np.mean([chain.values(n)[chain.max_turns, 0, 0] for n in TOY_LENGTHS]))


def toy_learn(method: str, seed: int, args, credit) -> list[float]:
    """Exact success after each round of token-mean policy gradient with `method`'s credit."""
    rng = np.random.default_rng(seed)
    theta = np.log(np.maximum(toy_start(), 1e-6))
    pool = [(f"t{i}", TOY_LENGTHS[i % 3]) for i in range(args.toy_pool)]
    g = 1 if method in SINGLE_STREAM else 8
    cfg = credit.model_copy(update={"method": method})
    tracker, drift, curve = empty_tracker(), {0: 0.0}, [toy_success(softmax(theta))]
    for r in range(1, args.toy_rounds + 1):
        chain = ToyChain(softmax(theta), max_turns=8)
        picked = [pool[i] for i in rng.choice(len(pool), args.toy_batch // g, replace=False)]
        episodes, steps = chain.sample(picked, g, int(rng.integers(1 << 30)), version=r - 1)
        episodes = attach(episodes, tracker, drift)
        adv = ESTIMATORS[method](episodes, steps, cfg)
        tracker = next_tracker(episodes, tracker, cfg)
        old = softmax(theta)
        theta = theta + args.toy_lr * toy_gradient(chain, episodes, steps, adv)
        drift = next_drift(drift, r, r - 1, toy_kl(old, softmax(theta)))
        curve.append(toy_success(softmax(theta)))
    return curve


def toy_gradient(chain, episodes, steps, adv) -> np.ndarray:
    """Token-mean surrogate: sum_k n_k A_k grad log pi(a_k | s_k) / sum_k n_k (tabular)."""
    turns = turn_table(episodes, steps)
    lengths = dict(zip(episodes["episode_id"], episodes["length"], strict=True))
    n = (adv["span_end"] - adv["span_start"]).to_numpy(float)  # [N]
    grad = np.zeros_like(chain.policy)  # [L+1, 2, 3]
    for t, a, w in zip(turns.itertuples(), adv["advantage"].to_numpy(), n, strict=True):
        i, e = chain.parse_state(t.state)
        rem = lengths[t.episode_id] - i
        onehot = np.eye(3)[chain.kind(t.action)]
        grad[rem, e] += w * a * (onehot - chain.probs(rem, e))
    return grad / max(n.sum(), 1.0)


def toy_kl(old: np.ndarray, new: np.ndarray) -> float:
    return float((old * (np.log(old + 1e-12) - np.log(new + 1e-12))).sum(-1).mean())


def toy_learning_panel(args, credit) -> dict:
    curves = {m: [toy_learn(m, s, args, credit) for s in range(args.toy_seeds)] for m in ARMS}
    final = {m: [c[-1] for c in cs] for m, cs in curves.items()}
    return {
        "rounds": args.toy_rounds, "episodes_per_round": args.toy_batch, "lr": args.toy_lr,
        "start_success": curves["grpo"][0][0],
        "final_success": {m: float(np.mean(v)) for m, v in final.items()},
        "final_success_per_seed": final,
        "curve_mean": {m: np.mean(cs, 0).tolist() for m, cs in curves.items()},
    }  # fmt: skip


# ---------------------------------------------------------------------------- LLM learning arm
def arm_overrides(method: str, seed: int, p, args) -> dict:
    """The arm in the pipeline's syntax: its estimator and seed, long train tasks only, equal
    episodes a round (spo and spo_pp: tasks x G tasks of one sample, a single stream)."""
    g = 1 if method in SINGLE_STREAM else p.rollout.samples_per_task
    return {**seeded(seed), "credit.method": method, "rollout.samples_per_task": g,
            "schedule.tasks_per_round": args.tasks * p.rollout.samples_per_task // g,
            "schedule.kinds": sorted(LONG_KINDS), "rounds": args.rounds}  # fmt: skip


def run_arm(method: str, seed: int, folder: Path, suite, p, args) -> dict:
    """`--rounds` rounds of the pipeline (loop.run_rounds) from the warm start; held-out at
    the end."""
    arm = arm_params(p, arm_overrides(method, seed, p, args))
    rounds: list[dict] = []
    checked = guard_suite(suite, p, args.unseen_dir)
    model, tok, _ = run_arm_rounds(
        arm, suite, folder, checked, lambda r, done: rounds.append(round_figures(r, done))
    )
    return {"method": method, "seed": seed, "heldout": heldout(model, tok, suite, p, args),
            "rounds": rounds}  # fmt: skip


def heldout(model, tok, suite, p, args) -> dict:
    """Greedy success and mean reward on long held-out tasks (the same tasks for every arm);
    with --unseen-suite also on the long tasks of a suite no stage saw (`unseen_*`)."""
    out = greedy_success(model, tok, suite, long_heldout_tasks(suite)[: args.eval_tasks], p)
    if args.unseen_dir is not None:
        unseen = load_suite(args.unseen_dir)
        picked = unseen_tasks(unseen, p, LONG_KINDS)
        out.update(
            {f"unseen_{k}": v for k, v in greedy_success(model, tok, unseen, picked, p).items()}
        )
    return out


def greedy_success(model, tok, suite, tasks: list, p) -> dict:
    limits = Limits(max_context=p.policy.max_context, max_turns=p.rollout.max_turns,
                    max_new_tokens=p.rollout.max_new_tokens, greedy=True)  # fmt: skip
    s = summarize(evaluate_policy(HFBackend(model, tok), tok, suite, tasks, limits))
    return {"success": s["success"], "reward": s["reward"], "tasks": len(tasks)}


def arm_in_worker(method: str, seed: int, folder: Path, suite_dir: Path, p, args) -> dict:
    """run_arm in a process of its own (--workers), the suite read afresh. An arm is seeded by
    (method, seed) alone, so its figures do not depend on the process."""
    return run_arm(method, seed, folder, load_suite(suite_dir), p, args)


def announce(run: dict) -> dict:
    print(json.dumps({k: run[k] for k in ("method", "seed", "heldout")}), flush=True)
    return run


def learning_panel(folder: Path, suite_dir: Path, p, args, base: dict) -> dict:
    jobs = [
        (method, seed, folder, suite_dir, p, args) for seed in args.seeds for method in args.arms
    ]
    runs = run_jobs(arm_in_worker, jobs, args.workers, announce)

    def per_seed(key: str) -> dict[str, list[float]]:
        return {m: [r["heldout"][key] for r in runs if r["method"] == m] for m in args.arms}

    panel = {
        "rounds": args.rounds, "episodes_per_round": args.tasks * p.rollout.samples_per_task,
        "eval_tasks": args.eval_tasks, "warmstart_success": base["success"],
        "warmstart_reward": base["reward"],
        "heldout_success": {m: float(np.mean(v)) for m, v in per_seed("success").items()},
        "heldout_reward": {m: float(np.mean(v)) for m, v in per_seed("reward").items()},
        "heldout_success_per_seed": per_seed("success"), "runs": runs,
    }  # fmt: skip
    if "unseen_success" in base:  # --unseen-suite
        unseen = per_seed("unseen_success")
        panel.update(unseen_tasks=base["unseen_tasks"],
                     warmstart_unseen_success=base["unseen_success"],
                     unseen_success={m: float(np.mean(v)) for m, v in unseen.items()},
                     unseen_success_per_seed=unseen)  # fmt: skip
    return panel


# ---------------------------------------------------------------------------- output
def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    methods = list(VALUE_METHODS)
    x = np.arange(len(methods))
    for k, (name, panel) in enumerate((("LLM (MC reference)", result["value_llm"]),
                                       ("toy chain (exact Q)", result["value_toy"]))):  # fmt: skip
        err = [panel["methods"][m]["value_error"] for m in methods]
        tau = [panel["methods"][m]["kendall_tau"] for m in methods]
        ax[0, 0].bar(x + 0.4 * k - 0.2, err, 0.4, label=name)
        ax[0, 1].bar(x + 0.4 * k - 0.2, tau, 0.4, label=name)
    for a, title in ((ax[0, 0], "value-difference error (lower is better)"),
                     (ax[0, 1], "Kendall tau of action orderings")):  # fmt: skip
        a.set_xticks(x, methods)
        a.set_title(title)
        a.legend()
    if "learning_llm" not in result:
        ax[1, 0].set_axis_off()
        ax[1, 0].set_title("LLM learning arm not run (--skip-llm-learning / --only-value)")
    held = result.get("learning_llm", {}).get("heldout_success_per_seed", {})
    for i, m in enumerate(held):
        vals = [100 * v for v in held[m]]
        ax[1, 0].bar(i, np.mean(vals), color="lightgray", edgecolor="black")
        ax[1, 0].scatter([i] * len(vals), vals, color="black", zorder=3)
    unseen = result.get("learning_llm", {}).get("unseen_success_per_seed", {})
    for i, m in enumerate(unseen):  # the same runs on the unseen suite's long tasks
        vals = [100 * v for v in unseen[m]]
        ax[1, 0].scatter([i + 0.25] * len(vals), vals, facecolors="none", edgecolors="tab:red",
                         zorder=3, label="unseen suite" if i == 0 else None)  # fmt: skip
    if unseen:
        warm = 100 * result["learning_llm"]["warmstart_unseen_success"]
        ax[1, 0].axhline(warm, ls=":", color="tab:red")
        ax[1, 0].legend()
    if held:
        ax[1, 0].axhline(100 * result["learning_llm"]["warmstart_success"], ls="--", color="gray")
        ax[1, 0].set_xticks(range(len(held)), list(held))
        ax[1, 0].set_title("LLM held-out success (%), long tasks; lines: warm start")
    for m, curve in result.get("learning_toy", {}).get("curve_mean", {}).items():
        ax[1, 1].plot(100 * np.array(curve), label=m)
    ax[1, 1].set_title("toy chain: exact success (%) per round, mean over seeds")
    ax[1, 1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def headline(result: dict) -> dict:
    """The issue's figures from the panels that ran (learning ones only when their panel did)."""
    llm, toy = result["value_llm"]["methods"], result["value_toy"]["methods"]
    parts, toy_parts = (result[k]["decomposition"] for k in ("value_llm", "value_toy"))
    out = {
        "concal_over_gigpo_value_error_ratio":
            llm["concal"]["value_error"] / llm["gigpo"]["value_error"],
        "toy_concal_over_gigpo_value_error_ratio":
            toy["concal"]["value_error"] / toy["gigpo"]["value_error"],
        **{f"{panel}concal_over_gigpo_value_error_ratio_{norm}":  # each norm, both methods
           methods[f"concal_{norm}"]["value_error"] / methods[f"gigpo_{norm}"]["value_error"]
           for panel, methods in (("", llm), ("toy_", toy))
           for norm in ("mean_norm", "mean_std_norm")},
        "concal_over_gigpo_step_value_error_ratio":  # the values alone, before A's form
            parts["concal_step_values"] / parts["gigpo_step_values"],
        "toy_concal_over_gigpo_step_value_error_ratio":
            toy_parts["concal_step_values"] / toy_parts["gigpo_step_values"],
        "targets": {"concal_over_gigpo_value_error_ratio": "<= 0.7",
                    "concal_minus_gigpo_pts": ">= 3"},
    }  # fmt: skip
    if {"concal", "gigpo"} <= set(result.get("learning_llm", {}).get("heldout_success", {})):
        held, reward = (result["learning_llm"][k] for k in ("heldout_success", "heldout_reward"))
        out["concal_minus_gigpo_pts"] = 100 * (held["concal"] - held["gigpo"])
        out["concal_minus_gigpo_reward_pts"] = 100 * (reward["concal"] - reward["gigpo"])
        llm = result["learning_llm"]
        if "unseen_success" in llm:  # the same runs on ~3x the tasks: the difference's noise
            unseen = llm["unseen_success"]
            out["concal_minus_gigpo_unseen_suite_pts"] = 100 * (unseen["concal"] - unseen["gigpo"])
            n, m = llm["runs"][0]["heldout"]["tasks"], llm["unseen_tasks"]
            pooled = (
                n * out["concal_minus_gigpo_pts"] + m * out["concal_minus_gigpo_unseen_suite_pts"]
            )
            out["concal_minus_gigpo_all_long_pts"] = pooled / (n + m)
    if "learning_toy" in result:
        final = result["learning_toy"]["final_success"]
        out["toy_concal_minus_gigpo_pts"] = 100 * (final["concal"] - final["gigpo"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*", help="dotted params overrides key=value")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=8, help="tasks x G episodes per round")
    parser.add_argument("--eval-tasks", type=int, default=64)
    parser.add_argument("--mc", type=int, default=12, help="continuations per reference point")
    parser.add_argument("--value-tasks", type=int, default=12)
    parser.add_argument("--value-seed", type=int, default=0)
    parser.add_argument("--toy-seeds", type=int, default=5)
    parser.add_argument("--toy-tasks", type=int, default=32)
    parser.add_argument("--toy-pool", type=int, default=300)
    parser.add_argument("--toy-batch", type=int, default=128)
    parser.add_argument("--toy-rounds", type=int, default=12)
    parser.add_argument("--toy-lr", type=float, default=4.0)
    parser.add_argument(
        "--arms",
        nargs="+",
        default=list(ARMS),
        choices=list(ARMS),
        help="learning arms (concal and gigpo give the headline)",
    )
    parser.add_argument(  # 2 on 2 cores: the arms are independent, one torch thread each
        "--workers", type=int, default=1, help="learning arms run in this many processes"
    )
    parser.add_argument(  # needs warmstart.stop_at_success (its validation suite's words)
        "--unseen-suite", action="store_true",
        help="also evaluate on the long tasks of the warm start's validation suite",
    )  # fmt: skip
    parser.add_argument("--skip-llm-learning", action="store_true")
    parser.add_argument("--only-value", action="store_true", help="value panels only (no training)")
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise" / "bench" / "credit")
    parser.add_argument(  # a partial warm start differs by machine: to compare, share one
        "--warm-start",
        type=Path,
        help="a saved policy folder (e.g. models/round_00) instead of building the warm start",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "credit.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    overrides = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in args.overrides)}
    p = validate(apply_overrides(read_raw(ROOT / "params.yaml"), overrides))
    args.cache.mkdir(parents=True, exist_ok=True)
    suite, suite_dir, folder = setup(p, args.cache, args.warm_start)
    setup_s = time.perf_counter() - t0
    result: dict = {"value_toy": toy_value_panel(args, p.credit)}
    if not args.only_value:
        result["learning_toy"] = toy_learning_panel(args, p.credit)
    print(json.dumps({"toy_s": round(time.perf_counter() - t0)}), flush=True)
    model, tok = load_policy(folder)
    result["value_llm"] = llm_value_panel(model, tok, suite, p, args)
    print(json.dumps({"value_llm_s": round(result["value_llm"]["wall_s"])}), flush=True)
    if not (args.skip_llm_learning or args.only_value):
        args.unseen_dir = unseen_suite(p, args.cache, tok) if args.unseen_suite else None
        base = heldout(model, tok, suite, p, args)
        result["learning_llm"] = learning_panel(folder, suite_dir, p, args, base)
    result = {
        "command": "python bench/credit.py " + " ".join(sys.argv[1:]), "git_commit": STARTED_AT,
        "git_dirty": STARTED_AT.endswith("+uncommitted"),
        **headline(result),
        "setup_s": setup_s, "wall_s": time.perf_counter() - t0, "overrides": overrides,
        "warm_start": str(args.warm_start or "built"),
        **copy.deepcopy(result),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot(result, args.out.with_suffix(".png"))
    result["plot"] = os.path.relpath(args.out.with_suffix(".png"), ROOT)
    args.out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, default=float))


if __name__ == "__main__":
    main()
