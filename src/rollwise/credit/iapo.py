"""IAPO: each episode as a typed graph over its turns: produce (a call's own observation),
support-use (a later call's arguments or the answer reuse a value an earlier observation
produced), failed-use (a turn consumes an error or empty result; the next turn repairs it or
not), final (the answer). The GRPO trajectory advantage A is redistributed over turns by routing
weights: for A > 0 the support chain that reaches the answer, for A < 0 the failed and
failed-use turns (and an answer no observation supports); other turns keep `floor`. A turn gets
A w_k N / sum_j n_j w_j (n: tokens), so the token-weighted total stays A N. Departs from the seed
in: edges come from exact value matches (no learned influence), influence is reachability."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rollwise.credit.grpo import group_advantages
from rollwise.credit.turns import advantage_rows, calls_by_turn, per_episode, turn_table

EMPTY = ([], {}, "", None)


@dataclass
class Node:
    """One turn of the graph."""

    tokens: int
    used: set[str] = field(default_factory=set)  # values its calls' arguments (or answer) read
    produced: set[str] = field(default_factory=set)  # values its observations brought in
    failed: bool = False  # an error or empty result (or a reply that was neither call nor answer)
    final: bool = False  # the answer


def parse(text):
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def leaves(obj) -> set[str]:
    """Scalar values of a JSON document as strings (booleans and nulls carry no data)."""
    if isinstance(obj, dict):
        return set().union(*map(leaves, obj.values())) if obj else set()
    if isinstance(obj, list):
        return set().union(*map(leaves, obj)) if obj else set()
    if obj is None or isinstance(obj, bool) or str(obj).strip() == "":
        return set()
    return {str(obj).strip()}


def call_node(calls: list[dict], tokens: int) -> Node:
    node = Node(tokens)
    for c in calls:
        args, result = leaves(parse(c["arguments"])), parse(c["observation"])
        node.used |= args
        bad = c["observation_kind"] != "ok" or result in EMPTY
        bad = bad or (isinstance(result, dict) and "error" in result)
        node.failed |= bad
        node.produced |= set() if bad else leaves(result) - args  # produced, not echoed
    return node


def episode_graph(ep, turns: pd.DataFrame, calls: dict) -> list[Node]:
    nodes = []
    for t in turns.itertuples(index=False):
        turn_calls = calls.get((t.episode_id, t.span_start), [])
        if turn_calls:
            nodes.append(call_node(turn_calls, t.tokens))
        elif t.last and getattr(ep, "termination", "answer") == "answer":
            answer = str(getattr(ep, "answer", "") or "").strip()
            nodes.append(Node(t.tokens, used={answer, *answer.split()} - {""}, final=True))
        else:
            nodes.append(Node(t.tokens, failed=True))
    return nodes


def support_route(nodes: list[Node]) -> np.ndarray:
    """Turns from which support-use edges reach the answer (the answer included)."""
    on = np.array([n.final for n in nodes], bool)
    for j in range(len(nodes) - 1, -1, -1):
        on[j] |= any(on[k] and nodes[k].used & nodes[j].produced for k in range(j + 1, len(nodes)))
    return on


def blamed(nodes: list[Node]) -> np.ndarray:
    """Failed turns, and an answer that consumed a failure or that nothing observed supports."""
    seen: set[str] = set()
    out = np.zeros(len(nodes), bool)
    for k, n in enumerate(nodes):
        after_failure = k > 0 and nodes[k - 1].failed
        out[k] = n.failed or (n.final and (after_failure or not (n.used & seen)))
        seen |= n.produced
    return out


def routing_weights(nodes: list[Node], positive: bool, floor: float) -> np.ndarray:
    """floor + (1 - floor) on the route; uniform when the graph has no route of that sign."""
    route = support_route(nodes) if positive else blamed(nodes)
    if not route.any():
        return np.ones(len(nodes))
    return floor + (1.0 - floor) * route


def redistribute(a: float, nodes: list[Node], floor: float) -> np.ndarray:
    """A w_k N / sum n_j w_j: the token-weighted total of the episode stays A N."""
    n = np.array([x.tokens for x in nodes], float)  # [K]
    w = routing_weights(nodes, a > 0, floor)  # [K]
    denom = float((n * w).sum())
    return np.full(len(nodes), a) if denom == 0 else a * w * n.sum() / denom


def iapo(episodes: pd.DataFrame, steps: pd.DataFrame, cfg) -> pd.DataFrame:
    turns = turn_table(episodes, steps)
    calls = calls_by_turn(steps)
    a = per_episode(turns, episodes, group_advantages(episodes, cfg.std_norm, cfg.eps))
    out = np.zeros(len(turns))
    by_episode = turns.groupby("episode_id", sort=False).indices
    for ep in episodes.itertuples(index=False):
        rows = by_episode.get(ep.episode_id)
        if rows is None or a[rows[0]] == 0.0:
            continue
        nodes = episode_graph(ep, turns.iloc[rows], calls)
        out[rows] = redistribute(float(a[rows[0]]), nodes, cfg.iapo.floor)
    return advantage_rows(turns, out)
