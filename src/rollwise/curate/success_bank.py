"""Prior success retrieval: a bank of verified successful trajectories per task.

Only successes the curator re-verified go in (attribution cause "policy": a verdict that
flips on re-verification is the verifier's, not a success). Per task the bank keeps distinct
trajectories (same calls and answer: one entry, the newest), newest policy first, at most
`per_task`. Each round writes the whole bank (the previous round's merged with this round's
successes), so data/curated/round_NN/success_bank.parquet is self-contained and can be
published to S3 as it is (rollwise.storage).

Two uses when a task is scheduled again: its best prior success as an in-context demonstration
(`demonstrations`, `Demonstrated`: params `curate.demonstrations`, read by rollout@r from the
bank of round r-1), and successes replayed as positive episodes in the training batch
(`positives`, `positive_steps`; `curate.replay_positives`, off by default: they were sampled from
an older policy, so they carry that policy's log-probs for PPO's ratio, see tasks/credit.py).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rollwise.curate.attribution import answer_of
from rollwise.policy.chat import calls_text, prompt_ids
from rollwise.types import STEP_COLUMNS, Task, ToolCall

REPLAY_PREFIX = "bank/"  # episode ids of replayed positives
# A banked call keeps its step row (less the episode id) so a replay can rebuild it.
STEP_FIELDS = [c for c in STEP_COLUMNS if c not in ("episode_id", "tool", "arguments",
                                                    "observation")]  # fmt: skip

BANK_COLUMNS = [
    "task_id",
    "env_id",
    "episode_id",
    "round",
    "policy_version",
    "reward",
    "answer",
    "trajectory",  # JSON: turns, each a list of {name, arguments, observation, STEP_FIELDS}
    "key",  # hash of the calls and the answer: one entry per distinct trajectory
    "tool_calls",
    "token_ids",
    "loss_mask",
    "logprobs",
    "turn_spans",
    "prompt_len",
]


def trajectory(steps: pd.DataFrame) -> list[list[dict]]:
    """An episode's calls grouped by the turn that made them, with what each returned (and the
    rest of its step row: states and token span, for replaying it as a positive)."""
    turns: dict[int, list[dict]] = {}
    for s in steps.sort_values("step").to_dict("records"):
        call = {
            "name": s["tool"],
            "arguments": json.loads(s["arguments"]),
            "observation": s["observation"],
            **{k: s[k] for k in STEP_FIELDS},
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
        messages.append({"role": "assistant", "content": calls_text(calls)})
        messages += [{"role": "tool", "content": c["observation"]} for c in turn]
    messages.append({"role": "assistant", "content": entry["answer"] or ""})
    return messages


def with_demonstration(messages: list[dict], demo: list[dict]) -> list[dict]:
    """The opening messages with a demonstration between the system prompt and the task."""
    head = [m for m in messages if m["role"] == "system"]
    return head + demo + [m for m in messages if m["role"] != "system"]


@dataclass
class Demonstrated:
    """An episode's environment whose opening messages carry a demonstration; everything else
    (tools, step, fingerprint, verify, audit) is the wrapped environment's."""

    env: object
    demo: list[dict]

    def reset(self, task: Task, seed: int) -> list[dict]:
        return with_demonstration(self.env.reset(task, seed), self.demo)

    def __getattr__(self, name: str):
        if name in ("env", "demo"):  # not set yet (copy/pickle): never recurse
            raise AttributeError(name)
        return getattr(self.env, name)


def demonstrations(
    bank: pd.DataFrame, tasks: list[Task], envs: dict, tokenizer, max_context: int, reply: int
) -> tuple[dict[str, list[dict]], list[str]]:
    """Per task id with a banked success, its best one as demonstration messages, if the
    opening prompt with it leaves room for one full reply (`reply` tokens) within
    `max_context`; and the task ids whose demonstration was skipped because it would not."""
    demos, skipped = {}, []
    for task in tasks:
        entry = best(bank, task.task_id)
        if entry is None:
            continue
        env = copy.copy(envs[task.env_id])  # reset builds the episode's state on the copy
        demo = demonstration(entry, task.prompt)
        messages = with_demonstration(env.reset(task, 0), demo)
        if len(prompt_ids(tokenizer, messages, env.tools())) + reply > max_context:
            skipped.append(task.task_id)
        else:
            demos[task.task_id] = demo
    return demos, skipped


def positives(bank: pd.DataFrame, task_ids: list[str], per_task: int, r: int) -> pd.DataFrame:
    """Banked successes of the given tasks as episode rows for the training batch (grouped
    with their task, reward and rollout log-probs as recorded); ids are prefixed `bank/`."""
    rows = bank[bank["task_id"].isin(task_ids)].groupby("task_id", sort=False).head(per_task)
    return pd.DataFrame(
        {
            "episode_id": REPLAY_PREFIX + rows["episode_id"],
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
            "termination": "answer",  # verified successes answered
            "trajectory": rows["trajectory"],
        }
    ).reset_index(drop=True)


def positive_steps(positives: pd.DataFrame) -> pd.DataFrame:
    """The step rows (STEP_COLUMNS) of replayed positives, rebuilt from their banked
    trajectories, so that step-level credit (gigpo, concal, iapo) sees their calls and states."""
    rows = [
        {"episode_id": eid, "tool": c["name"], "arguments": json.dumps(c["arguments"], default=str),
         "observation": c["observation"], **{k: c[k] for k in STEP_FIELDS}}
        for eid, turns in zip(positives["episode_id"], positives["trajectory"], strict=True)
        for turn in json.loads(turns)
        for c in turn
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def load(path: Path) -> pd.DataFrame | None:
    """A bank file, or None if there is none (the first round)."""
    return pd.read_parquet(path) if Path(path).exists() else None


def publish(path: Path, url: str) -> list[str]:
    """Upload a bank file to s3:// `url` (manifest last; rollwise.storage)."""
    from rollwise.storage import publish as s3_publish

    return s3_publish(path, url)
