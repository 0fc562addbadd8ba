"""The skill bank as a table (one row per skill, written per round like the success bank) and
the evidence that keeps or drops each skill.

Pathways (`induced`): every entry of the curator's success bank induces a skill (pathway
"success"); a success of a task that failed in an earlier round, a repaired failure, is marked
"repair". Evidence is per policy version: {version: [invocations, successes]}, read from the
round's episodes (`invocations`: the skill calls in the policy's own turns; one succeeds when
its expansion ran without an error and the episode succeeded). `review` weighs each version by
decay^(versions behind the newest) with a Beta(1, 1) prior; a skill with enough weighted
evidence is demoted below `demote_below`, retired below `retire_below` (it may recover from
demoted, never from retired), and retired after `idle_rounds` rounds without an invocation.
Mode "append", the variant for comparison, never demotes or retires.
"""

from __future__ import annotations

import json

import pandas as pd

from rollwise.memory.skills import SKILL_PREFIX, Skill, SkillConfig, induce
from rollwise.policy.chat import parse_action
from rollwise.types import ToolCall

SKILL_COLUMNS = ["skill_id", "env_id", "name", "params", "steps", "example", "pathway",
                 "source_episode", "round", "status", "evidence", "last_used"]  # fmt: skip
INVOCATION_COLUMNS = ["episode_id", "env_id", "task_id", "policy_version", "skill", "ok",
                      "success"]  # fmt: skip


def empty() -> pd.DataFrame:
    return pd.DataFrame(columns=SKILL_COLUMNS)


def skill_of(row: dict) -> Skill:
    return Skill(row["env_id"], json.loads(row["params"]), json.loads(row["steps"]),
                 json.loads(row["example"]))  # fmt: skip


def row_of(skill: Skill, pathway: str, episode_id: str, r: int) -> dict:
    return {"skill_id": skill.skill_id, "env_id": skill.env_id, "name": skill.name,
            "params": json.dumps(skill.params), "steps": json.dumps(skill.steps),
            "example": json.dumps(skill.example, default=str), "pathway": pathway,
            "source_episode": episode_id, "round": r, "status": "active", "evidence": "{}",
            "last_used": r}  # fmt: skip


def trajectory_calls(trajectory: str) -> list[tuple[ToolCall, str]]:
    """A banked trajectory (success_bank.trajectory, JSON) as (call, recorded result) pairs."""
    turns = json.loads(trajectory)
    return [(ToolCall(c["name"], c["arguments"]), c["observation"]) for t in turns for c in t]


def repaired(success_bank: pd.DataFrame, history: pd.DataFrame) -> set[str]:
    """Banked successes of tasks that failed in an earlier round: the repaired failures.
    `history` is the scheduler's (a row per task group a round: samples, successes) or a row
    per episode (success)."""
    if "samples" in history:
        failed = history[history["successes"] < history["samples"]]
    else:
        failed = history[~history["success"].astype(bool)]
    first_fail = failed.groupby("task_id")["round"].min()
    later = success_bank["round"] > success_bank["task_id"].map(first_fail).fillna(float("inf"))
    return set(success_bank.loc[later, "episode_id"])


def induced(success_bank: pd.DataFrame, history: pd.DataFrame | None, r: int) -> pd.DataFrame:
    """One skill per banked success (the same procedure twice: one row, the first)."""
    fixes = repaired(success_bank, history) if history is not None and len(history) else set()
    rows = []
    for e in success_bank.to_dict("records"):
        calls = trajectory_calls(e["trajectory"])
        if calls:
            pathway = "repair" if e["episode_id"] in fixes else "success"
            rows.append(row_of(induce(e["env_id"], calls), pathway, e["episode_id"], r))
    return pd.DataFrame(rows, columns=SKILL_COLUMNS).drop_duplicates("skill_id")


def add(bank: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """The bank with the skills it lacks appended; a known skill keeps its row (and status)."""
    fresh = new[~new["skill_id"].isin(set(bank["skill_id"]))].drop_duplicates("skill_id")
    parts = [p for p in (bank, fresh) if len(p)]
    return pd.concat(parts, ignore_index=True)[SKILL_COLUMNS] if parts else empty()


def invocations(episodes: pd.DataFrame, steps: pd.DataFrame, tokenizer) -> pd.DataFrame:
    """Every skill call in the policy's turns: did its expansion run clean (its turn's recorded
    steps all ok), did the episode succeed."""
    kinds = steps.groupby(["episode_id", "span_start"])["observation_kind"].agg(list).to_dict()
    rows = []
    for e in episodes.to_dict("records"):
        for start, end in e["turn_spans"]:
            text = tokenizer.decode(list(e["token_ids"][start:end]), skip_special_tokens=False)
            for call in parse_action(text, tokenizer.eos_token).calls:
                if str(call.name).startswith(SKILL_PREFIX):
                    seen = kinds.get((e["episode_id"], start), [])
                    ok = bool(seen) and all(k == "ok" for k in seen)
                    rows.append([e["episode_id"], e["env_id"], e["task_id"], e["policy_version"],
                                 call.name, ok, ok and bool(e["success"])])  # fmt: skip
    return pd.DataFrame(rows, columns=INVOCATION_COLUMNS)


def record(bank: pd.DataFrame, calls: pd.DataFrame, r: int) -> pd.DataFrame:
    """The bank with this round's invocations added to each skill's evidence."""
    bank = bank.copy()
    for (env_id, name), group in calls.groupby(["env_id", "skill"]):
        hit = (bank["env_id"] == env_id) & (bank["name"] == name)
        for i in bank.index[hit]:
            evidence = json.loads(bank.at[i, "evidence"])
            for version, g in group.groupby("policy_version"):
                n, s = evidence.get(str(version), [0, 0])
                evidence[str(version)] = [n + len(g), s + int(g["success"].sum())]
            bank.at[i, "evidence"], bank.at[i, "last_used"] = json.dumps(evidence), r
    return bank


def weighted(evidence: dict, current: int, decay: float) -> tuple[float, float]:
    """(decayed invocations, decayed success rate with a Beta(1, 1) prior)."""
    n = s = 0.0
    for version, (calls, wins) in evidence.items():
        w = decay ** max(0, current - int(version))
        n, s = n + w * calls, s + w * wins
    return n, (s + 1) / (n + 2)


def status(row: dict, r: int, current: int, cfg: SkillConfig) -> str:
    if row["status"] == "retired" or cfg.mode == "append":
        return row["status"]
    if r - int(row["last_used"]) >= cfg.idle_rounds:
        return "retired"
    n, rate = weighted(json.loads(row["evidence"]), current, cfg.decay)
    if n < cfg.min_evidence:
        return row["status"]
    if rate < cfg.retire_below:
        return "retired"
    return "demoted" if rate < cfg.demote_below else "active"


def review(bank: pd.DataFrame, r: int, current: int, cfg: SkillConfig) -> pd.DataFrame:
    """Each skill's status after round r's evidence, `current` the newest policy version."""
    out = bank.copy()
    out["status"] = [status(row, r, current, cfg) for row in bank.to_dict("records")]
    return out


def exposed(bank: pd.DataFrame, env_id: str, cfg: SkillConfig) -> list[Skill]:
    """The skills an episode of `env_id` sees: active first, then demoted, at most `per_env`."""
    rows = bank[(bank["env_id"] == env_id) & (bank["status"] != "retired")]
    rows = rows.assign(rank=rows["status"].map({"active": 0, "demoted": 1}))
    rows = rows.sort_values(["rank", "round", "skill_id"], kind="stable").head(cfg.per_env)
    return [skill_of(row) for row in rows.to_dict("records")]


def update(
    bank: pd.DataFrame, success_bank: pd.DataFrame, history: pd.DataFrame | None,
    calls: pd.DataFrame, r: int, current: int, cfg: SkillConfig,
) -> pd.DataFrame:  # fmt: skip
    """Round r's bank: last round's with this round's evidence, reviewed, plus the skills the
    success bank induces that it lacks (new skills start active, their evidence ahead)."""
    reviewed = review(record(bank, calls, r), r, current, cfg) if len(bank) else empty()
    return add(reviewed, induced(success_bank, history, r))
