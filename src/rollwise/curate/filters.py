"""Which episodes may teach, and which tasks to stop scheduling, from the attributions.

decisions.parquet (one row per episode): episode_id, kept, reason, evidence (design.md §2),
plus cause, confidence, weight and verifier_calls. `reason` is the attributed cause ("policy"
for a failure or success the policy earned). With `action: drop` a non-policy episode is not
kept; with `weight` it is kept with weight 1 - confidence (a consumer scales its advantages by
it: `weighted_advantages`); with `keep` only the evidence is recorded.

quarantine.parquet (one row per task to skip in the next round's schedule): task_id, env_id,
cause, confidence, since_round, until_round, evidence. until_round -1 means "until a re-check
clears it": the task-level evidence (a tool not exposed, an oracle that fails) is re-checked
every round and the task released when it no longer holds. Otherwise the task's own episodes
were mostly non-policy failures; it sits out through `until_round` and is then scheduled again
so that fresh episodes can tell whether it still is. Expired entries are not written: the
scheduler skips exactly the task ids listed.
"""

from __future__ import annotations

import json

import pandas as pd

from rollwise.curate.attribution import TaskCheck, check_task

TASK_CAUSES = ("tool_not_exposed", "unsolvable", "stochastic")
QUARANTINE_COLUMNS = [
    "task_id",
    "env_id",
    "cause",
    "confidence",
    "since_round",
    "until_round",
    "evidence",
]


def decide(attributions: pd.DataFrame, cfg) -> pd.DataFrame:
    """One decision per episode, its evidence attached (the attribution's scores and evidence)."""
    non_policy = attributions["cause"] != "policy"
    if cfg.action == "drop":
        weight = (~non_policy).astype(float)
    elif cfg.action == "weight":
        weight = (1.0 - attributions["confidence"]).where(non_policy, 1.0)
    else:
        weight = pd.Series(1.0, index=attributions.index)
    evidence = [
        json.dumps({"scores": json.loads(s), **json.loads(e)}, sort_keys=True)
        for s, e in zip(attributions["scores"], attributions["evidence"], strict=True)
    ]
    return pd.DataFrame(
        {
            "episode_id": attributions["episode_id"],
            "kept": weight > 0,
            "reason": attributions["cause"],
            "evidence": evidence,
            "cause": attributions["cause"],
            "confidence": attributions["confidence"],
            "weight": weight.round(4),
            "verifier_calls": attributions["verifier_calls"],
        }
    )


def weighted_advantages(advantages: pd.DataFrame, decisions: pd.DataFrame) -> pd.DataFrame:
    """Advantages scaled by their episode's decision weight (`action: weight`), token-level
    terms (`token_advantage`) too; episodes without a decision keep theirs."""
    weight = advantages["episode_id"].map(decisions.set_index("episode_id")["weight"]).fillna(1.0)
    out = advantages.assign(advantage=advantages["advantage"] * weight)
    if "token_advantage" in out:
        out["token_advantage"] = [
            None if t is None else [float(x) * w for x in t]
            for t, w in zip(out["token_advantage"], weight, strict=True)
        ]
    return out


def quarantine(
    attributions: pd.DataFrame,
    checks: dict[str, TaskCheck],
    previous: pd.DataFrame | None,
    suite,
    r: int,
    cfg,
) -> tuple[pd.DataFrame, int]:
    """The quarantine list after round r, and the verifier calls its re-checks spent."""
    rows = {row["task_id"]: row for row in new_entries(attributions, checks, r, cfg)}
    spent = 0
    for old in [] if previous is None else previous.to_dict("records"):
        if old["task_id"] in rows:
            rows[old["task_id"]]["since_round"] = old["since_round"]
        elif old["until_round"] == -1:  # task-level evidence: does it still hold?
            task = suite.tasks[old["task_id"]]
            check = check_task(suite.envs[task.env_id], task, cfg)
            spent += check.verifier_calls
            held = {c: s for c, s in check.scores().items() if s >= cfg.min_confidence}
            if held:
                cause = max(held, key=held.get)
                rows[old["task_id"]] = {
                    **old,
                    "cause": cause,
                    "confidence": held[cause],
                    "evidence": json.dumps(check.evidence()),
                }
        elif old["until_round"] > r:
            rows[old["task_id"]] = old
    table = pd.DataFrame(list(rows.values()), columns=QUARANTINE_COLUMNS)
    return table.sort_values("task_id", ignore_index=True), spent


def new_entries(attributions: pd.DataFrame, checks: dict[str, TaskCheck], r: int, cfg) -> list:
    """Tasks whose signal this round is unreliable: task-level evidence, or a share of
    non-policy episodes of at least `quarantine_share`."""
    out = []
    for task_id, group in attributions.groupby("task_id", sort=True):
        base = {"task_id": task_id, "env_id": group["env_id"].iloc[0], "since_round": r}
        check = checks.get(task_id)
        scores = check.scores() if check else {}
        held = {c: s for c, s in scores.items() if s >= cfg.min_confidence}
        if held:
            cause = max(held, key=held.get)
            evidence = json.dumps(check.evidence())
            out.append(
                {
                    **base,
                    "cause": cause,
                    "confidence": held[cause],
                    "until_round": -1,
                    "evidence": evidence,
                }
            )
            continue
        bad = group[group["cause"] != "policy"]
        frac = len(bad) / len(group)
        if len(group) >= cfg.quarantine_min_episodes and frac >= cfg.quarantine_share:
            causes = bad["cause"].value_counts().to_dict()
            out.append(
                {
                    **base,
                    "cause": bad["cause"].mode().iloc[0],
                    "confidence": round(frac, 4),
                    "until_round": r + cfg.quarantine_rounds,
                    "evidence": json.dumps({"episodes": len(group), "causes": causes}),
                }
            )
    return out
