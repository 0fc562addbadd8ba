"""One round of RL, written once: rollout -> curate -> credit -> train, from a state to the next.

Each DVC stage (tasks/rollout.py, curate.py, credit.py, train.py) reads its inputs from files,
calls one function here and writes what it returns; the Prefect flow runs those same stages;
benches call `run_round` in one process, every artifact passed as data. So a learning figure
measures the pipeline itself, and a fix here reaches every caller.

Seeds: a round's plan, episodes and update are seeded by (params, round) alone, the same way on
every path, so the same params give the same episodes, advantages and weights from `dvc repro`,
the flow and a bench (tests/e2e/test_dvc_pipeline.py checks it on the micro config).
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rollwise.config import Params
from rollwise.envs.runtime import Suite

Rows = tuple[list[dict], list[dict]]  # (episode rows, step rows) as rollout/engine.py returns
RunSpecs = Callable[[list], Rows]  # the episode specs of a batch -> their rows


def empty_bank() -> pd.DataFrame:
    from rollwise.curate.success_bank import BANK_COLUMNS

    return pd.DataFrame(columns=BANK_COLUMNS)


def empty_quarantine() -> pd.DataFrame:
    from rollwise.curate.filters import QUARANTINE_COLUMNS

    return pd.DataFrame(columns=QUARANTINE_COLUMNS)


def empty_skills() -> pd.DataFrame:
    from rollwise.memory.bank import empty

    return empty()


def empty_tracker() -> pd.DataFrame:
    from rollwise.credit.tracker import empty_tracker as empty

    return empty()


@dataclass
class RoundState:
    """What a round continues from besides the weights: what the scheduler observed, the
    curator's success bank and quarantine, SPO's tracker and the KL each policy version
    travelled, the guard's last and best validation success, the trainer's snapshot
    (optimizer moments, RNGs, optimizer steps: train/trainer.py snapshot), SMITH's tool pool
    where the suite builds tools (envs/tool_pool.py; None: none yet), and the skill bank
    (rollout.memory.skills; memory/bank.py)."""

    history: pd.DataFrame | None = None
    bank: pd.DataFrame = field(default_factory=empty_bank)
    quarantine: pd.DataFrame = field(default_factory=empty_quarantine)
    tracker: pd.DataFrame = field(default_factory=empty_tracker)
    drift: dict[int, float] = field(default_factory=lambda: {0: 0.0})
    guard: tuple[float, float] | None = None  # (start, best); None: not measured yet
    trainer: dict | None = None
    tools: Any = None  # envs.tool_pool.ToolPool
    skills: pd.DataFrame = field(default_factory=empty_skills)


# ---------------------------------------------------------------------------- rollout
@dataclass
class Rollout:
    plan: pd.DataFrame  # what was scheduled and why, what ran and was kept
    episodes: pd.DataFrame  # the kept groups: the training batch
    steps: pd.DataFrame
    audit: pd.DataFrame  # every episode run, with the faults injected (never read by curate)
    history: pd.DataFrame  # the scheduler's history with this round's groups appended
    metrics: dict


def rollout(
    params: Params, suite: Suite, r: int, state: RoundState, run: RunSpecs, tokenizer,
    policy_round: int | None = None,
) -> Rollout:  # fmt: skip
    """Schedule round r's tasks (quarantined ones sit out), sample G episodes each through `run`
    (DAPO rolls batch after batch), and cost and observe every rollout spent."""
    from rollwise.rollout.cost import episode_costs
    from rollwise.rollout.engine import AUDIT_COLUMNS, EpisodeSpec, audit_row, clone_env
    from rollwise.schedule import SCHEDULERS
    from rollwise.schedule.history import extend, observe
    from rollwise.schedule.plan import Budget, execute_plan, plan_metrics, timed
    from rollwise.types import STEP_COLUMNS

    cfg, method = params.rollout, params.schedule.method
    policy_round = r - 1 if policy_round is None else policy_round
    budget = Budget(params.schedule.tasks_per_round, cfg.samples_per_task, r,
                    params.schedule.seed * 1000 + r)  # fmt: skip
    bind_tools(suite, state.tools, cfg.executor)
    memory = remembering(params, state.skills)
    catalog = schedulable(suite.catalog, state.quarantine, params.schedule.kinds)
    knobs = getattr(params.schedule, method, None)  # the method's own section; random has none
    plan, schedule_s = timed(SCHEDULERS[method], catalog, state.history, budget, knobs)
    demos, too_long = opening_demonstrations(params, state.bank, suite, plan, tokenizer)
    steps: list[dict] = []
    audit: list[dict] = []  # every episode run, burned ones too

    def run_batch(rows: pd.DataFrame) -> pd.DataFrame:
        specs = [
            EpisodeSpec(
                f"r{r:02d}/{task_id}/s{k}",
                suite.tasks[task_id],
                memory(
                    demonstrated(
                        clone_env(suite.envs[suite.tasks[task_id].env_id]), demos, task_id
                    ),
                    suite.tasks[task_id].env_id,
                ),  # fmt: skip
                group=task_id,
                sample=k,
                seed=cfg.seed * 100000 + r * 1000 + k,
            )
            for task_id, n in zip(rows["task_id"], rows["n_samples"], strict=True)
            for k in range(n)
        ]
        episodes, batch_steps = run(specs)
        steps.extend(batch_steps)
        audit.extend(audit_row(e) for e in episodes)
        return pd.DataFrame(episodes)

    executed, ran = execute_plan(plan, run_batch, budget.tasks)
    ran = ran.assign(round=r, policy_version=policy_round)
    ran["cost"] = episode_costs(ran, cfg.cost)
    # The training batch is the kept groups; every rollout run (burned ones too) is spent,
    # costed and observed by the scheduler.
    episodes = ran[ran["task_id"].isin(executed.loc[executed["kept"], "task_id"])]
    steps_table = pd.DataFrame(steps, columns=STEP_COLUMNS)
    steps_table = steps_table[steps_table["episode_id"].isin(episodes["episode_id"])]
    metrics = {
        **rollout_metrics(ran),
        **plan_metrics(executed),
        "episodes_kept": len(episodes),
        "schedule_s": schedule_s,
        "demonstrated_tasks": len(demos),
        "demonstrations_skipped_context": len(too_long),
        "policy_round": policy_round,  # the checkpoint sampled with
        "policy_lag": r - 1 - policy_round,  # versions behind the one train@r updates
    }
    return Rollout(
        plan=executed.assign(round=r, policy_round=policy_round),
        episodes=episodes.reset_index(drop=True),
        steps=steps_table.reset_index(drop=True),
        audit=pd.DataFrame(audit, columns=AUDIT_COLUMNS),
        history=extend(state.history, observe(ran, r)),
        metrics=metrics,
    )


def schedulable(
    catalog: pd.DataFrame, quarantine: pd.DataFrame, kinds: list[str] | None = None
) -> pd.DataFrame:
    """The catalog minus the tasks the curator quarantined last round (their failures were not
    the policy's; they sit out until the evidence changes), and only `schedule.kinds` if set."""
    out = catalog[~catalog["task_id"].isin(set(quarantine["task_id"]))]
    return out if not kinds else out[out["kind"].isin(kinds)]


def builds_tools(suite: Suite) -> bool:
    """Whether the suite's environments call a tool pool (SMITH's, envs/toolsmith.py)."""
    return any(hasattr(env, "pool") for env in suite.envs.values())


def bind_tools(suite: Suite, tools, executor: str) -> None:
    """Point the suite's tool-calling environments at the pool the round continues from (their
    episodes' clones share it). Remote workers rebuild environments from the suite folder and
    would call the reference tools instead: refused rather than run on the wrong tools."""
    if tools is None or not builds_tools(suite):
        return
    if executor != "local" and tools.built():
        raise ValueError(
            f"rollout.executor {executor!r}: the tool pool travels only with the local "
            "executor; set rollout.executor: local for a tool-building suite"
        )
    for env in suite.envs.values():
        if hasattr(env, "pool"):
            env.pool = tools


def skill_config(params: Params):
    from rollwise.memory.skills import SkillConfig

    m = params.rollout.memory
    return SkillConfig(mode="append" if m.skills == "append" else "managed", per_env=m.per_env)


def remembering(params: Params, skills: pd.DataFrame) -> Callable:
    """(env, env_id) -> the episode's environment with the memory rollout.memory asks for: the
    bank's offered skills as tools, working memory's progress note (memory.wrap). Remote
    workers rebuild environments from the suite folder: refused rather than run without it."""
    m = params.rollout.memory
    if m.skills == "none" and not m.working:
        return lambda env, env_id: env
    if params.rollout.executor != "local":
        raise ValueError(
            f"rollout.executor {params.rollout.executor!r}: rollout.memory travels only with "
            "the local executor; set rollout.executor: local, or rollout.memory.skills: none "
            "and rollout.memory.working: false"
        )
    from rollwise.memory import wrap
    from rollwise.memory.bank import exposed

    cfg, offered = skill_config(params), {}  # env_id -> its skills, looked up once a round

    def memory(env, env_id: str):
        if env_id not in offered:
            use = m.skills != "none" and len(skills)
            offered[env_id] = exposed(skills, env_id, cfg) if use else None
        return wrap(env, offered[env_id], m.working)

    return memory


def opening_demonstrations(params: Params, bank: pd.DataFrame, suite, plan, tokenizer):
    """With `curate.demonstrations`, the best banked success of each planned task as opening
    messages, and the tasks whose demonstration would overflow the context (skipped)."""
    from rollwise.curate.success_bank import demonstrations

    if not params.curate.demonstrations:
        return {}, []
    tasks = [suite.tasks[t] for t in plan["task_id"]]
    reply, context = params.rollout.max_new_tokens, params.policy.max_context
    return demonstrations(bank, tasks, suite.envs, tokenizer, context, reply)


def demonstrated(env, demos: dict, task_id: str):
    """The episode's environment, opening with the task's demonstration when it has one."""
    from rollwise.curate.success_bank import Demonstrated

    return Demonstrated(env, demos[task_id]) if task_id in demos else env


def rollout_metrics(episodes: pd.DataFrame) -> dict:
    """Per-round numbers over every rollout run (burned ones included); `cost` is the round's
    rollout cost (rollout/cost.py)."""
    group_std = episodes.groupby("group")["reward"].std(ddof=0)
    columns = ["prompt_tokens", "generated_tokens", "tool_calls", "tool_errors", "env_errors",
               "verifier_calls"]  # fmt: skip
    sums = episodes[columns].sum()
    return {
        "episodes": len(episodes),
        "reward_mean": float(episodes["reward"].mean()),
        "success_rate": float(episodes["success"].mean()),
        "zero_variance_groups": float((group_std < 1e-9).mean()),
        **{k: int(v) for k, v in sums.items()},
        "cost": float(episodes["cost"].sum()),
    }


# ---------------------------------------------------------------------------- curate
@dataclass
class Curated:
    tables: dict[str, pd.DataFrame]  # by file stem: attributions, decisions, quarantine, ...
    metrics: dict
    tools: Any = None  # this round's envs.tool_pool.ToolPool (None: the suite builds none)

    @property
    def decisions(self) -> pd.DataFrame:
        return self.tables["decisions"]

    @property
    def positives(self) -> pd.DataFrame | None:
        return self.tables.get("positives")


def curate(
    params: Params, suite: Suite, episodes: pd.DataFrame, steps: pd.DataFrame,
    state: RoundState, r: int, tokenizer=None, backend=None,
) -> Curated:  # fmt: skip
    """Which of round r's episodes may teach, the next quarantine list and the success bank; with
    rollout.memory.skills, the skill bank too (`tokenizer` reads the skill calls in the
    policy's turns; `backend`, the round's policy, validates the meta-agent's updates)."""
    from rollwise.curate import success_bank
    from rollwise.curate.attribution import attribute
    from rollwise.curate.filters import decide, quarantine

    cfg = params.curate
    attributions, checks = attribute(episodes, steps, suite, cfg)
    decisions = decide(attributions, cfg)
    prev_bank = state.bank if len(state.bank) else None
    prev_q = state.quarantine if len(state.quarantine) else None
    quarantined, recheck_calls = quarantine(attributions, checks, prev_q, suite, r, cfg)
    new = success_bank.verified_successes(episodes, steps, attributions)
    bank = success_bank.update(prev_bank, new, cfg.bank_per_task)
    tables = {"attributions": attributions, "decisions": decisions, "quarantine": quarantined,
              "success_bank": bank}  # fmt: skip
    if cfg.replay_positives:  # prior successes only: this round's are in the batch already
        prior = prev_bank if prev_bank is not None else bank.iloc[:0]
        tasks = list(episodes["task_id"].unique())
        tables["positives"] = success_bank.positives(prior, tasks, cfg.replay_positives, r)
    metrics = curate_metrics(attributions, decisions, quarantined, bank, recheck_calls)
    if params.rollout.memory.skills != "none":
        validate = None
        if params.rollout.memory.meta_tasks:
            if backend is None:
                raise ValueError("rollout.memory.meta_tasks: curate needs the round's policy")
            validate = meta_validator(params, suite, backend, tokenizer, set(episodes["task_id"]))
        skills, skill_metrics, log = skill_round(params, state, bank, episodes, steps, r,
                                                 tokenizer, validate)  # fmt: skip
        tables["skill_bank"] = skills
        if log is not None:
            tables["meta_updates"] = log
        metrics |= skill_metrics
    tools = None
    if builds_tools(suite):  # admitted on fresh-input evidence, not on the episode's reward
        from rollwise.envs.tool_pool import harvest_round

        tools, tool_metrics = harvest_round(state.tools, episodes, steps, r)
        metrics |= tool_metrics
    return Curated(tables, metrics, tools)


def skill_round(
    params: Params, state: RoundState, bank: pd.DataFrame, episodes: pd.DataFrame,
    steps: pd.DataFrame, r: int, tokenizer, validate: Callable | None = None,
) -> tuple[pd.DataFrame, dict, pd.DataFrame | None]:  # fmt: skip
    """Round r's skill bank (the last one with this round's invocations as evidence, reviewed,
    plus what the success bank induces; a success of a task the scheduler's history saw fail
    in an earlier round is a repair), its figures (size, statuses, pathways, calls, churn)
    and, with `validate` (bank -> held-aside success), the meta-agent's gate log: each failed
    episode localized, its local update tried, kept only if validation rises."""
    from rollwise.memory import meta
    from rollwise.memory.bank import invocations, update

    if tokenizer is None:
        raise ValueError("rollout.memory.skills: curate needs the rollout policy's tokenizer")
    calls = invocations(episodes, steps, tokenizer)
    current = int(episodes["policy_version"].max()) if len(episodes) else r - 1
    skills = state.skills
    new = update(skills, bank, state.history, calls, r, current, skill_config(params))
    log, meta_metrics = None, {}
    if validate is not None:
        diagnoses = meta.localize(episodes, steps, calls)
        tried = meta.propose(diagnoses, new, bank, r)[: params.rollout.memory.meta_max_updates]
        none = pd.DataFrame(columns=meta.GATE_COLUMNS)  # no update: no validation to pay for
        new, log = meta.gate(new, tried, validate) if tried else (new, none)
        causes = diagnoses["cause"].value_counts()
        meta_metrics = {**{f"meta_{c}": int(causes.get(c, 0)) for c in meta.CAUSES},
                        "meta_tried": len(log), "meta_kept": int(log["kept"].sum())}  # fmt: skip
        if len(log):  # the validation success of the bank the gate kept
            kept = log.loc[log["kept"], "after"]
            best = kept.iloc[-1] if len(kept) else log["before"][0]
            meta_metrics["meta_validation"] = float(best)
    status = new["status"].value_counts()
    before = dict(zip(skills["skill_id"], skills["status"], strict=True))
    changed = sum(before.get(k) != v for k, v in zip(new["skill_id"], new["status"], strict=True))
    metrics = {
        "skills": int(len(new) - status.get("retired", 0)),
        "skills_active": int(status.get("active", 0)),
        "skills_retired": int(status.get("retired", 0)),
        "skills_churn": int(changed),  # added, or whose status moved
        "skills_repair": int((new["pathway"] == "repair").sum()),
        "skill_calls": len(calls),
        **({"skill_call_success": float(calls["success"].mean())} if len(calls) else {}),
    }
    return new, metrics | meta_metrics, log


def meta_validator(
    params: Params, suite: Suite, backend, tokenizer, busy: set[str]
) -> Callable[[pd.DataFrame], float]:
    """bank -> greedy success of `backend` (the round's policy) on rollout.memory.meta_tasks
    train tasks none of which the round ran (`busy`), each with the bank's skills offered as a
    rollout would offer them: the meta-agent's held-aside validation batch."""
    from rollwise.evaluate.full import evaluate_policy, evaluation_tasks

    aside = [t for t in evaluation_tasks(suite, "train", len(suite.split("train")))
             if t.task_id not in busy][: params.rollout.memory.meta_tasks]  # fmt: skip
    if not aside:
        raise ValueError("rollout.memory.meta_tasks: every train task ran this round; none is "
                         "left to validate the meta-agent's updates on")  # fmt: skip
    limits = greedy_limits(params)

    def validate(bank: pd.DataFrame) -> float:
        episodes = evaluate_policy(backend, tokenizer, suite, aside, limits,
                                   remembering(params, bank))  # fmt: skip
        return float(episodes["success"].mean())

    return validate


def curate_metrics(attributions, decisions, quarantined, bank, recheck_calls: int) -> dict:
    from rollwise.curate.attribution import CAUSES

    causes = attributions["cause"].value_counts().to_dict()
    kept = int(decisions["kept"].sum())
    return {
        "kept": kept,
        "dropped": len(decisions) - kept,
        **{f"cause_{c}": int(causes.get(c, 0)) for c in ("policy", *CAUSES)},
        "verifier_calls": int(attributions["verifier_calls"].sum()) + recheck_calls,
        "quarantined": len(quarantined),
        "bank_entries": len(bank),
        "bank_tasks": int(bank["task_id"].nunique()),
    }


def kept_episodes(
    episodes: pd.DataFrame, decisions: pd.DataFrame, positives: pd.DataFrame | None
) -> pd.DataFrame:
    """The episodes the curator kept, then the replayed positives (if any): the training batch."""
    kept = episodes[episodes["episode_id"].isin(set(decisions.query("kept")["episode_id"]))]
    parts = [kept] if positives is None or positives.empty else [kept, positives]
    return pd.concat(parts, ignore_index=True)


def with_positive_steps(steps: pd.DataFrame, positives: pd.DataFrame | None) -> pd.DataFrame:
    """The round's step rows plus those of the replayed positives (from their trajectories)."""
    from rollwise.curate.success_bank import positive_steps

    if positives is None or positives.empty:
        return steps
    return pd.concat([steps, positive_steps(positives)], ignore_index=True)


# ---------------------------------------------------------------------------- credit
@dataclass
class Credited:
    advantages: pd.DataFrame  # one row per episode turn
    tracker: pd.DataFrame  # SPO's per-task tracker with round r folded in
    metrics: dict


def credit(
    params: Params, episodes: pd.DataFrame, steps: pd.DataFrame, decisions: pd.DataFrame,
    state: RoundState, tokenizer=None,
) -> Credited:  # fmt: skip
    """Advantages of the training batch (`episodes`: kept_episodes), each scaled by its curator
    weight; the tracker is updated whatever the method, so a later switch to spo starts warm.
    Replayed positives do not update it: their outcome was counted when they were sampled.
    Token-level methods get their inputs first (credit/signals.py; farca needs `tokenizer`)."""
    from rollwise.credit import ESTIMATORS, trained_reward
    from rollwise.credit.signals import attach_token_inputs
    from rollwise.credit.tokens import token_term_metrics
    from rollwise.credit.tracker import attach, next_tracker
    from rollwise.curate.filters import weighted_advantages
    from rollwise.curate.success_bank import REPLAY_PREFIX

    cfg = params.credit
    episodes = attach(trained_reward(episodes, cfg.reward), state.tracker, state.drift)
    episodes, signal_metrics = attach_token_inputs(
        cfg, episodes, steps, tokenizer, params.rollout.temperature
    )
    replayed = episodes["episode_id"].str.startswith(REPLAY_PREFIX)
    advantages = weighted_advantages(ESTIMATORS[cfg.method](episodes, steps, cfg), decisions)
    tracker = next_tracker(episodes[~replayed].reset_index(drop=True), state.tracker, cfg)
    metrics = {
        **credit_metrics(advantages),
        "tracker_tasks": len(tracker),
        "replayed_positives": int(replayed.sum()),
        "down_weighted": int((decisions["kept"] & (decisions["weight"] < 1)).sum()),
        **token_term_metrics(advantages),
        **signal_metrics,
    }
    return Credited(advantages, tracker, metrics)


def credit_metrics(advantages: pd.DataFrame) -> dict:
    if advantages.empty:
        return {"turns": 0, "episodes_with_signal": 0.0, "advantage_abs_mean": 0.0}
    magnitude = advantages["advantage"].abs()
    per_episode = magnitude.groupby(advantages["episode_id"]).max()
    return {
        "turns": len(advantages),
        "episodes_with_signal": float((per_episode > 0).mean()),
        "advantage_abs_mean": float(magnitude.mean()),
    }


# ---------------------------------------------------------------------------- train
@dataclass
class Trained:
    model: Any  # the plain HF model to save (LoRA merged); the start's weights if undone
    trainer: dict | None  # the snapshot to save beside it (None: ranks > 0, or undone from none)
    metrics: dict
    verdict: Any = None  # train/guard.py Verdict when train.guard is on


def seed_round(params: Params, r: int) -> None:
    """Every RNG the trainer state saves, seeded by (train.seed, round): a rerun writes
    byte-identical outputs (and every DDP rank draws the same LoRA initialization)."""
    import torch

    seed = params.train.seed * 1000 + r
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def train(
    params: Params, model, tokenizer, trainer: dict | None, episodes: pd.DataFrame,
    advantages: pd.DataFrame, r: int, ref=None, guard: Callable | None = None, device=None,
) -> Trained:  # fmt: skip
    """One PPO-clip update of `model` (round r-1's policy, trained in place) on the batch.
    `trainer` is the previous round's snapshot (None: the warm start's fresh optimizer);
    `guard(model) -> Verdict` (train.guard) judges the updated model; an undone update leaves
    the start's weights and snapshot."""
    from rollwise.train.optim import apply_lrs, make_optimizer
    from rollwise.train.prepare import export, is_lora, prepare
    from rollwise.train.trainer import restore, snapshot, train_round, training_batch, world

    cfg = params.train
    seed_round(params, r)
    lag = policy_lag(episodes, r - 1, cfg.tis_cap)
    items = training_batch(episodes, advantages)
    weights = copy.deepcopy(model.state_dict()) if guard is not None else None
    model = prepare(model, cfg, device)
    optimizer = make_optimizer(model, cfg)
    # LoRA: round r's adapters are new (r-1's are merged into its weights): no moments to resume
    step = restore(trainer, None if is_lora(model) else optimizer).step
    apply_lrs(optimizer, cfg)  # the params' lrs win over the saved ones
    metrics = train_round(
        model, items, cfg, optimizer, tokenizer.pad_token_id, ref,
        temperature=params.rollout.temperature, steps_before=step,
    )  # fmt: skip
    rank, world_size = world()
    metrics["world_size"], metrics["policy_lag"] = world_size, lag
    if rank != 0:
        return Trained(model, None, metrics)
    model = export(model)
    t0 = time.perf_counter()
    verdict = guard(model) if guard is not None else None
    if verdict is not None:
        metrics.update(verdict.metrics(), guard_s=time.perf_counter() - t0)
        if not verdict.kept:  # undone: this round's checkpoint is its start, moments and all
            model.load_state_dict(weights)
            return Trained(model, trainer, metrics, verdict)
    after = snapshot(optimizer, step + int(metrics.get("optimizer_steps", 0)))
    return Trained(model, after, metrics, verdict)


def policy_lag(episodes: pd.DataFrame, start: int, tis_cap: float | None) -> int:
    """Versions between the checkpoint being trained and the oldest that sampled the round's
    own episodes (banked replays keep their versions and are not counted). A lag without
    train.tis_cap would train on off-policy samples uncorrected: refused."""
    from rollwise.curate.success_bank import REPLAY_PREFIX

    own = episodes[~episodes["episode_id"].str.startswith(REPLAY_PREFIX)]
    if own.empty or "policy_version" not in own:
        return 0
    lag = int(start) - int(own["policy_version"].min())
    if lag > 0 and tis_cap is None:
        raise ValueError(
            f"the rollout sampled with a checkpoint {lag} version(s) older than round {start} "
            "(rollout.policy_lag): set train.tis_cap (e.g. 2.0) to correct it"
        )
    return lag


def guard_check(params: Params, tokenizer, suite, start: float, best: float) -> Callable:
    """train.guard's judge of an updated model against the round's start and best success."""
    from rollwise.train.guard import judge, validation_success

    cfg, limits = params.train.guard, greedy_limits(params)

    def check(model):
        return judge(start, validation_success(model, tokenizer, suite, cfg, limits), cfg, best)

    return check


# ---------------------------------------------------------------------------- one round in-process
@dataclass
class Round:
    """Everything one in-process round made, as the stages would have written it."""

    rollout: Rollout
    curated: Curated
    credited: Credited
    trained: Trained


def run_round(
    params: Params, suite: Suite, model, tokenizer, state: RoundState, r: int,
    ref=None, guard_suite: Suite | None = None,
) -> tuple[RoundState, Round]:  # fmt: skip
    """Round r in this process, from round r-1's `model` (trained in place) and `state`: the
    stages' functions chained, no files. `ref` is the warm start for train.kl_coef > 0;
    `guard_suite` the suite train.guard validates on (None: `suite`). Synchronous only
    (rollout.policy_lag 0: the flow and DVC overlap rounds, one process does not)."""
    from rollwise.credit.tracker import next_drift
    from rollwise.rollout.executors import EXECUTORS
    from rollwise.train.guard import travelled_kl, validation_success

    if params.rollout.policy_lag:
        raise ValueError("run_round is synchronous: rollout.policy_lag must be 0")

    def run(specs: list) -> Rows:
        return EXECUTORS["local"](specs, Path("."), Path("."), limits_of(params, r),
                                  params.rollout, load=lambda: (model, tokenizer))  # fmt: skip

    ro = rollout(params, suite, r, state, run, tokenizer)
    backend = None
    if params.rollout.memory.meta_tasks:
        from rollwise.policy.hf import HFBackend

        backend = HFBackend(model, tokenizer)
    cu = curate(params, suite, ro.episodes, ro.steps, state, r, tokenizer, backend)
    batch = kept_episodes(ro.episodes, cu.decisions, cu.positives)
    steps = with_positive_steps(ro.steps, cu.positives)
    cr = credit(params, batch, steps, cu.decisions, state, tokenizer)
    guard, start_best = None, state.guard
    if params.train.guard.tasks:
        checked = guard_suite or suite
        if start_best is None:
            s = validation_success(model, tokenizer, checked, params.train.guard,
                                   greedy_limits(params))  # fmt: skip
            start_best = (s, s)
        guard = guard_check(params, tokenizer, checked, *start_best)
    tr = train(params, model, tokenizer, state.trainer, batch, cr.advantages, r, ref, guard)
    if tr.verdict is not None:
        start_best = (tr.verdict.kept_success, tr.verdict.best_success)
    after = RoundState(
        history=ro.history,
        bank=cu.tables["success_bank"],
        quarantine=cu.tables["quarantine"],
        tracker=cr.tracker,
        drift=next_drift(state.drift, r, r - 1, travelled_kl(tr.metrics)),
        guard=start_best,
        trainer=tr.trainer,
        tools=cu.tools,
        skills=cu.tables.get("skill_bank", state.skills),
    )
    return after, Round(ro, cu, cr, tr)


def run_rounds(
    params: Params, suite: Suite, model, tokenizer, rounds: int, guard_suite: Suite | None = None,
    on_round: Callable[[int, Round], None] | None = None,
) -> tuple[Any, RoundState]:  # fmt: skip
    """Rounds 1..`rounds` from the warm start `model`, as `dvc repro` runs them: (the last
    round's model, its state). `on_round(r, round)` sees each round's artifacts and model
    (round.trained.model: a bench's per-round figures)."""
    ref = copy.deepcopy(model).eval() if params.train.kl_coef > 0 else None  # round_00's policy
    state = RoundState()
    for r in range(1, rounds + 1):
        state, done = run_round(params, suite, model, tokenizer, state, r, ref, guard_suite)
        model = done.trained.model
        if on_round is not None:
            on_round(r, done)
    return model, state


def greedy_limits(params: Params, **knobs):
    """Greedy limits of an evaluation (the evaluate stage, train.guard, warm-start checks, the
    benches) in the evaluated interface: evaluate.action_mode, else the rollout's, with its
    sandbox. `knobs`: other Limits fields (max_turns, max_new_tokens)."""
    from rollwise.rollout.engine import Limits
    from rollwise.sandbox import SandboxLimits

    mode = params.evaluate.action_mode or params.rollout.action_mode
    sandbox = SandboxLimits(**params.rollout.sandbox.model_dump())
    return Limits(max_context=params.policy.max_context, greedy=True, action_mode=mode,
                  sandbox=sandbox, **knobs)  # fmt: skip


def limits_of(params: Params, r: int):
    """The rollout's sampling limits for round r (its seed: schedule.seed * 1000 + r)."""
    from rollwise.rollout.engine import Limits
    from rollwise.sandbox import SandboxLimits

    cfg = params.rollout
    return Limits(
        max_turns=cfg.max_turns,
        max_new_tokens=cfg.max_new_tokens,
        max_context=params.policy.max_context,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        tool_timeout_s=cfg.tool_timeout_s,
        batch_size=cfg.batch_size,
        seed=params.schedule.seed * 1000 + r,
        action_mode=cfg.action_mode,
        sandbox=SandboxLimits(**cfg.sandbox.model_dump()),
    )


# ---------------------------------------------------------------------------- warm start
def warm_start(
    params: Params, suite: Suite, cache: Path | None = None, on_step=None, base: tuple | None = None
) -> tuple:  # fmt: skip
    """(model, tokenizer, info) of round_00: the built tiny model, or the pretrained (model,
    tokenizer) `base` (policy.model with warmstart.finetune_model), SFT'd on the suite's train
    oracles (train/warmstart.py). With `cache`, a folder keyed by the params it depends on is
    reused (benches: one warm start per params, built once)."""
    from rollwise.artifacts import atomic_dir
    from rollwise.policy.build import load_policy, save_policy
    from rollwise.train.warmstart import sft_warm_start

    folder = None
    if cache is not None:
        folder = Path(cache) / f"sft_{warmstart_key(params)}"
        if (folder / "config.json").exists():
            model, tokenizer = load_policy(folder)
            return model, tokenizer, {"cached": str(folder)}
    checks: list[dict] = []
    model, tokenizer, losses, n_demos = sft_warm_start(params, suite, on_step, checks, base)
    info = {"sft_steps": len(losses), "sft_final_loss": losses[-1] if losses else 0.0,
            "demos": n_demos, "checks": checks}  # fmt: skip
    if folder is not None:  # a crash mid-save leaves no config.json beside missing weights
        with atomic_dir(folder, keep_existing=True) as tmp:
            marker = {"built_from": "policy params", "sft_steps": len(losses)}
            if checks:  # where stop_at_success stopped it, and on what validation success
                marker["checks"] = checks
            save_policy(model, tokenizer, tmp, marker)
    return model, tokenizer, info


def warmstart_key(params: Params) -> str:
    """What a built warm start depends on: the suite, the policy, the SFT recipe, in code mode
    the action format and sandbox its demos ran in, and with skill demos the skills an
    environment offers (keys without either stay as they were)."""
    import hashlib
    import json

    w = params.warmstart
    parts = (params.envs.model_dump(), params.policy.model_dump(),
             w.model_dump(exclude=set() if w.skill_demos else {"skill_demos"}))  # fmt: skip
    if w.skill_demos:  # its demos offer that many skills an environment
        parts += ("skills", params.rollout.memory.per_env)
    if params.rollout.action_mode == "code":
        parts += ("code", params.rollout.sandbox.model_dump())
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


@dataclass
class TeamRound:
    plays: list  # rollout/team.py TeamPlay, in (task, condition, sample) order
    trained: Trained
    metrics: dict


def team_round(
    params: Params, model, tokenizer, trainer: dict | None, tasks: list, r: int,
    conditions: tuple[str, ...] = ("split", "retrieval"), settings=None,
    max_new_tokens: int = 48, backend=None,
) -> TeamRound:  # fmt: skip
    """One RL round on team episodes (envs/team.py), the policy as every participant: each task
    played rollout.samples_per_task times under each condition at rollout.temperature, every
    generation credited (credit/cosir.py generation_tables: the team's outcome, plus
    credit.cosir.weight x its message's surprisal drop when credit.method is cosir), and the
    generations trained as `train` trains episodes (PPO-clip, train.max_kl's trust region).
    `backend` samples the turns (default: policy/hf.py over `model`)."""
    from rollwise.credit.cosir import generation_tables
    from rollwise.envs.team import setup
    from rollwise.envs.teamplay import round_metrics
    from rollwise.policy.hf import HFBackend
    from rollwise.rollout.team import ChatPolicy, TeamSettings, play_chats

    settings = settings or TeamSettings()
    t0 = time.perf_counter()
    chat = ChatPolicy(backend or HFBackend(model, tokenizer), tokenizer, max_new_tokens,
                      params.rollout.temperature)  # fmt: skip
    jobs, groups = [], []
    for task in tasks:
        for c in conditions:
            dealt = setup(task, c, settings.k, seed=r, distractors=settings.distractors)
            for g in range(params.rollout.samples_per_task):
                jobs.append((task, dealt, params.train.seed * 100_000 + r * 1000 + g))
                groups.append(f"{task.task_id}/{c}")
    plays = play_chats(jobs, chat, settings.budget)
    rollout_s = time.perf_counter() - t0
    cfg = params.credit
    weight = cfg.cosir.weight if cfg.method == "cosir" else 0.0
    episodes, advantages = generation_tables(plays, groups, weight, cfg.std_norm, cfg.eps)
    trained = train(params, model, tokenizer, trainer, episodes, advantages, r)
    played = round_metrics([p.episode for p in plays])
    metrics = {
        "success_pct": played["success_pct"], "disclosure_rate": played["disclosure_rate"],
        "generations": len(episodes), "surprisal_bits": float(advantages["surprisal_drop"].sum()),
        "rollout_s": rollout_s, "train_s": time.perf_counter() - t0 - rollout_s,
        **{f"train_{k}": v for k, v in trained.metrics.items()},
    }  # fmt: skip
    return TeamRound(plays, trained, metrics)
