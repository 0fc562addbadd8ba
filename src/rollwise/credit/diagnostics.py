"""Value diagnostics: does an estimator's per-turn credit order and space actions the way their
true values do? Needs deterministic tasks and a reference Q for each visit (anchor state, action)
under the current policy: a Monte-Carlo mean over many continuations after that action
(`reference_q`), or the exact one where it is known (ToyChain.exact_q).

Per method (`value_report`), within each GiGPO anchor cluster (task group, state):
  value_error   || c dA - dQ || / || dQ || over visit pairs, c >= 0 the best scale (advantages are
                normalized differently per method); 0 is exact, 1 is no better than all-zero
  kendall_tau   (concordant - discordant) / comparable pairs of distinct actions, each action
                scored by its mean advantage; ties in the estimate count as neither
  advantage_var variance of the per-turn advantages
  same_action_sd spread of c A over visits of one (state, depth, action): noise, reward units
ToyChain is a chain of dependent calls whose Q is known by dynamic programming (tests, bench)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rollwise.credit.gigpo import anchor_keys

CALL, WRONG, ANSWER = 0, 1, 2


def reference_q(
    turns: pd.DataFrame, keys: pd.Series, returns: Callable[[pd.DataFrame, int], np.ndarray], n: int
) -> tuple[np.ndarray, np.ndarray]:
    """(mean, standard error) per turn of `n` continuation returns, sampled once per distinct
    key (visits with one key are one point: same state, same action, same history).
    `returns(rows, n)` gives an [len(rows), n] array of returns after each row's action."""
    first = ~keys.duplicated().to_numpy()
    samples = np.asarray(returns(turns[first], n), float)  # [K, n]
    mean = pd.Series(samples.mean(1), index=keys[first].to_numpy())
    sd = samples.std(1, ddof=1) if n > 1 else np.zeros(len(samples))  # [K]
    se = pd.Series(sd / np.sqrt(n), index=keys[first].to_numpy())
    return keys.map(mean).to_numpy(float), keys.map(se).to_numpy(float)


def cluster_pairs(clusters: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (i < j) of turns sharing an anchor cluster."""
    left, right = [], []
    for rows in clusters.groupby(clusters.to_numpy()).indices.values():
        i, j = np.triu_indices(len(rows), 1)
        left.append(rows[i])
        right.append(rows[j])
    empty = np.zeros(0, int)
    return (np.concatenate(left), np.concatenate(right)) if left else (empty, empty)


def value_report(turns: pd.DataFrame, advantage: np.ndarray, q: np.ndarray, tol: float = 1e-9):
    """The four figures above for one method's per-turn advantages against reference values."""
    a, q = np.asarray(advantage, float), np.asarray(q, float)
    clusters = anchor_keys(turns)
    i, j = cluster_pairs(clusters)
    da, dq = a[i] - a[j], q[i] - q[j]  # [P] each
    c = max(0.0, float(da @ dq) / float(da @ da)) if da @ da > 0 else 0.0
    error = float(np.sqrt(((c * da - dq) ** 2).sum() / (dq @ dq))) if dq @ dq > 0 else np.nan
    cell = clusters + "\x1f" + turns["depth"].astype(str) + "\x1f" + turns["action"].astype(str)
    spread = pd.Series(c * a).groupby(cell.to_numpy()).std(ddof=0)
    sizes = cell.value_counts()
    repeated = sizes.index[sizes > 1]
    return {
        "value_error": error,
        "kendall_tau": action_tau(clusters, turns["action"], a, q, tol),
        "advantage_var": float(a.var()) if len(a) else np.nan,
        "same_action_sd": float(spread[repeated].mean()) if len(repeated) else np.nan,
        "pairs": int(len(i)),
    }


def action_tau(clusters: pd.Series, actions: pd.Series, a: np.ndarray, q: np.ndarray, tol: float):
    """Kendall tau over pairs of distinct actions at one anchor state, pooled over states."""
    means = pd.DataFrame({"cluster": clusters.to_numpy(), "action": actions.to_numpy(),
                          "a": a, "q": q}).groupby(["cluster", "action"]).mean()  # fmt: skip
    score, pairs = 0, 0
    for _, g in means.groupby(level=0):
        i, j = np.triu_indices(len(g), 1)
        dq = g["q"].to_numpy()[i] - g["q"].to_numpy()[j]  # [P]
        da = g["a"].to_numpy()[i] - g["a"].to_numpy()[j]  # [P]
        comparable = np.abs(dq) > tol
        signs = np.sign(dq) * np.where(np.abs(da) > tol, np.sign(da), 0.0)  # +1, -1 or 0 (tie)
        score += int(signs[comparable].sum())
        pairs += int(comparable.sum())
    return score / pairs if pairs else np.nan


# ---------------------------------------------------------------------------- the toy chain
@dataclass(frozen=True)
class ToyChain:
    """A task is `length` dependent calls (call j reads the value call j-1 returned), then the
    answer (the last value). Each turn the policy calls the next tool, makes a wrong call (a tool
    error; the chain stays, retry allowed) or answers (ends the episode; reward 1 only after the
    whole chain). `policy[remaining calls, last was error]` holds P(call, wrong, answer)."""

    policy: np.ndarray  # [max_len + 1, 2, 3]
    max_turns: int = 8
    tokens: tuple[int, int, int] = (12, 10, 6)  # mean tokens of a call, a wrong call, an answer

    def probs(self, remaining: int, err: int) -> np.ndarray:
        p = self.policy[remaining, err].astype(float).copy()
        if remaining == 0:
            p[CALL] = 0.0  # nothing left to call
        return p / p.sum()

    def values(self, length: int) -> np.ndarray:
        """V[turns left, calls done, last error] under the policy, by dynamic programming."""
        v = np.zeros((self.max_turns + 1, length + 1, 2))
        for t in range(1, self.max_turns + 1):
            for i in range(length + 1):
                for e in (0, 1):
                    v[t, i, e] = self.probs(length - i, e) @ self.q_row(v, t, i, e, length)
        return v

    def q_row(self, v: np.ndarray, t: int, i: int, e: int, length: int) -> np.ndarray:
        """Q(call, wrong, answer) at (i calls done, error flag e) with t turns left."""
        call = v[t - 1, i + 1, 0] if i < length else 0.0
        return np.array([call, v[t - 1, i, 1], float(i == length)])

    def sample(self, tasks: list[tuple[str, int]], group_size: int, seed: int, version: int = 0):
        """(episodes, steps) in the pipeline's tables for G samples of each (task_id, length)."""
        rng = np.random.default_rng(seed)
        episodes, steps = [], []
        for task_id, length in tasks:
            for k in range(group_size):
                ep, st = self.episode(f"{task_id}/s{k}", task_id, length, rng, version)
                episodes.append(ep)
                steps += st
        return pd.DataFrame(episodes), pd.DataFrame(steps)

    def episode(self, episode_id: str, task_id: str, length: int, rng, version: int):
        i, e, pos, spans, steps, answer = 0, 0, 20, [], [], None
        for _ in range(self.max_turns):
            a = int(rng.choice(3, p=self.probs(length - i, e)))
            n = max(1, int(self.tokens[a] + rng.integers(-3, 4)))
            spans.append([pos, pos + n])
            if a == ANSWER:
                answer = f"{task_id}-v{i}" if i else "none"
                break
            before = f"{task_id}|{i}|{e}"
            i, e = (i + 1, 0) if a == CALL else (i, 1)
            obs = {"value": f"{task_id}-v{i}"} if a == CALL else {"error": "no such record"}
            key = f"{task_id}-v{i - 1}" if (a == CALL and i > 1) else f"{task_id}-seed"
            steps.append({
                "episode_id": episode_id, "step": len(steps), "fingerprint_before": before,
                "fingerprint_after": f"{task_id}|{i}|{e}", "tool": f"step{i + (a != CALL)}",
                "arguments": f'{{"key": "{key if a == CALL else "bogus"}"}}',
                "observation": json.dumps(obs),
                "observation_kind": "ok" if a == CALL else "tool_error",
                "span_start": pos, "span_end": pos + n,
            })  # fmt: skip
            pos += n + 5  # the observation's tokens
        success = answer is not None and i == length
        return {
            "episode_id": episode_id, "task_id": task_id, "group": task_id, "sample": 0,
            "policy_version": version, "reward": float(success), "success": success,
            "turn_spans": spans, "termination": "answer" if answer else "max_turns",
            "answer": answer, "length": length,
        }, steps  # fmt: skip

    def exact_q(self, turns: pd.DataFrame, episodes: pd.DataFrame) -> np.ndarray:
        """The true Q of each turn's action (from its state and the turns left after it)."""
        lengths = dict(zip(episodes["episode_id"], episodes["length"], strict=True))
        cache: dict[int, np.ndarray] = {}
        out = np.zeros(len(turns))
        for row, t in enumerate(turns.itertuples(index=False)):
            length = lengths[t.episode_id]
            v = cache.setdefault(length, self.values(length))
            i, e = self.parse_state(t.state)
            out[row] = self.q_row(v, self.max_turns - t.depth, i, e, length)[self.kind(t.action)]
        return out

    def continuation_returns(self, rows: pd.DataFrame, lengths: dict, n: int, seed: int):
        """[len(rows), n] sampled returns after each row's action (MC reference)."""
        rng = np.random.default_rng(seed)
        out = np.zeros((len(rows), n))
        for r, t in enumerate(rows.itertuples(index=False)):
            length = lengths[t.episode_id]
            i, e = self.parse_state(t.state)
            a = self.kind(t.action)
            for s in range(n):
                out[r, s] = self.rollout_from(i, e, a, self.max_turns - t.depth - 1, length, rng)
        return out

    def rollout_from(self, i: int, e: int, a: int, left: int, length: int, rng) -> float:
        while True:
            if a == ANSWER:
                return float(i == length)
            i, e = (i + 1, 0) if a == CALL else (i, 1)
            if left == 0:
                return 0.0
            a, left = int(rng.choice(3, p=self.probs(length - i, e))), left - 1

    @staticmethod
    def parse_state(state: str) -> tuple[int, int]:
        if state == "start":
            return 0, 0
        _, i, e = state.rsplit("|", 2)
        return int(i), int(e)

    @staticmethod
    def kind(action: str) -> int:
        if action.startswith("answer:"):
            return ANSWER
        return WRONG if "bogus" in action else CALL
