"""Why did an episode fail? Evidence for every cause that is not the policy's, then a verdict.

GEPA-Curator (design.md §4): before a failure may teach, attribute it. The causes and the
evidence each rests on:
  env_error         an observation of kind env_error (a tool raised, hung or timed out), or the
                    episode ended in env_error (reset or verification failed)
  flaky_tool        the same call replayed on the same state (the env's reset, then the
                    episode's earlier calls) returns another value, and the replays agree
  verifier          re-verifying the replayed final state disagrees with the recorded verdict
                    (the criteria that disagree are the evidence); also catches a false success
  tool_not_exposed  the task's oracle needs a tool missing from the list the policy was shown
  unsolvable        the oracle, replayed through the environment, fails every time; for a task
                    without an oracle: no success in many samples while its graph neighbours
                    (tasks sharing its tools in its domain) succeed
  stochastic        the oracle's replays disagree among themselves: the outcome is luck
Anything else is the policy's ("policy"). A list that comes back in another order on replay is
noted (`reordered`) but explains nothing: the items are the same, and so is a correct answer.

What it costs: every replayed tool call and every re-verification counts as one verifier call.
Replays are sequential: one replay per episode, and the whole `max_replays` only where one
disagrees, so a plain policy failure costs its calls plus one verification. A result counts as
flaky when replays agree with each other on a value other than the original's.

Replays use fresh seeds, not the episode's: a replay with the episode's own seed would repeat
its random draws and hide exactly the faults it looks for. A replay is compared with the
original only where its state fingerprint before the call matches the original's (or every
earlier result matched up to order, so the state is the same up to equivalent results).

The curator uses environments through the protocol only (reset, step, fingerprint, verify,
tools) and tasks' oracles; it never reads data/envs/audit.parquet or an episode's audit rows,
the ground truth of injected faults (tests/test_curate.py checks both).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from rollwise.types import OPTIONAL_CRITERIA, SUCCESS_CRITERIA, Observation, Rubric, Task, ToolCall

CAUSES = (
    "env_error",
    "flaky_tool",
    "verifier",
    "tool_not_exposed",
    "unsolvable",
    "stochastic",
)
ATTRIBUTION_COLUMNS = [
    "episode_id",
    "task_id",
    "env_id",
    "success",
    "cause",
    "confidence",
    "verifier_calls",
    "scores",
    "evidence",
]
ENV_ERROR_CONFIDENCE = 0.9  # an env error during the episode; 1.0 when it ended the episode


def fresh_seed(*key: object) -> int:
    """A replay seed from its key, far above any rollout seed (stable across processes)."""
    digest = hashlib.blake2b("/".join(map(str, key)).encode(), digest_size=5).digest()
    return 2**40 + int.from_bytes(digest, "little")


# ---------------------------------------------------------------------------- task checks
@dataclass
class TaskCheck:
    """Task-level evidence: tools the oracle needs but the policy was not shown, and whether
    the oracle passes when replayed (one bool per replay; empty if not replayed)."""

    task_id: str
    missing_tools: list[str] = field(default_factory=list)
    oracle_passes: list[bool] = field(default_factory=list)
    verdict_flips: int = 0  # oracle replays whose two verifications of one state disagreed
    has_oracle: bool = True
    verifier_calls: int = 0

    def scores(self) -> dict[str, float]:
        n, fails = len(self.oracle_passes), self.oracle_passes.count(False)
        return {
            "tool_not_exposed": 1.0 if self.missing_tools else 0.0,
            "unsolvable": 1.0 if n and fails == n else 0.0,
            "stochastic": fails / n if n and 0 < fails < n else 0.0,
        }

    def evidence(self) -> dict:
        return {
            "missing_tools": self.missing_tools,
            "oracle_passes": self.oracle_passes,
            "verdict_flips": self.verdict_flips,
        }


def step_retrying(env, call: ToolCall, retries: int) -> tuple[Observation, int]:
    """One call, retried while it fails as an environment error; (observation, calls made)."""
    obs, made = safe_step(env, call), 1
    while obs.kind == "env_error" and made <= retries:
        obs, made = safe_step(env, call), made + 1
    return obs, made


def safe_step(env, call: ToolCall) -> Observation:
    try:
        return env.step(call)
    except Exception as exc:  # the protocol says errors are observations; hold it to that
        return Observation(json.dumps({"error": f"environment: {type(exc).__name__}"}), "env_error")


def check_task(env, task: Task, cfg, replay_oracle: bool = True) -> TaskCheck:
    """Is the task solvable with what the policy is shown? Tools first (free), then, unless
    a tool is missing or `replay_oracle` is off, the oracle replayed `cfg.oracle_replays` times.
    Each replay's final state is verified twice: two verdicts on one state that disagree are
    the verifier's noise (counted apart), not the task's; only consistent verdicts count as
    passes or failures, so a noisy verifier does not make a task look stochastic."""
    check = TaskCheck(task.task_id, has_oracle=bool(task.oracle))
    probe = reset(env, task, fresh_seed(cfg.seed, task.task_id, "tools"))
    if probe is not None:
        shown = {t.name for t in probe.tools()}
        check.missing_tools = sorted({c.name for c in task.oracle} - shown)
    if check.missing_tools or not replay_oracle or not task.oracle:
        return check
    for i in range(cfg.oracle_replays):
        run = reset(env, task, fresh_seed(cfg.seed, task.task_id, "oracle", i))
        if run is None:
            check.oracle_passes.append(False)
            continue
        ok = True
        for call in task.oracle:
            obs, made = step_retrying(run, call, cfg.retries)
            check.verifier_calls += made
            ok = ok and obs.kind == "ok"
        if not ok:  # the oracle did not run cleanly: a failure whatever the verdict
            check.oracle_passes.append(False)
            continue
        first, second = (safe_verify(run, task.answer, list(task.oracle)) for _ in range(2))
        check.verifier_calls += 2
        if first is None or second is None or first.success != second.success:
            check.verdict_flips += 1
        else:
            check.oracle_passes.append(first.success)
    return check


def reset(env, task: Task, seed: int):
    """A private copy of the environment reset for `task`, or None if the reset raised."""
    run = copy.copy(env)
    try:
        run.reset(task, seed)
    except Exception:  # a broken environment costs this check, not the curator
        return None
    return run


def safe_verify(env, answer: str | None, calls: list[ToolCall]) -> Rubric | None:
    try:
        return env.verify(answer, calls)
    except Exception:  # a verifier that raises gives no verdict, not a crash of the curator
        return None


# ---------------------------------------------------------------------------- replays
@dataclass
class Replay:
    """One replay of an episode: per original step, how its result compares ("match",
    "reorder", "differ", or None where it could not be compared) and the replayed result (its
    canonical form), and the verdict on the replayed final state (None if not rebuilt)."""

    relations: list[str | None]
    values: list[str | None]
    verdict: Rubric | None
    verifier_calls: int


def canonical(value):
    """Lists sorted by their items' JSON: equal for results that differ only in order."""
    if isinstance(value, list):
        return sorted((canonical(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    return value


def canonical_text(content: str) -> str:
    try:  # observations are data: json.loads only
        return json.dumps(canonical(json.loads(content)), sort_keys=True)
    except (ValueError, RecursionError):
        return content


def relation(original: str, replayed: str) -> str:
    if original == replayed:
        return "match"
    return "reorder" if canonical_text(original) == canonical_text(replayed) else "differ"


def replay(env, task: Task, seed: int, steps: list[dict], answer: str | None, cfg) -> Replay:
    """Reset with a fresh seed and re-run the episode's calls in order. A call whose original
    result was an environment error did not run there, so it is not run here either; a call
    that fails here as an environment error is retried, and left uncompared if it still fails."""
    run = reset(env, task, seed)
    if run is None:
        return Replay([None] * len(steps), [None] * len(steps), None, 0)
    relations, values, calls, spent, intact = [], [], [], 0, True
    # Same state: the fingerprints match, or the replay started from the original's state and
    # every result so far matched up to order (a reordered list changes the fingerprint only).
    equivalent = not steps or safe_fingerprint(run) == steps[0]["fingerprint_before"]
    for s in steps:
        if s["observation_kind"] == "env_error":
            relations.append(None)
            values.append(None)
            continue
        call = ToolCall(s["tool"], json.loads(s["arguments"]))
        same_state = safe_fingerprint(run) == s["fingerprint_before"] or equivalent
        obs, made = step_retrying(run, call, cfg.retries)
        spent += made
        calls.append(call)
        if obs.kind == "env_error":  # could not run it: the state from here on is unknown
            relations.append(None)
            values.append(None)
            intact = equivalent = False
            continue
        rel = relation(s["observation"], obs.content) if same_state else None
        relations.append(rel)
        values.append(canonical_text(obs.content) if rel else None)
        equivalent = equivalent and rel in ("match", "reorder")
    verdict = safe_verify(run, answer, calls) if intact else None
    return Replay(relations, values, verdict, spent + int(intact))


def safe_fingerprint(env) -> str:
    try:
        return env.fingerprint()
    except Exception:
        return "unavailable"


def votes(replays: list[Replay], success: bool) -> tuple[dict[int, tuple[int, int]], tuple]:
    """Per compared step (agree, differ): replays whose result equals the original's (up to
    order), and the largest group of replays agreeing on one other value; and the verdict's
    (agree, differ) over the replays that rebuilt the final state."""
    steps: dict[int, tuple[int, int]] = {}
    for k in range(len(replays[0].relations) if replays else 0):
        seen = [(r.relations[k], r.values[k]) for r in replays if r.relations[k] is not None]
        if seen:
            other = Counter(v for rel, v in seen if rel == "differ")
            steps[k] = (sum(rel != "differ" for rel, _ in seen), max(other.values(), default=0))
    verdicts = [r.verdict.success for r in replays if r.verdict is not None]
    return steps, (verdicts.count(success), verdicts.count(not success))


def undecided(agree: int, differ: int, budget: int) -> bool:
    """More replays needed: no vote yet, or a disagreement before the budget is spent (a
    disagreement is rare and costly to get wrong: it gets every replay there is)."""
    return agree + differ == 0 or (differ > 0 and agree + differ < budget)


def replay_episode(env, task: Task, episode: dict, steps: list[dict], cfg) -> list[Replay]:
    """Replays until every step and the verdict are decided, at most `cfg.max_replays`. A
    success is re-verified at least twice: a false success would be banked and rewarded."""
    out: list[Replay] = []
    comparable = [k for k, s in enumerate(steps) if s["observation_kind"] != "env_error"]
    for i in range(cfg.max_replays):
        seed = fresh_seed(cfg.seed, episode["episode_id"], "replay", i)
        out.append(replay(env, task, seed, steps, answer_of(episode), cfg))
        step_votes, verdict_votes = votes(out, bool(episode["success"]))
        pending = [] if episode["success"] else pending_steps(comparable, step_votes, cfg)
        enough = sum(verdict_votes) >= (2 if episode["success"] else 1)
        if enough and not pending and not undecided(*verdict_votes, cfg.max_replays):
            break
    return out


def answer_of(episode: dict) -> str | None:
    """The episode's answer; none when it ended without one (parquet and pandas may hold that
    as NaN, which a verifier must never see)."""
    return episode["answer"] if isinstance(episode["answer"], str) else None


def pending_steps(comparable: list[int], step_votes: dict[int, tuple[int, int]], cfg) -> list[int]:
    """Steps still undecided. A step never compared after one whose original result differs
    stays uncompared (the original's state had diverged there): replaying more will not help.
    (A success is only re-verified: a flaky step did not stop it.)"""
    first_differ = min((k for k, (_, d) in step_votes.items() if d), default=float("inf"))
    return [
        k
        for k in comparable
        if undecided(*step_votes.get(k, (0, 0)), cfg.max_replays)
        and not (k > first_differ and k not in step_votes)
    ]


def share(agree: int, differ: int) -> float:
    """Confidence that the original is the odd one out: the share of replays that disagree,
    halved when a single replay is all there is."""
    n = agree + differ
    return 0.0 if n == 0 else differ / n * (1.0 if n >= 2 else 0.5)


# ---------------------------------------------------------------------------- per episode
def neighbour_stats(episodes: pd.DataFrame, catalog: pd.DataFrame) -> dict[str, dict]:
    """Per task: its samples and successes this round, and those of its graph neighbours
    (tasks of the same domain needing the same tools: design.md's within-environment edges)."""
    cat = catalog.set_index("task_id")
    key = {
        t: (cat.at[t, "domain"], tuple(cat.at[t, "tools"])) if t in cat.index else (t,)
        for t in episodes["task_id"].unique()
    }
    per_task = episodes.groupby("task_id")["success"].agg(["size", "sum"])
    per_key: dict[tuple, list[int]] = {}
    for t, row in per_task.iterrows():
        acc = per_key.setdefault(key[t], [0, 0])
        acc[0], acc[1] = acc[0] + int(row["size"]), acc[1] + int(row["sum"])
    out = {}
    for t, row in per_task.iterrows():
        n, k = int(row["size"]), int(row["sum"])
        nn, nk = per_key[key[t]][0] - n, per_key[key[t]][1] - k
        out[t] = {"samples": n, "successes": k, "neighbour_samples": nn, "neighbour_successes": nk}
    return out


def neighbour_confidence(stats: dict, min_samples: int) -> float:
    """No success in n samples while neighbours succeed at rate q: 1 - (1 - q)^n, the chance
    that a task like its neighbours would have succeeded at least once."""
    if stats["successes"] or stats["samples"] < min_samples or not stats["neighbour_samples"]:
        return 0.0
    q = stats["neighbour_successes"] / stats["neighbour_samples"]
    return 1.0 - (1.0 - q) ** stats["samples"]


def env_error_evidence(episode: dict, steps: list[dict]) -> tuple[float, dict]:
    hit = [k for k, s in enumerate(steps) if s["observation_kind"] == "env_error"]
    ended = episode["termination"] == "env_error"
    score = 1.0 if ended else ENV_ERROR_CONFIDENCE if hit else 0.0
    return score, {"steps": hit, "termination": episode["termination"]}


def replay_evidence(replays: list[Replay], episode: dict) -> tuple[dict, dict]:
    """Scores and evidence for flaky_tool and verifier from the replays."""
    success = bool(episode["success"])
    step_votes, verdict_votes = votes(replays, success)
    flaky = {k: v for k, v in step_votes.items() if v[1]}
    reordered = sorted(
        {k for r in replays for k, rel in enumerate(r.relations) if rel == "reorder"}
    )
    recorded = json.loads(episode["rubric"] or "{}")
    disagree = sorted(
        {
            c
            for r in replays
            if r.verdict is not None and r.verdict.success != success
            for c in (*SUCCESS_CRITERIA, *OPTIONAL_CRITERIA)
            if r.verdict.scores.get(c) != recorded.get(c)
        }
    )
    scores = {
        "flaky_tool": 0.0 if success else max((share(*v) for v in flaky.values()), default=0.0),
        "verifier": share(*verdict_votes),
    }
    evidence = {
        "replays": len(replays),
        "flaky_tool": {"steps": {str(k): {"agree": a, "differ": d} for k, (a, d) in flaky.items()}},
        "reordered": reordered,
        "verifier": {
            "recorded": success,
            "agree": verdict_votes[0],
            "disagree": verdict_votes[1],
            "criteria": disagree,
        },
    }
    return scores, evidence


def verdict(scores: dict[str, float], min_confidence: float) -> tuple[str, float]:
    """The most likely non-policy cause if it reaches `min_confidence`, else the policy's."""
    cause = max(CAUSES, key=lambda c: scores.get(c, 0.0))
    if scores.get(cause, 0.0) >= min_confidence:
        return cause, scores[cause]
    return "policy", 1.0 - scores.get(cause, 0.0)


# ---------------------------------------------------------------------------- the round
def attribute(
    episodes: pd.DataFrame, steps: pd.DataFrame, suite, cfg
) -> tuple[pd.DataFrame, dict[str, TaskCheck]]:
    """One row per episode (ATTRIBUTION_COLUMNS) and the task checks made on the way.
    `suite` holds `tasks` (id -> Task), `envs` (env id -> Environment) and `catalog`.
    Successes are only re-verified (a false success is the verifier's); failures get every
    check. Tasks with a verified success this round are solvable: their oracle is not replayed."""
    by_episode = {
        ep: g.sort_values("step").to_dict("records")
        for ep, g in (steps.groupby("episode_id") if len(steps) else [])
    }
    neighbours = neighbour_stats(episodes, suite.catalog)
    rows, checks, solved = {}, {}, set()
    ordered = episodes.sort_values("success", ascending=False, kind="stable")
    for episode in ordered.to_dict("records"):
        task = suite.tasks[episode["task_id"]]
        env = suite.envs[task.env_id]
        ep_steps = by_episode.get(episode["episode_id"], [])
        row = attribute_episode(env, task, episode, ep_steps, checks, solved, neighbours, cfg)
        if episode["success"] and row["cause"] == "policy":
            solved.add(task.task_id)
        rows[episode["episode_id"]] = row
    table = pd.DataFrame([rows[e] for e in episodes["episode_id"]], columns=ATTRIBUTION_COLUMNS)
    return table, checks


def attribute_episode(env, task, episode, steps, checks, solved, neighbours, cfg) -> dict:
    """Free evidence first (env errors, the task's tools), then the task's oracle check (once
    per task, cached in `checks`), then replays unless a free cause already explains it."""
    scores: dict[str, float] = {}
    evidence: dict = {}
    spent = 0
    if not episode["success"]:
        scores["env_error"], evidence["env_error"] = env_error_evidence(episode, steps)
        if task.task_id not in checks:
            checks[task.task_id] = check_task(env, task, cfg, task.task_id not in solved)
            spent += checks[task.task_id].verifier_calls
        check = checks[task.task_id]
        scores.update(check.scores())
        evidence["task"] = check.evidence()
        evidence["neighbours"] = neighbours[task.task_id]
        if not check.has_oracle:  # nothing to replay: fall back on the neighbours
            scores["unsolvable"] = neighbour_confidence(neighbours[task.task_id], cfg.min_samples)
    explained = max(scores.values(), default=0.0) >= ENV_ERROR_CONFIDENCE
    if episode["prompt_len"] and (episode["success"] or not explained or cfg.replay_explained):
        replays = replay_episode(env, task, episode, steps, cfg)
        spent += sum(r.verifier_calls for r in replays)
        replay_scores, replay_ev = replay_evidence(replays, episode)
        scores.update(replay_scores)
        evidence.update(replay_ev)
    if scores.get("stochastic", 0.0) >= cfg.min_confidence:
        # A verdict that changes between replays of a task whose outcome is luck is that luck.
        scores["stochastic"] = max(scores["stochastic"], scores.pop("verifier", 0.0))
    cause, confidence = verdict(scores, cfg.min_confidence)
    return {
        "episode_id": episode["episode_id"],
        "task_id": task.task_id,
        "env_id": task.env_id,
        "success": bool(episode["success"]),
        "cause": cause,
        "confidence": round(confidence, 4),
        "verifier_calls": spent,
        "scores": json.dumps({c: round(scores.get(c, 0.0), 4) for c in CAUSES}),
        "evidence": json.dumps(evidence, sort_keys=True),
    }
