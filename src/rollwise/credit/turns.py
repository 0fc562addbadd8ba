"""The turn table every estimator shares: one row per (episode, turn), the unit that receives an
advantage (the trainer spreads it over the turn's token span).

A step row is one tool call; a turn may hold several calls or none (an answer, an unparsable
reply). A turn's state is the environment's fingerprint when the turn began: "start" for turn 0
(every episode of a task starts from one state), else the fingerprint after the previous turn's
last call (unchanged by a turn without calls). An unavailable fingerprint (a hung call) is made
unique to its visit, so it never joins a cluster."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd

from rollwise.types import ADVANTAGE_COLUMNS

TURN_COLUMNS = [
    "episode_id", "group", "step", "depth", "span_start", "span_end", "tokens", "state",
    "action", "next_state", "last", "reward",
]  # fmt: skip
UNAVAILABLE = "unavailable"


def turn_table(episodes: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (episode, turn) in episode order, turns in order. `reward` is the episode's
    outcome on its last turn and 0 before (outcome-only rewards); `depth` equals `step`."""
    calls = calls_by_turn(steps)
    rows = []
    for ep in episodes.itertuples(index=False):
        spans = list(ep.turn_spans)
        state = "start"
        for k, (s, e) in enumerate(spans):
            turn_calls = calls.get((ep.episode_id, int(s)), [])
            last = k == len(spans) - 1
            after = turn_calls[-1]["fingerprint_after"] if turn_calls else state
            after = f"{UNAVAILABLE}:{ep.episode_id}:{k}" if after == UNAVAILABLE else after
            rows.append(
                (ep.episode_id, getattr(ep, "group", ""), k, k, int(s), int(e), int(e) - int(s),
                 state, action_key(ep, turn_calls, k, last, int(s), int(e)), after, last,
                 float(ep.reward) if last else 0.0)
            )  # fmt: skip
            state = after
    return pd.DataFrame(rows, columns=TURN_COLUMNS)


def calls_by_turn(steps: pd.DataFrame) -> dict[tuple[str, int], list[dict]]:
    """Step rows grouped by (episode, span_start of their turn), in call order."""
    out: dict[tuple[str, int], list[dict]] = {}
    if steps.empty or "span_start" not in steps:
        return out
    for row in steps.sort_values(["episode_id", "step"]).to_dict("records"):
        out.setdefault((row["episode_id"], int(row["span_start"])), []).append(row)
    return out


def action_key(ep, turn_calls: list[dict], k: int, last: bool, s: int, e: int) -> str:
    """What the turn did: its calls (tool and arguments), its answer, or its raw tokens."""
    if turn_calls:
        return json.dumps([[c["tool"], c["arguments"]] for c in turn_calls])
    if last and getattr(ep, "termination", "answer") == "answer" and hasattr(ep, "answer"):
        return f"answer:{ep.answer}"
    ids = getattr(ep, "token_ids", None)
    text = "" if ids is None else ",".join(map(str, list(ids)[s:e]))
    return "text:" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def episode_tokens(episodes: pd.DataFrame) -> np.ndarray:
    """Policy tokens per episode (the sum of its turn spans): the action-token measure."""
    return np.array([sum(e - s for s, e in spans) for spans in episodes["turn_spans"]], float)


def per_episode(turns: pd.DataFrame, episodes: pd.DataFrame, values: pd.Series) -> np.ndarray:
    """An episode-level value (indexed like `episodes`) copied to each of its turns."""
    by_id = dict(zip(episodes["episode_id"], np.asarray(values, float), strict=True))
    return turns["episode_id"].map(by_id).to_numpy(float)


def cluster_normalize(values: np.ndarray, keys: pd.Series, std_norm: bool, eps: float):
    """(v - cluster mean) [/ (cluster population std + eps)]; a singleton cluster gives 0 and an
    all-equal cluster gives exactly 0."""
    v = pd.Series(values, index=keys.index)
    by = v.groupby(keys.to_numpy())
    centred = np.array(v - by.transform("mean"), dtype=float)  # [N] (a writable copy)
    centred[by.transform("size").to_numpy() == 1] = 0.0
    if not std_norm:
        return centred
    return centred / (by.transform(lambda x: x.std(ddof=0)).to_numpy(float) + eps)


def advantage_rows(turns: pd.DataFrame, advantage: np.ndarray) -> pd.DataFrame:
    """The stage's output table (types.ADVANTAGE_COLUMNS) from per-turn values."""
    out = turns[["episode_id", "step", "span_start", "span_end"]].copy()
    out["advantage"] = np.asarray(advantage, float)
    return out[ADVANTAGE_COLUMNS].reset_index(drop=True)
