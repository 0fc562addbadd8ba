"""GEPA-Curator: every non-policy cause is found on a constructed episode, genuine policy
failures are kept, the curator never reads the audit table, and the filters and the success
bank do what their docstrings say.

Episodes are scripted (no model): a fixed list of calls run through the real runtime, then an
answer. The audit rows are read here, by the tests, only to pick cases with a known fault."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from rollwise.config import CurateConfig, FaultsConfig, Params, rounds_dict
from rollwise.curate import success_bank
from rollwise.curate.attribution import attribute, neighbour_confidence, neighbour_stats
from rollwise.curate.filters import decide, quarantine, weighted_advantages
from rollwise.envs import faults
from rollwise.envs.runtime import SyntheticEnv, load_suite
from rollwise.loop import RoundState, curate
from rollwise.rollout.engine import clone_env
from rollwise.types import DECISION_COLUMNS, ToolCall
from tests.helpers import SMALL_ENVS, make_suite

CFG = CurateConfig()
# Noisy on purpose: replays and oracle checks meet faults too, and must still decide right.
KNOBS = dict(flaky_p=0.3, flaky_wrong=0.5, verifier_flip_q=0.2, unsolvable_frac=0.2,
             stochastic_p=0.5)  # fmt: skip
FLIP_ONLY = {"verdict_flip", "stochastic"}  # a verdict flip (list orders change no answer)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    out = tmp_path_factory.mktemp("faulty")
    make_suite(out, SMALL_ENVS.model_copy(update={"faults": FaultsConfig(**KNOBS)}))
    audit = pd.read_parquet(out / faults.AUDIT_FILE)
    return out, load_suite(out), set(audit.loc[audit["unsolvable"], "task_id"])


def run_script(suite, task, seed: int, calls, answer, eid: str | None = None):
    """(episode row, step rows, audit rows) of a scripted episode, in the engine's format;
    `answer` is a string or a function of the observations."""
    env = clone_env(suite.envs[task.env_id])
    env.reset(task, seed)
    steps, seen = [], []
    for i, call in enumerate(calls):
        before = env.fingerprint()
        obs = env.step(call)
        seen.append(obs)
        steps.append({"episode_id": None, "step": i, "fingerprint_before": before,
                      "fingerprint_after": env.fingerprint(), "tool": call.name,
                      "arguments": json.dumps(call.arguments), "observation": obs.content,
                      "observation_kind": obs.kind, "span_start": 10 * i + 5,
                      "span_end": 10 * i + 9})  # fmt: skip
    text = answer(seen) if callable(answer) else answer
    rubric = env.verify(text, list(calls))
    eid = eid or f"r01/{task.task_id}/s{seed}"
    for s in steps:
        s["episode_id"] = eid
    n = 10 * len(calls) + 9
    episode = {"episode_id": eid, "round": 1, "env_id": task.env_id, "task_id": task.task_id,
               "group": task.task_id, "sample": seed, "policy_version": 0, "seed": seed,
               "token_ids": list(range(n)), "logprobs": [0.0] * n, "loss_mask": [1] * n,
               "turn_spans": [[10 * i + 5, 10 * i + 9] for i in range(len(calls) + 1)],
               "prompt_len": 5, "answer": text, "reward": rubric.reward,
               "success": rubric.success, "rubric": json.dumps(rubric.scores),
               "termination": "answer", "turns": len(calls) + 1, "tool_calls": len(calls),
               "tool_errors": sum(o.kind == "tool_error" for o in seen),
               "env_errors": sum(o.kind == "env_error" for o in seen)}  # fmt: skip
    return episode, steps, env.audit


def frames(cases) -> tuple[pd.DataFrame, pd.DataFrame]:
    return pd.DataFrame([c[0] for c in cases]), pd.DataFrame([s for c in cases for s in c[1]])


def city(observations) -> str:
    """A reader policy: answers with the city in the last result (or nothing)."""
    value = json.loads(observations[-1].content)
    return value.get("city", "") if isinstance(value, dict) else ""


def find(suite, tasks, calls_of, answer, want, seeds=range(400)):
    """The first scripted episode (over tasks and seeds) whose (episode, faults, audit)
    satisfies `want`; `answer` is a string, a function of the observations, or "oracle"."""
    for task in tasks:
        for seed in seeds:
            text = task.answer if answer == "oracle" else answer
            case = run_script(suite, task, seed, calls_of(task), text)
            if want(case[0], [a["fault"] for a in case[2]], case[2]):
                return case
    raise AssertionError("no such case")


def one(suite, cases, cfg=CFG) -> dict:
    episodes, steps = frames(cases)
    table, _ = attribute(episodes, steps, suite, cfg)
    return table.set_index("episode_id").loc[cases[0][0]["episode_id"]].to_dict()


def solvable(suite, unsolvable, kind):
    return [t for t in suite.tasks.values() if t.kind == kind and t.task_id not in unsolvable]


def oracle(task):
    return list(task.oracle)


# ---------------------------------------------------------------------------- each cause
def test_environment_error(faulty):
    _, suite, bad = faulty
    case = find(suite, solvable(suite, bad, "city_by_id"), oracle, city,
                lambda e, f, a: f == ["flaky_error"] and not e["success"])  # fmt: skip
    row = one(suite, [case])
    assert row["cause"] == "env_error" and row["confidence"] >= 0.9
    assert json.loads(row["evidence"])["env_error"]["steps"] == [0]


def test_flaky_tool_found_by_replay(faulty):
    _, suite, bad = faulty
    case = find(suite, solvable(suite, bad, "city_by_id"), oracle, city,
                lambda e, f, a: f == ["flaky_wrong"] and not e["success"])  # fmt: skip
    row = one(suite, [case])
    assert row["cause"] == "flaky_tool" and row["confidence"] >= CFG.min_confidence
    votes = json.loads(row["evidence"])["flaky_tool"]["steps"]["0"]
    assert votes["differ"] >= 2 and votes["differ"] > votes["agree"]
    assert row["verifier_calls"] >= 2 * 2  # at least two replays of one call plus verdicts
    # Compared only on the same state: a replay that starts elsewhere proves nothing.
    moved = (case[0], [{**case[1][0], "fingerprint_before": "elsewhere"}], case[2])
    row = one(suite, [moved])
    assert row["cause"] == "policy" and json.loads(row["evidence"])["flaky_tool"]["steps"] == {}


def test_verifier_flip_false_failure(faulty):
    _, suite, bad = faulty
    case = find(
        suite,
        solvable(suite, bad, "status"),
        oracle,
        "oracle",
        lambda e, f, a: "verdict_flip" in f and set(f) <= FLIP_ONLY and not e["success"],
    )
    row = one(suite, [case])
    assert row["cause"] == "verifier"
    assert "answer_correct" in json.loads(row["evidence"])["verifier"]["criteria"]


def test_verifier_flip_false_success_is_dropped_and_not_banked(faulty):
    _, suite, bad = faulty
    case = find(
        suite,
        solvable(suite, bad, "status"),
        oracle,
        "nonsense",
        lambda e, f, a: "verdict_flip" in f and set(f) <= FLIP_ONLY and e["success"],
    )
    episodes, steps = frames([case])
    table, _ = attribute(episodes, steps, suite, CFG)
    assert table.loc[0, "cause"] == "verifier" and table.loc[0, "success"]
    assert not decide(table, CFG).loc[0, "kept"]
    assert success_bank.verified_successes(episodes, steps, table).empty


def test_tool_not_exposed(faulty):
    _, suite, bad = faulty
    task = suite.tasks[sorted(bad)[0]]
    case = run_script(suite, task, 1, oracle(task), "unknown")
    row = one(suite, [case])
    assert row["cause"] == "tool_not_exposed" and row["confidence"] == 1.0
    missing = json.loads(row["evidence"])["task"]["missing_tools"]
    assert len(missing) == 1 and missing[0] in {c.name for c in task.oracle}
    assert json.loads(row["evidence"]).get("replays") is None  # explained: no replay spent


def test_unsolvable_task_oracle_fails(faulty):
    _, suite, bad = faulty
    suite = copy.copy(suite)
    real = solvable(suite, bad, "city_by_id")[0]
    gone = ToolCall(real.oracle[0].name, {k: 0 for k in real.oracle[0].arguments})
    task = dataclasses.replace(real, task_id=real.task_id + "x", oracle=(gone,))  # no such id
    suite.tasks = {**suite.tasks, task.task_id: task}
    case = run_script(suite, task, 3, oracle(real), "nowhere")
    row = one(suite, [case])
    assert row["cause"] == "unsolvable" and row["confidence"] == 1.0
    passes = json.loads(row["evidence"])["task"]["oracle_passes"]
    assert passes and not any(passes)


class CoinEnv(SyntheticEnv):
    """A cancel that, on about 80% of seeds, answers as if it ran but does nothing."""

    def _cancel(self, rid: int) -> dict:
        if faults.draw("coin", self.seed) < 0.2:
            return super()._cancel(rid)
        return {f"{self.domain.record}_id": rid, "status": "cancelled"}


def test_stochastic_task(tmp_path: Path):
    make_suite(tmp_path)
    suite = load_suite(tmp_path)
    task = next(t for t in suite.tasks.values() if t.kind == "cancel")
    suite.envs[task.env_id] = CoinEnv(tmp_path / task.env_id)
    case = find(suite, [task], oracle, "oracle", lambda e, f, a: not e["success"])
    cfg = CFG.model_copy(update={"oracle_replays": 6})
    episodes, steps = frames([case])
    table, checks = attribute(episodes, steps, suite, cfg)
    assert table.loc[0, "cause"] == "stochastic"
    passes = checks[task.task_id].oracle_passes
    assert 0 < sum(passes) < len(passes)
    q, _ = quarantine(table, checks, None, suite, 1, cfg)
    assert q.loc[0, "task_id"] == task.task_id and q.loc[0, "cause"] == "stochastic"
    assert q.loc[0, "until_round"] == -1


def test_unsolvable_by_neighbours_without_oracle():
    catalog = pd.DataFrame({"task_id": ["a", "b", "c"], "domain": ["shop"] * 3,
                            "tools": [["x"], ["x"], ["y"]]})  # fmt: skip
    episodes = pd.DataFrame({"task_id": ["a"] * 8 + ["b"] * 8 + ["c"] * 8,
                             "success": [False] * 8 + [True, False] * 4 + [False] * 8})  # fmt: skip
    stats = neighbour_stats(episodes, catalog)
    assert stats["a"] == {"samples": 8, "successes": 0, "neighbour_samples": 8,
                          "neighbour_successes": 4}  # fmt: skip
    assert neighbour_confidence(stats["a"], 8) == pytest.approx(1 - 0.5**8)
    assert neighbour_confidence(stats["c"], 8) == 0.0  # no neighbour: no evidence
    assert neighbour_confidence(stats["b"], 8) == 0.0  # it succeeds itself
    assert neighbour_confidence(stats["a"], 9) == 0.0  # too few samples


# ---------------------------------------------------------------------------- policy failures
def test_genuine_policy_failures_are_kept(faulty):
    _, suite, bad = faulty
    tasks = solvable(suite, bad, "city_by_id")
    wrong_arg = find(suite, tasks, lambda t: [ToolCall(t.oracle[0].name, {**t.oracle[0].arguments,
                     **{k: 0 for k in t.oracle[0].arguments}})], "paris",
                     lambda e, f, a: not f and not e["success"])  # fmt: skip
    assert json.loads(wrong_arg[1][0]["observation"])["error"].startswith("not found")
    wrong_answer = find(suite, solvable(suite, bad, "count"), oracle, "17",
                        lambda e, f, a: not [x for x in f if x != "stochastic"]
                        and not e["success"])  # fmt: skip
    episodes, steps = frames([wrong_arg, wrong_answer])
    table, _ = attribute(episodes, steps, suite, CFG)
    assert list(table["cause"]) == ["policy", "policy"]
    assert decide(table, CFG)["kept"].all()


def test_an_episode_without_answer_is_still_reverified(faulty):
    """An episode cut off before answering has answer None, which pandas turns into NaN next
    to string answers: the re-verification must see None, not NaN (it failed to verify)."""
    _, suite, bad = faulty
    task = solvable(suite, bad, "count")[0]
    cut = find(suite, [task], lambda t: oracle(t)[:1], None, lambda e, f, a: not f)
    cut[0]["episode_id"] = cut[1][0]["episode_id"] = "cut"
    cut[0]["termination"] = "max_tokens"
    other = run_script(suite, task, 1, oracle(task), "17", eid="other")
    episodes, steps = frames([cut, other])
    episodes.loc[0, "answer"] = float("nan")
    table, _ = attribute(episodes, steps, suite, CFG)
    verdicts = json.loads(table.loc[0, "evidence"])["verifier"]
    assert verdicts["agree"] + verdicts["disagree"] >= 1 and table.loc[0, "cause"] == "policy"


# ---------------------------------------------------------------------------- the audit
class ProtocolOnly:
    """An environment with the protocol's five methods and nothing else (no audit, no fault
    plan): what the curator may use."""

    def __init__(self, inner):
        self._inner = inner

    def __copy__(self):
        return ProtocolOnly(copy.copy(self._inner))

    def tools(self):
        return self._inner.tools()

    def reset(self, task, seed):
        return self._inner.reset(task, seed)

    def step(self, call):
        return self._inner.step(call)

    def fingerprint(self):
        return self._inner.fingerprint()

    def verify(self, answer, calls):
        return self._inner.verify(answer, calls)


@pytest.fixture(scope="module")
def mixed(faulty):
    """A few scripted episodes of every kind on the faulty suite."""
    _, suite, bad = faulty
    cases = []
    for i, task in enumerate(sorted(suite.tasks.values(), key=lambda t: t.task_id)[:12]):
        answer = task.answer if i % 2 else city
        cases += [run_script(suite, task, s, oracle(task), answer) for s in range(3)]
    return frames(cases)


def test_curator_never_reads_the_audit(faulty, mixed, tmp_path: Path):
    out, suite, _ = faulty
    episodes, steps = mixed
    expected, _ = attribute(episodes, steps, suite, CFG)
    assert set(expected["cause"]) - {"policy"}  # the faults were seen
    # 1. through the protocol alone: no env.audit, no fault plan to peek at
    proxied = copy.copy(suite)
    proxied.envs = {k: ProtocolOnly(v) for k, v in suite.envs.items()}
    got, _ = attribute(episodes, steps, proxied, CFG)
    pd.testing.assert_frame_equal(got, expected)
    # 2. the whole round with the audit table (and the fault knobs) deleted from disk
    copied = tmp_path / "envs"
    shutil.copytree(out, copied)
    loaded = load_suite(copied)  # the runtime reads its own fault plan, as the rollout did
    (copied / faults.AUDIT_FILE).unlink()
    (copied / faults.KNOBS_FILE).unlink()
    done = curate(Params(curate=CFG), loaded, episodes, steps, RoundState(), 1)
    pd.testing.assert_frame_equal(done.tables["attributions"], expected)


# ---------------------------------------------------------------------------- filters
def test_decide_drop_weight_keep(faulty, mixed):
    _, suite, _ = faulty
    table, _ = attribute(*mixed, suite, CFG)
    non_policy = table["cause"] != "policy"
    drop = decide(table, CFG)
    assert list(drop.columns[:4]) == DECISION_COLUMNS
    assert (drop["kept"] == ~non_policy).all() and (drop["reason"] == table["cause"]).all()
    assert all("scores" in json.loads(e) for e in drop["evidence"])
    weight = decide(table, CFG.model_copy(update={"action": "weight"}))
    expected = (1 - table["confidence"]).where(non_policy, 1.0).round(4)
    assert (weight["weight"] == expected).all()
    assert (weight["kept"] == (expected > 0)).all()
    assert decide(table, CFG.model_copy(update={"action": "keep"}))["kept"].all()
    adv = pd.DataFrame({"episode_id": table["episode_id"], "advantage": 1.0})
    assert (weighted_advantages(adv, weight)["advantage"] == weight["weight"]).all()


def test_quarantine_lifecycle(faulty):
    _, suite, bad = faulty
    cfg = CFG.model_copy(update={"quarantine_rounds": 2})
    lost = suite.tasks[sorted(bad)[0]]
    shaky = solvable(suite, bad, "count")[0]
    attributions = pd.DataFrame({
        "episode_id": [f"e{i}" for i in range(9)], "task_id": [lost.task_id] + [shaky.task_id] * 8,
        "env_id": [lost.env_id] + [shaky.env_id] * 8, "success": False,
        "cause": ["tool_not_exposed"] + ["env_error"] * 5 + ["policy"] * 3,
        "confidence": 1.0, "verifier_calls": 0, "scores": "{}", "evidence": "{}"})  # fmt: skip
    from rollwise.curate.attribution import check_task

    checks = {lost.task_id: check_task(suite.envs[lost.env_id], lost, cfg)}
    q1, _ = quarantine(attributions, checks, None, suite, 1, cfg)
    assert q1.set_index("task_id")["until_round"].to_dict() == {lost.task_id: -1,
                                                                shaky.task_id: 3}  # fmt: skip
    none = attributions.iloc[:0]
    q3, spent = quarantine(none, {}, q1, suite, 3, cfg)  # round 3: shaky's time is up
    assert list(q3["task_id"]) == [lost.task_id] and spent == 0  # tools are checked for free
    fixed = copy.copy(suite)
    fixed.envs = {**suite.envs, lost.env_id: copy.copy(suite.envs[lost.env_id])}
    fixed.envs[lost.env_id].faults = None  # the tool is exposed again: the re-check releases
    q4, spent = quarantine(none, {}, q3, fixed, 4, cfg)
    assert q4.empty and spent > 0


# ---------------------------------------------------------------------------- success bank
def bank_rows(task_id: str, versions: list[int], keys: list[str]) -> pd.DataFrame:
    n = len(versions)
    return pd.DataFrame({
        "task_id": task_id, "env_id": "e", "episode_id": [f"{task_id}/{i}" for i in range(n)],
        "round": versions, "policy_version": versions, "reward": 1.0, "answer": "x",
        "trajectory": json.dumps([[{"name": "get", "arguments": {"id": 1},
                                    "observation": '{"city":"x"}'}]]),
        "key": keys, "tool_calls": range(1, n + 1), "token_ids": [[1]] * n,
        "loss_mask": [[1]] * n, "logprobs": [[0.0]] * n, "turn_spans": [[[0, 1]]] * n,
        "prompt_len": 1})  # fmt: skip


def test_bank_dedups_newest_first_and_caps():
    old = bank_rows("t", [0, 0, 1], ["a", "b", "c"])
    new = bank_rows("t", [2, 2], ["a", "d"])
    bank = success_bank.update(old, new, per_task=3)
    assert list(bank["policy_version"]) == [2, 2, 1]  # newest first, capped at 3
    assert sorted(bank["key"]) == ["a", "c", "d"] and bank["key"].is_unique
    assert bank.loc[bank["key"] == "a", "policy_version"].item() == 2  # the newest copy kept
    assert success_bank.best(bank, "t")["tool_calls"] == 1
    assert success_bank.best(bank, "missing") is None


def test_demonstration_and_positives():
    bank = bank_rows("t", [1], ["a"])
    demo = success_bank.demonstration(success_bank.best(bank, "t"), "Where is 1?")
    assert [m["role"] for m in demo] == ["user", "assistant", "tool", "assistant"]
    assert demo[1]["content"] == '<tool_call>{"name":"get","arguments":{"id":1}}</tool_call>'
    opening = [{"role": "system", "content": "s"}, {"role": "user", "content": "Where is 2?"}]
    messages = success_bank.with_demonstration(opening, demo)
    assert messages[0]["role"] == "system" and messages[1:-1] == demo and messages[-1] == opening[1]
    pos = success_bank.positives(bank, ["t", "u"], per_task=1, r=3)
    assert list(pos["episode_id"]) == ["bank/t/0"] and pos["success"].all()
    assert (pos["group"] == "t").all() and (pos["round"] == 3).all()


def test_curate_stage_writes_and_carries_the_bank(faulty, mixed, tmp_path: Path):
    from rollwise.config import Params
    from tasks import curate
    from tasks.warmstart import initial_states

    out, _, _ = faulty
    shutil.copytree(out, tmp_path / "data" / "envs")
    initial_states(tmp_path)  # round 00's empty bank and quarantine, as warmstart writes them
    episodes, steps = mixed
    for r in ("01", "02"):
        rollouts = tmp_path / "data" / "rollouts" / f"round_{r}"
        rollouts.mkdir(parents=True)
        ep = episodes.assign(
            round=int(r),
            policy_version=int(r) - 1,
            episode_id=episodes["episode_id"].str.replace("r01", f"r{r}"),
        )
        ep.to_parquet(rollouts / "episodes.parquet")
        steps.assign(episode_id=steps["episode_id"].str.replace("r01", f"r{r}")).to_parquet(
            rollouts / "steps.parquet")  # fmt: skip
        metrics = curate.run(Params(rounds=rounds_dict(2)), tmp_path, r)
    curated = tmp_path / "data" / "curated"
    decisions = pd.read_parquet(curated / "round_02" / "decisions.parquet")
    assert set(decisions["episode_id"]) == set(ep["episode_id"])
    assert metrics["dropped"] == int((~decisions["kept"]).sum()) > 0
    assert metrics["verifier_calls"] > 0
    bank1 = pd.read_parquet(curated / "round_01" / "success_bank.parquet")
    bank2 = pd.read_parquet(curated / "round_02" / "success_bank.parquet")
    assert len(bank1) > 0 and set(bank1["key"]) <= set(bank2["key"])
    versions = bank2.groupby("task_id", sort=False)["policy_version"]
    assert (versions.first() == versions.max()).all() and (bank2["policy_version"] == 1).any()
    q = pd.read_parquet(curated / "round_02" / "quarantine.parquet")
    assert set(q.columns) == {"task_id", "env_id", "cause", "confidence", "since_round",
                              "until_round", "evidence"}  # fmt: skip


def test_positives_replay_their_banked_steps(faulty, mixed):
    _, suite, _ = faulty
    episodes, steps = mixed
    table, _ = attribute(episodes, steps, suite, CFG)
    bank = success_bank.verified_successes(episodes, steps, table)
    assert len(bank) > 0
    pos = success_bank.positives(bank, list(bank["task_id"].unique()), per_task=10, r=2)
    got = success_bank.positive_steps(pos).sort_values(["episode_id", "step"], ignore_index=True)
    want = steps[steps["episode_id"].isin(bank["episode_id"])].assign(
        episode_id=lambda d: success_bank.REPLAY_PREFIX + d["episode_id"]
    )
    want = want.sort_values(["episode_id", "step"], ignore_index=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert (pos["termination"] == "answer").all()


def test_demonstrated_env_only_changes_the_opening(faulty):
    _, suite, _ = faulty
    task = sorted(suite.tasks.values(), key=lambda t: t.task_id)[0]
    demo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    env = success_bank.Demonstrated(clone_env(suite.envs[task.env_id]), demo)
    plain = clone_env(suite.envs[task.env_id]).reset(task, 0)
    assert env.reset(task, 0) == plain[:1] + demo + plain[1:]
    assert env.tools() == suite.envs[task.env_id].tools()
    copy.copy(env).fingerprint()  # a copy delegates too (no recursion on a half-built copy)


def write_rollouts(root: Path, envs: Path, episodes: pd.DataFrame, steps: pd.DataFrame) -> None:
    """A stage root with the suite, round 00's curated state and round 01's rollouts."""
    from tasks.warmstart import initial_states

    shutil.copytree(envs, root / "data" / "envs")
    initial_states(root)
    rollouts = root / "data" / "rollouts" / "round_01"
    rollouts.mkdir(parents=True)
    episodes.to_parquet(rollouts / "episodes.parquet")
    steps.to_parquet(rollouts / "steps.parquet")


@pytest.mark.e2e
def test_bank_published_to_s3_comes_back_equal(faulty, mixed, tmp_path: Path, s3_server: str,
                                               monkeypatch: pytest.MonkeyPatch):  # fmt: skip
    import uuid

    import boto3

    from rollwise import storage
    from rollwise.config import Params
    from tasks import curate

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)  # as tests/test_storage.py does
    bucket = f"rw-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    write_rollouts(tmp_path, faulty[0], *mixed)
    params = Params(rounds=rounds_dict(1), curate=CurateConfig(bank_url=f"s3://{bucket}/banks/"))
    curate.run(params, tmp_path, "01")
    local = tmp_path / "data" / "curated" / "round_01" / "success_bank.parquet"
    out = tmp_path / "fetched"
    storage.fetch(f"s3://{bucket}/banks/round_01", out)
    assert [p.name for p in out.iterdir()] == ["success_bank.parquet"]
    assert (out / "success_bank.parquet").read_bytes() == local.read_bytes()
    bank = pd.read_parquet(out / "success_bank.parquet")
    pd.testing.assert_frame_equal(bank, pd.read_parquet(local))
    assert len(bank) > 0 and set(bank.columns) == set(success_bank.BANK_COLUMNS)


def test_rollout_opens_banked_tasks_with_their_demonstration(tmp_path: Path):
    from rollwise.config import validate
    from rollwise.policy.build import build_model, save_policy
    from rollwise.policy.chat import prompt_ids
    from rollwise.train.warmstart import suite_tokenizer
    from tasks import rollout
    from tests.helpers import TINY_POLICY

    make_suite(tmp_path / "envs")
    suite = load_suite(tmp_path / "envs")
    tok = suite_tokenizer(suite)
    save_policy(build_model(tok, TINY_POLICY), tok, tmp_path / "models" / "round_00")
    banked, long, plain = sorted(suite.split("train"), key=lambda t: t.task_id)[:3]
    cases = [run_script(suite, t, 0, oracle(t), t.answer) for t in (banked, long)]
    episodes, steps = frames(cases)
    steps.loc[steps["episode_id"] == cases[1][0]["episode_id"], "observation"] = "word " * 600
    wins = pd.DataFrame({"episode_id": episodes["episode_id"], "success": True, "cause": "policy"})
    write_rollouts(tmp_path, tmp_path / "envs", episodes, steps)
    bank = success_bank.verified_successes(episodes, steps, wins)
    bank.to_parquet(tmp_path / "data" / "curated" / "round_00" / "success_bank.parquet")
    shutil.rmtree(tmp_path / "data" / "rollouts" / "round_01")
    params = validate({
        "rounds": rounds_dict(1), "schedule": {"tasks_per_round": 100},
        "rollout": {"samples_per_task": 1, "max_turns": 1, "max_new_tokens": 4},
        "curate": {"demonstrations": True}})  # fmt: skip
    metrics = rollout.run(params, tmp_path, "01")
    assert metrics["demonstrated_tasks"] == 1 and metrics["demonstrations_skipped_context"] == 1
    out = pd.read_parquet(tmp_path / "data" / "rollouts" / "round_01" / "episodes.parquet")
    opening = {e.task_id: list(e.token_ids[: e.prompt_len]) for e in out.itertuples()}

    def prompt(task, demo=None):
        env = clone_env(suite.envs[task.env_id])
        messages = env.reset(task, 0)
        messages = success_bank.with_demonstration(messages, demo) if demo else messages
        return prompt_ids(tok, messages, env.tools())

    demo = success_bank.demonstration(success_bank.best(bank, banked.task_id), banked.prompt)
    assert demo[1]["content"].startswith("<tool_call>") and demo[-1]["content"] == banked.answer
    assert opening[banked.task_id] == prompt(banked, demo) != prompt(banked)
    assert opening[long.task_id] == prompt(long)  # its demonstration would overflow: skipped
    assert opening[plain.task_id] == prompt(plain)  # nothing banked
