"""Schedulers: EnvSched's graph, prediction and picks; each baseline's defining behaviour; the
history that carries observations from round to round; the batch loop of dynamic sampling."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from rollwise.config import ParamsError, ScheduleConfig, validate
from rollwise.schedule import SCHEDULERS
from rollwise.schedule.envsched import plan_envsched, predict
from rollwise.schedule.history import HISTORY_COLUMNS, decayed, from_state, observe, to_state
from rollwise.schedule.plan import PLAN_COLUMNS, Budget, execute_plan, plan_metrics, train_split

CFG = ScheduleConfig()
KINDS = {  # kind -> (tools, verifier): the synthetic suite's task shapes
    "city": (["get_owner"], "rubric_answer"),
    "count": (["find", "list"], "rubric_answer"),
    "status": (["find", "get_record", "list"], "rubric_answer"),
    "cancel": (["cancel", "find", "list"], "rubric_state"),
}


def catalog(n_envs: int = 6, per_kind: int = 3, kinds=tuple(KINDS), heldout: int = 1):
    """n_envs environments x kinds x per_kind tasks; the last `heldout` environments held out."""
    rows = []
    for e in range(n_envs):
        for kind in kinds:
            tools, verifier = KINDS[kind]
            for j in range(per_kind):
                rows.append({
                    "env_id": f"env{e:02d}", "task_id": f"env{e:02d}/{kind}{j}", "kind": kind,
                    "split": "heldout" if e >= n_envs - heldout else "train",
                    "tools": tools, "tables": ["owners", "records"], "verifier": verifier,
                    "n_calls": len(tools), "writes": verifier == "rubric_state",
                })  # fmt: skip
    return pd.DataFrame(rows)


def history(groups: dict[str, tuple[int, float]], round_: int = 1, samples: int = 8):
    """History rows: task -> (successes of `samples`, within-group variance); reward = success."""
    rows = [
        {"round": round_, "env_id": t.split("/")[0], "task_id": t, "samples": samples,
         "successes": s, "reward_sum": float(s), "reward_var": var, "turns": 2.0,
         "tool_calls": 2.0, "partial": 0, "timeouts": 0}
        for t, (s, var) in groups.items()
    ]  # fmt: skip
    return pd.DataFrame(rows)[HISTORY_COLUMNS]


def envsched_cfg(**kw):
    return CFG.envsched.model_copy(update=kw)


# ---------------------------------------------------------------------------- EnvSched


def test_cold_start_is_diverse_without_pilot_rollouts():
    cat = catalog(n_envs=9)  # 8 train environments x 4 kinds x 3 tasks
    plan = plan_envsched(cat, None, Budget(tasks=16, samples=8, seed=3), CFG.envsched)
    assert list(plan.columns[: len(PLAN_COLUMNS)]) == PLAN_COLUMNS
    assert len(plan) == 16 and (plan["n_samples"] == 8).all()
    assert set(plan["task_id"]) <= set(cat.loc[cat["split"] == "train", "task_id"])
    # Nothing observed: every prediction is the prior, so diversity comes from quota and penalty.
    assert np.allclose(plan["pred_var"], 0.25) and (plan["confidence"] == 0).all()
    assert plan["env_id"].iloc[:8].nunique() == 8  # first pass: one task per environment
    assert (plan["env_id"].value_counts() == 2).all()
    kinds = cat.set_index("task_id").loc[plan["task_id"], "kind"].to_numpy()
    assert pd.Series(kinds).groupby(plan["env_id"].to_numpy()).nunique().min() == 2  # no twins
    assert len(set(kinds)) == 4


def test_a_task_whose_neighbours_all_succeed_gets_low_predicted_variance():
    train = train_split(catalog(n_envs=4))

    def predicted(successes: int, var: float) -> dict[str, float]:
        """env00 observed (every task but count0, each 8 samples); the rest never."""
        seen = {f"env00/{k}{j}": (successes, var) for k in KINDS for j in range(3)}
        del seen["env00/count0"]
        parts, _ = predict(train, history(seen), Budget(8, 8, round=2), CFG.envsched)
        return dict(zip(train["task_id"], parts["pred_var"], strict=True))

    solved, mixed = predicted(8, 0.0), predicted(4, 0.25)
    assert solved["env00/count0"] < 0.25 / 4  # unseen, but every neighbour always succeeded
    assert mixed["env00/count0"] > 0.2  # unseen, neighbours split 4/8
    assert solved["env00/count1"] < min(0.03, solved["env00/count0"])  # own evidence agrees
    # Another environment hears of env00 only through cross edges, down-weighted against the prior.
    assert solved["env00/count0"] < solved["env01/count0"] < 0.25
    assert mixed["env01/count0"] == pytest.approx(0.25, abs=0.01)
    assert mixed["env00/count1"] == pytest.approx((8 * 0.25 + 0.25) / 9 * 2 / 3 + 0.25 / 3, 0.1)


def test_partial_credit_variance_is_calibrated_against_the_prior():
    """Rubric rewards vary far less than the Bernoulli bound: an unseen task must not outrank
    the observed task with the most variance just because its prior is the bound."""
    train = train_split(catalog(n_envs=4))
    seen = {f"env00/{k}{j}": (4, 0.02) for k in KINDS for j in range(3)}
    seen["env00/count1"] = (4, 0.08)
    parts, _ = predict(train, history(seen), Budget(8, 8, round=2), CFG.envsched)
    pred = dict(zip(train["task_id"], parts["pred_var"], strict=True))
    assert max(pred, key=pred.get) == "env00/count1"
    share = parts["bound_share"].iloc[0]  # (12 x 8 x ~0.025 + 2) / (12 x 8 x 0.25 + 2)
    assert share == pytest.approx((8 * (11 * 0.02 + 0.08) + 2) / (8 * 12 * 0.25 + 2))
    assert pred["env02/city0"] < 0.25 * share * 1.5


def test_quota_caps_one_environments_share():
    cat = catalog(n_envs=5)
    informative = {f"env00/{k}{j}": (4, 0.25) for k in KINDS for j in range(3)}
    dull = {f"env0{e}/{k}{j}": (8, 0.0) for e in (1, 2, 3) for k in KINDS for j in range(3)}
    cfg = envsched_cfg(max_env_share=0.25, similarity_penalty=0.0)
    plan = plan_envsched(cat, history({**informative, **dull}), Budget(8, 8, round=2), cfg)
    assert plan["env_id"].value_counts()["env00"] == 2  # would be 8 without the cap
    assert (plan["env_count"] <= plan["env_quota"]).all() and (plan["env_quota"] == 2).all()
    uncapped = plan_envsched(cat, history({**informative, **dull}), Budget(8, 8, round=2),
                             envsched_cfg(max_env_share=1.0, similarity_penalty=0.0))  # fmt: skip
    assert (uncapped["env_id"] == "env00").all()


def test_near_duplicates_are_penalized():
    cat = catalog(n_envs=2, per_kind=4, kinds=("count", "status"))  # one train environment

    def second_picks(penalty: float) -> list[pd.DataFrame]:
        cfg = envsched_cfg(max_env_share=1.0, coverage=0.0, similarity_penalty=penalty)
        return [plan_envsched(cat, None, Budget(2, 8, seed=s), cfg) for s in range(10)]

    for plan in second_picks(0.1):  # the second pick is never a twin of the first
        assert plan["task_id"].str[6:-1].nunique() == 2
        assert plan["penalty"].iloc[1] == pytest.approx(0.1 * (0.6 * 2 / 3 + 0.2 + 0.2))
    assert any(p["task_id"].str[6:-1].nunique() == 1 for p in second_picks(0.0))


def test_envsched_is_deterministic_and_explains_every_pick():
    cat = catalog(n_envs=6)
    h = history({"env00/count0": (3, 0.2), "env01/city1": (8, 0.0)})
    a = plan_envsched(cat, h, Budget(10, 8, round=2, seed=7), CFG.envsched)
    b = plan_envsched(cat.sample(frac=1, random_state=1), h.iloc[::-1], Budget(10, 8, 2, 7),
                      CFG.envsched)  # fmt: skip
    pd.testing.assert_frame_equal(a, b)  # row order of the inputs does not matter
    for col in ("pred_var", "own_var", "within_var", "cross_var", "coverage", "penalty"):
        assert col in a
    assert a["score"].to_numpy() == pytest.approx(
        (a["pred_var"] + a["coverage"] - a["penalty"]).to_numpy()
    )
    assert all("pred_var" in r and "penalty" in r and "env " in r for r in a["reason"])


def test_coverage_prefers_unobserved_environments():
    cat = catalog(n_envs=3)
    seen = {f"env00/{k}{j}": (4, 0.25) for k in KINDS for j in range(3)}
    parts, _ = predict(train_split(cat), history(seen), Budget(4, 8, round=2), CFG.envsched)
    cov = parts["coverage"].to_numpy()
    assert cov[:12].max() < cov[12:].min()  # env00 rows first (sorted task ids)


# ---------------------------------------------------------------------------- baselines


def test_random_is_uniform_over_distinct_train_tasks():
    cat = catalog(n_envs=6)
    plan = SCHEDULERS["random"](cat, None, Budget(20, 4, seed=1), None)
    assert plan["task_id"].is_unique and len(plan) == 20
    assert set(plan["task_id"]) <= set(cat.loc[cat["split"] == "train", "task_id"])
    counts = pd.concat(
        SCHEDULERS["random"](cat, None, Budget(6, 4, seed=s), None) for s in range(300)
    )["task_id"].value_counts()
    assert len(counts) == 60 and counts.between(10, 50).all()  # 30 +- 4 sd each


def test_band_keeps_tasks_whose_pass_rate_is_in_band():
    cat = catalog(n_envs=2, per_kind=1)  # 4 train tasks
    h = history({"env00/city0": (8, 0.0), "env00/count0": (4, 0.25), "env00/status0": (0, 0.0)})
    plan = SCHEDULERS["band"](cat, h, Budget(2, 8, round=2), CFG.band)
    assert list(plan["task_id"]) == ["env00/count0", "env00/cancel0"]  # in band, then untried
    assert list(plan["tier"]) == [0, 1]
    full = SCHEDULERS["band"](cat, h, Budget(4, 8, round=2), CFG.band)
    assert set(full["task_id"].iloc[2:]) == {"env00/city0", "env00/status0"}  # only if short


def test_spo_weights_favour_uncertain_tasks():
    cat = catalog(n_envs=2, per_kind=1)
    h = history({"env00/city0": (20, 0.0), "env00/count0": (10, 0.25)}, samples=20)
    draws = pd.concat(SCHEDULERS["spo"](cat, h, Budget(1, 1, round=2, seed=s), CFG.spo)
                      for s in range(400))  # fmt: skip
    p = draws.drop_duplicates("task_id").set_index("task_id")["p"]
    assert p["env00/city0"] == pytest.approx(21 / 22)  # Beta(1, 1) + 20 successes
    counts = draws["task_id"].value_counts()
    assert counts["env00/count0"] > 2 * counts["env00/city0"]
    w = np.sqrt(p * (1 - p)) + 0.05
    assert draws.drop_duplicates("task_id").set_index("task_id")["score"].to_numpy() == (
        pytest.approx(w.to_numpy())
    )


def fake_run(calls: list):
    """Episodes where tasks whose name ends in 0 get all-equal rewards, others 0 and 1."""

    def run(rows: pd.DataFrame) -> pd.DataFrame:
        calls.append(list(rows["task_id"]))
        return pd.DataFrame(
            [{"task_id": t, "reward": 0.0 if t.endswith("0") else float(k % 2)}
             for t, n in zip(rows["task_id"], rows["n_samples"], strict=True)
             for k in range(n)]
        )  # fmt: skip

    return run


def test_dapo_drops_equal_groups_and_counts_what_it_burns():
    cat = catalog(n_envs=5, per_kind=3)  # 48 train tasks, a third of them all-equal
    cfg = CFG.dapo.model_copy(update={"oversample": 1.0, "max_batches": 4})
    plan = SCHEDULERS["dapo"](cat, None, Budget(6, 4, seed=2), cfg)
    assert plan["drop_equal"].all() and plan["batch"].max() == 3 and plan["task_id"].is_unique
    calls: list = []
    executed, episodes = execute_plan(plan, fake_run(calls), target=6)
    kept = executed[executed["kept"]]
    assert (
        len(kept) == 6
        and (kept["obs_var"] > 0).all()
        and not kept["task_id"].str.endswith("0").any()
    )
    assert len(calls) == executed["batch"][executed["ran"]].nunique() < 4  # stopped once full
    m = plan_metrics(executed)
    assert m["burned_rollouts"] == 4 * (executed["ran"].sum() - 6) == len(episodes) - 24
    starved, _ = execute_plan(plan.assign(task_id=plan["task_id"].str[:-1] + "0"),
                              fake_run([]), target=6)  # fmt: skip
    assert starved["ran"].all() and not starved["kept"].any()  # max_batches, then give up


def test_static_plans_run_once_and_keep_every_group():
    cat = catalog()
    calls: list = []
    plan = SCHEDULERS["envsched"](cat, None, Budget(5, 3), CFG.envsched)
    executed, episodes = execute_plan(plan, fake_run(calls), target=5)
    assert len(calls) == 1 and executed["kept"].all() and len(episodes) == 15
    m = plan_metrics(executed)
    assert m["burned_rollouts"] == 0 and m["env_entropy"] == pytest.approx(np.log(5))


def test_every_scheduler_shares_one_signature():
    cat = catalog()
    for name, plan_fn in SCHEDULERS.items():
        plan = plan_fn(cat, None, Budget(4, 2, seed=1), getattr(CFG, name, None))
        assert list(plan.columns[: len(PLAN_COLUMNS)]) == PLAN_COLUMNS, name
        assert len(plan[plan["batch"] == 0]) == 4, name


# ---------------------------------------------------------------------------- history, metrics


def test_history_round_trips_and_decays():
    episodes = pd.DataFrame({
        "task_id": ["e/a"] * 3 + ["e/b"] * 2, "env_id": "e", "reward": [1, 0, 0.5, 1, 1],
        "success": [True, False, False, True, True], "turns": [1, 2, 3, 1, 1],
        "tool_calls": [1, 1, 4, 0, 0],
        "termination": ["answer", "max_turns", "answer", "answer", "context"],
    })  # fmt: skip
    rows = observe(episodes, 1)
    a = rows.set_index("task_id").loc["e/a"]
    assert (a["samples"], a["successes"], a["partial"], a["timeouts"]) == (3, 1, 1, 1)
    assert a["reward_var"] == pytest.approx(np.var([1, 0, 0.5]))
    state = json.loads(json.dumps(to_state(rows, round=1)))
    pd.testing.assert_frame_equal(from_state(state), rows, check_dtype=False)
    assert from_state({"round": 0, "history": {}}) is None
    two = pd.concat([rows, rows.assign(round=2)])
    st = decayed(pd.Series(["e/a", "e/z"]), two, round_=3, decay=0.5)
    assert st.loc["e/a", "n"] == pytest.approx(3 + 0.5 * 3) and st.loc["e/z", "n"] == 0


def test_predicted_variance_correlation_is_reported():
    executed = pd.DataFrame({
        "env_id": ["a", "a", "b", "c"], "n_samples": 4, "ran": True, "kept": True,
        "pred_var": [0.1, 0.2, 0.3, 0.25], "obs_var": [0.0, 0.1, 0.25, 0.2],
    })  # fmt: skip
    m = plan_metrics(executed)
    assert m["pred_var_corr"] > 0.9 and m["envs_in_batch"] == 3
    assert "pred_var_corr" not in plan_metrics(executed.assign(pred_var=0.25))


def test_method_knobs_are_validated_by_key_path():
    with pytest.raises(ParamsError, match="schedule.envsched.decy"):
        validate({"schedule": {"envsched": {"decy": 0.5}}})
    with pytest.raises(ParamsError, match="schedule.band.hi"):
        validate({"schedule": {"band": {"lo": 0.6, "hi": 0.4}}})
    with pytest.raises(ParamsError, match="schedule.spo.rho"):
        validate({"schedule": {"spo": {"rho": 0.5}}})
    assert set(SCHEDULERS) == {"random", "envsched", "band", "dapo", "spo"}


def test_quarantined_tasks_are_never_scheduled():
    from rollwise.loop import schedulable

    catalog = pd.DataFrame({"task_id": ["a/t0", "a/t1", "b/t0"], "env_id": ["a", "a", "b"]})
    quarantine = pd.DataFrame({"task_id": ["a/t1"], "cause": ["flaky_tool"]})
    assert list(schedulable(catalog, quarantine)["task_id"]) == ["a/t0", "b/t0"]
    assert len(schedulable(catalog, quarantine.iloc[:0])) == 3  # round 00: nothing quarantined
