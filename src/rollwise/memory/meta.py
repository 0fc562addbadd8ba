"""The meta-agent (Recuris-style): a fixed, rule-based updater of the skill memory, gated by
validation.

It reads a round's evidence (episodes, steps, skill invocations: memory/bank.py) and localizes
each failed episode, first rule that holds:
  stale_skill       a skill it invoked did not run clean (a step failed or a slot was unbound)
  wrong_skill       it invoked skills that ran clean, and still failed
  progress_misread  without skills, it repeated a call that had already succeeded, or passed
                    an id that earlier results offered other values for but never this one
  missing_skill     otherwise: no skill was there to use
Each cause proposes one local update: retire the stale skill, demote the wrong one, and for a
missing skill or a misread progress add the skill induced from the task's banked success (when
the curator's success bank has one and the skill bank lacks it). An update is kept only if the
held-aside validation batch (`validate(bank) -> success rate`) strictly improves on the bank it
would replace; updates are tried one at a time, each against the bank as it stands.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from rollwise.memory.bank import SKILL_COLUMNS, row_of, trajectory_calls
from rollwise.memory.skills import induce
from rollwise.memory.working import Progress, call_text, fold, is_id
from rollwise.types import Observation, ToolCall

CAUSES = ("stale_skill", "wrong_skill", "progress_misread", "missing_skill")
DIAGNOSIS_COLUMNS = ["episode_id", "env_id", "task_id", "cause", "skill"]
GATE_COLUMNS = ["action", "skill_id", "cause", "before", "after", "kept"]


@dataclass(frozen=True)
class Update:
    action: str  # "retire", "demote" or "add"
    skill_id: str
    cause: str
    row: dict | None = None  # the skill row an "add" appends


def misread(steps: list[dict]) -> bool:
    """A repeated successful call, or an id argument that earlier results offered other values
    for but never this one (working memory's state, folded step by step)."""
    state = Progress()
    for s in sorted(steps, key=lambda s: s["step"]):
        call = ToolCall(s["tool"], json.loads(s["arguments"]))
        text = call_text(call)
        offered = [(k, v) for k, v in call.arguments.items() if is_id(k) and state.found.get(k)]
        if text in state.done or any(v not in state.found[k] for k, v in offered):
            return True
        state = fold(state, call, Observation(s["observation"], s["observation_kind"]), [])
    return False


def localize(episodes: pd.DataFrame, steps: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """One diagnosis per failed episode (DIAGNOSIS_COLUMNS)."""
    by_episode = {k: g.to_dict("records") for k, g in steps.groupby("episode_id")}
    used = {k: g for k, g in calls.groupby("episode_id")}
    rows = []
    for e in episodes[~episodes["success"].astype(bool)].to_dict("records"):
        inv = used.get(e["episode_id"])
        if inv is not None and not inv["ok"].all():
            cause, skill = "stale_skill", inv.loc[~inv["ok"], "skill"].iloc[0]
        elif inv is not None:
            cause, skill = "wrong_skill", inv["skill"].iloc[0]
        elif misread(by_episode.get(e["episode_id"], [])):
            cause, skill = "progress_misread", None
        else:
            cause, skill = "missing_skill", None
        rows.append([e["episode_id"], e["env_id"], e["task_id"], cause, skill])
    return pd.DataFrame(rows, columns=DIAGNOSIS_COLUMNS)


def propose(diagnoses: pd.DataFrame, bank: pd.DataFrame, success_bank: pd.DataFrame,
            r: int) -> list[Update]:  # fmt: skip
    """The local updates the diagnoses call for, each once."""
    ids = {(row["env_id"], row["name"]): row["skill_id"] for row in bank.to_dict("records")}
    out: dict[tuple, Update] = {}
    for d in diagnoses.to_dict("records"):
        if d["cause"] in ("stale_skill", "wrong_skill") and (d["env_id"], d["skill"]) in ids:
            action = "retire" if d["cause"] == "stale_skill" else "demote"
            sid = ids[(d["env_id"], d["skill"])]
            out.setdefault((action, sid), Update(action, sid, d["cause"]))
            continue
        banked = success_bank[success_bank["task_id"] == d["task_id"]]
        for e in banked.head(1).to_dict("records"):
            skill = induce(e["env_id"], trajectory_calls(e["trajectory"]))
            if skill.steps and skill.skill_id not in set(bank["skill_id"]):
                row = row_of(skill, "success", e["episode_id"], r)
                add = Update("add", skill.skill_id, d["cause"], row)
                out.setdefault(("add", skill.skill_id), add)
    return list(out.values())


def apply(bank: pd.DataFrame, update: Update) -> pd.DataFrame:
    """The bank with one update made (a new table; the given one is left as it was)."""
    if update.action == "add":
        return pd.concat([bank, pd.DataFrame([update.row])], ignore_index=True)[SKILL_COLUMNS]
    out = bank.copy()
    status = {"retire": "retired", "demote": "demoted"}[update.action]
    out.loc[out["skill_id"] == update.skill_id, "status"] = status
    return out


def gate(
    bank: pd.DataFrame, updates: list[Update], validate: Callable[[pd.DataFrame], float],
    min_gain: float = 0.0,
) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """(the bank with the updates validation kept, one log row per update tried)."""
    best, log = validate(bank), []
    for u in updates:
        candidate = apply(bank, u)
        score = validate(candidate)
        kept = score > best + min_gain
        log.append([u.action, u.skill_id, u.cause, best, score, kept])
        if kept:
            bank, best = candidate, score
    return bank, pd.DataFrame(log, columns=GATE_COLUMNS)
