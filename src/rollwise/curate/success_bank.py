"""Prior success retrieval: a bank of verified successful trajectories per task.

Only successes the curator re-verified go in (attribution cause "policy": a verdict that
flips on re-verification is the verifier's, not a success). Per task the bank keeps distinct
trajectories (same calls and answer: one entry, the newest), newest policy first, at most
`per_task`. Each round writes the whole bank (the previous round's merged with this round's
successes), so data/curated/round_NN/success_bank.parquet is self-contained and can be
published to S3 as it is (rollwise.storage).

Two uses when a task is scheduled again: its best prior success as an in-context demonstration
(`demonstration`, `with_demonstration`), and successes replayed as positive episodes in the
training batch (`positives`; off by default: they were sampled from an older policy).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd

from rollwise.curate.attribution import answer_of
from rollwise.policy.chat import action_text
from rollwise.types import ToolCall

BANK_COLUMNS = [
    "task_id",
    "env_id",
    "episode_id",
    "round",
    "policy_version",
    "reward",
    "answer",
    "trajectory",  # JSON: turns, each a list of {name, arguments, observation}
    "key",  # hash of the calls and the answer: one entry per distinct trajectory
    "tool_calls",
    "token_ids",
    "loss_mask",
    "logprobs",
    "turn_spans",
    "prompt_len",
]


def trajectory(steps: pd.DataFrame) -> list[list[dict]]:
    """An episode's calls grouped by the turn that made them, with what each returned."""
    turns: dict[int, list[dict]] = {}
    for s in steps.sort_values("step").to_dict("records"):
        call = {
            "name": s["tool"],
            "arguments": json.loads(s["arguments"]),
            "observation": s["observation"],
        }
        turns.setdefault(int(s["span_start"]), []).append(call)
    return [turns[k] for k in sorted(turns)]


def trajectory_key(turns: list[list[dict]], answer: str | None) -> str:
    calls = [[c["name"], c["arguments"]] for turn in turns for c in turn]
    blob = json.dumps([calls, (answer or "").strip().lower()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def verified_successes(
    episodes: pd.DataFrame, steps: pd.DataFrame, attributions: pd.DataFrame
) -> pd.DataFrame:
    """This round's successes that re-verification upheld, as bank rows."""
    upheld = set(
        attributions.loc[
            attributions["success"] & (attributions["cause"] == "policy"), "episode_id"
        ]
    )
    by_episode = dict(tuple(steps.groupby("episode_id"))) if len(steps) else {}
    rows = []
    for e in episodes[episodes["episode_id"].isin(upheld)].to_dict("records"):
        turns = trajectory(by_episode.get(e["episode_id"], steps.iloc[:0]))
        rows.append(
            {
                **{k: e[k] for k in ("task_id", "env_id", "episode_id", "round", "policy_version")},
                "reward": float(e["reward"]),
                "answer": answer_of(e),
                "trajectory": json.dumps(turns),
                "key": trajectory_key(turns, answer_of(e)),
                "tool_calls": int(e["tool_calls"]),
                **{k: list(e[k]) for k in ("token_ids", "loss_mask", "logprobs", "turn_spans")},
                "prompt_len": int(e["prompt_len"]),
            }
        )
    return pd.DataFrame(rows, columns=BANK_COLUMNS)


def update(previous: pd.DataFrame | None, new: pd.DataFrame, per_task: int) -> pd.DataFrame:
    """Merge, keep the newest of each distinct trajectory, newest policy first, cap per task."""
    parts = [p for p in (previous, new) if p is not None and len(p)]
    if not parts:
        return pd.DataFrame(columns=BANK_COLUMNS)
    bank = pd.concat(parts, ignore_index=True)[BANK_COLUMNS]
    bank = bank.sort_values(
        ["task_id", "policy_version", "round", "reward", "tool_calls", "episode_id"],
        ascending=[True, False, False, False, True, True],
    )
    bank = bank.drop_duplicates(["task_id", "key"], keep="first")
    return bank.groupby("task_id", sort=False).head(per_task).reset_index(drop=True)


def best(bank: pd.DataFrame, task_id: str) -> dict | None:
    """The task's best prior success: highest reward, fewest calls, newest policy."""
    rows = bank[bank["task_id"] == task_id]
    if rows.empty:
        return None
    rows = rows.sort_values(
        ["reward", "tool_calls", "policy_version"], ascending=[False, True, False], kind="stable"
    )
    return rows.iloc[0].to_dict()


def demonstration(entry: dict, prompt: str) -> list[dict]:
    """A prior success as chat messages: the task, each turn's calls and results, the answer
    (the same format the policy is trained to produce)."""
    messages = [{"role": "user", "content": prompt}]
    for turn in json.loads(entry["trajectory"]):
        calls = [ToolCall(c["name"], c["arguments"]) for c in turn]
        messages.append({"role": "assistant", "content": action_text(calls)[: -len("<|im_end|>")]})
        messages += [{"role": "tool", "content": c["observation"]} for c in turn]
    messages.append({"role": "assistant", "content": entry["answer"] or ""})
    return messages


def with_demonstration(messages: list[dict], demo: list[dict]) -> list[dict]:
    """The opening messages with a demonstration between the system prompt and the task."""
    head = [m for m in messages if m["role"] == "system"]
    return head + demo + [m for m in messages if m["role"] != "system"]


def positives(bank: pd.DataFrame, task_ids: list[str], per_task: int, r: int) -> pd.DataFrame:
    """Banked successes of the given tasks as episode rows for the training batch (grouped
    with their task, reward as recorded); ids are prefixed `bank/`."""
    rows = bank[bank["task_id"].isin(task_ids)].groupby("task_id", sort=False).head(per_task)
    return pd.DataFrame(
        {
            "episode_id": "bank/" + rows["episode_id"],
            "round": r,
            "env_id": rows["env_id"],
            "task_id": rows["task_id"],
            "group": rows["task_id"],
            "policy_version": rows["policy_version"],
            "token_ids": rows["token_ids"],
            "logprobs": rows["logprobs"],
            "loss_mask": rows["loss_mask"],
            "turn_spans": rows["turn_spans"],
            "prompt_len": rows["prompt_len"],
            "answer": rows["answer"],
            "reward": rows["reward"],
            "success": True,
        }
    ).reset_index(drop=True)


def load(path: Path) -> pd.DataFrame | None:
    """A bank file, or None if there is none (the first round)."""
    return pd.read_parquet(path) if Path(path).exists() else None


def publish(path: Path, url: str) -> list[str]:
    """Upload a bank file to s3:// `url` (manifest last; rollwise.storage)."""
    from rollwise.storage import publish as s3_publish

    return s3_publish(path, url)
