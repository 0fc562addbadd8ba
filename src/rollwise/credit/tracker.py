"""The persistent per-task Beta tracker behind spo and spo_pp, and the file that carries it from
round to round: credit@r writes data/advantages/round_r/credit_state.json (the tracker: task ->
alpha, beta, version and drift of its last update; drift: policy version -> KL travelled since
the warm start) and credit@r+1 reads it (round 00's, empty, comes with the warm start).

Evidence r in [0, 1] updates a <- rho a + r, b <- rho b + (1 - r); the baseline is p = a/(a+b)
before the update. rho = clip(2^(-D / d_half), rho_min, rho_max), D the policy KL between the
evidence and the tracker's last update (SPO's KL-adaptive decay)."""

from __future__ import annotations

import numpy as np
import pandas as pd

TRACKER_COLUMNS = ["task_id", "alpha", "beta", "version", "drift"]


def empty_tracker() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=float) for c in TRACKER_COLUMNS}).astype(
        {"task_id": str}
    )


def task_ids(episodes: pd.DataFrame) -> pd.Series:
    return episodes["task_id"] if "task_id" in episodes else episodes["group"]


def attach(episodes: pd.DataFrame, tracker: pd.DataFrame, drift: dict[int, float]) -> pd.DataFrame:
    """Episodes plus their task's tracker state (prior_*; NaN when never seen) and the KL
    travelled by the policy that sampled them (policy_drift): what spo and spo_pp read."""
    prior = tracker.set_index("task_id")
    tid = task_ids(episodes)
    out = episodes.copy()
    for c in ("alpha", "beta", "version", "drift"):
        out[f"prior_{c}"] = tid.map(prior[c]).astype(float).to_numpy()
    versions = out["policy_version"] if "policy_version" in out else pd.Series(0, out.index)
    out["policy_drift"] = [float(drift.get(int(v), 0.0)) for v in versions]
    return out


def decay(d: float, cfg) -> float:
    return float(np.clip(2.0 ** (-max(d, 0.0) / cfg.d_half), cfg.rho_min, cfg.rho_max))


def events(episodes: pd.DataFrame, by_version: bool) -> list[np.ndarray]:
    """Row groups applied as one update each: per arrival (SPO), or per (task, policy version)
    in version order whatever the arrival order (SPO++)."""
    if not by_version:
        return [np.array([i]) for i in range(len(episodes))]
    keys = pd.DataFrame({"task": task_ids(episodes).to_numpy(), "v": version_of(episodes)})
    keys = keys.sort_values("v", kind="stable")  # index: the original row positions
    groups = keys.groupby(["task", "v"], sort=False).indices.values()  # positions in `keys`
    return [keys.index.to_numpy()[rows] for rows in groups]


def version_of(episodes: pd.DataFrame) -> np.ndarray:
    if "policy_version" not in episodes:
        return np.zeros(len(episodes), int)
    return episodes["policy_version"].to_numpy(int)


def walk(episodes: pd.DataFrame, cfg, by_version: bool) -> tuple[np.ndarray, pd.DataFrame]:
    """(baseline p per episode, the batch tasks' posterior rows) from the prior_* columns."""
    tid, v = task_ids(episodes).to_numpy(), version_of(episodes)
    r = np.clip(episodes["reward"].to_numpy(float), 0.0, 1.0)  # [E]
    d = col(episodes, "policy_drift", 0.0)  # [E]
    prior = np.stack([col(episodes, f"prior_{c}", np.nan) for c in TRACKER_COLUMNS[1:]], 1)
    fresh = [cfg.prior_n * cfg.prior_p, cfg.prior_n * (1 - cfg.prior_p), np.nan, np.nan]
    state: dict[str, list] = {}  # task -> [alpha, beta, version, drift]
    for i in range(len(episodes)):  # the tracker file's row, else the config's prior
        state.setdefault(tid[i], fresh.copy() if np.isnan(prior[i, 0]) else list(prior[i]))
    baseline = np.zeros(len(episodes))  # [E]
    for rows in events(episodes, by_version):
        s, i = state[tid[rows[0]]], rows[0]
        baseline[rows] = s[0] / (s[0] + s[1])
        if np.isnan(s[2]):  # first evidence of this task: the prior does not decay
            keep, weight = 1.0, 1.0
        elif by_version and v[i] < s[2]:  # older policy than the tracker's: down-weight it
            keep, weight = 1.0, decay(s[3] - d[i], cfg)
        else:
            keep, weight = decay(d[i] - s[3], cfg), 1.0
        s[0] = keep * s[0] + weight * r[rows].sum()
        s[1] = keep * s[1] + weight * (1.0 - r[rows]).sum()
        if np.isnan(s[2]) or not by_version or v[i] >= s[2]:
            s[2], s[3] = float(v[i]), float(d[i])
    post = pd.DataFrame([[t, *s] for t, s in state.items()], columns=TRACKER_COLUMNS)
    return baseline, post


def col(episodes: pd.DataFrame, name: str, default: float) -> np.ndarray:
    if name not in episodes:
        return np.full(len(episodes), default)
    return episodes[name].to_numpy(float)


def next_tracker(episodes: pd.DataFrame, tracker: pd.DataFrame, cfg) -> pd.DataFrame:
    """The tracker credit@r writes: round r's evidence folded in (in SPO's arrival order under
    method spo, in policy-version order otherwise), tasks not seen this round carried over."""
    _, post = walk(episodes, cfg.spo, by_version=cfg.method != "spo")
    kept = tracker[~tracker["task_id"].isin(post["task_id"])]
    frames = [f for f in (kept, post) if len(f)]  # concat of an empty frame warns
    if not frames:
        return empty_tracker()
    return pd.concat(frames, ignore_index=True).sort_values("task_id", ignore_index=True)


def next_drift(drift: dict[int, float], version: int, previous: int, kl: float) -> dict[int, float]:
    """Cumulative policy KL per version: `version` was trained from `previous` with `kl`."""
    return {**drift, version: drift.get(previous, 0.0) + max(kl, 0.0)}


def to_json(tracker: pd.DataFrame, drift: dict[int, float], r: int) -> dict:
    rows = tracker.set_index("task_id")[TRACKER_COLUMNS[1:]]
    return {"round": r, "drift": {str(k): float(v) for k, v in sorted(drift.items())},
            "tracker": {t: [float(x) for x in row] for t, row in rows.iterrows()}}  # fmt: skip


def from_json(state: dict) -> tuple[pd.DataFrame, dict[int, float]]:
    """(tracker, drift) from credit_state.json; the warm start's has neither."""
    rows = [[t, *v] for t, v in state.get("tracker", {}).items()]
    tracker = pd.DataFrame(rows, columns=TRACKER_COLUMNS) if rows else empty_tracker()
    return tracker, {int(k): float(v) for k, v in state.get("drift", {"0": 0.0}).items()}
