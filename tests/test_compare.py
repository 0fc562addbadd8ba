"""`rollwise compare` against a real MLflow server, fed the way the stages feed it; its table and
plot on hand-made runs; and the evaluate stage's extra artifacts (spend plots, sample
trajectories) on hand-made metrics files and episode frames."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from rollwise import cli, compare, track
from rollwise.compare import RunSummary
from rollwise.config import Params, apply_overrides, read_raw, validate
from rollwise.evaluate import report
from tasks.common import finish_stage
from tasks.evaluate import ROUND_METRICS, rollout_spend
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def server(mlflow_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point track and compare at the session's server, with short client retries."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    return mlflow_server


def _params(**overrides) -> Params:
    raw = apply_overrides(read_raw(ROOT / "params.yaml"), {"rounds": 2, **overrides})
    return validate(raw)


def _rollout(episodes: int) -> dict:
    return {
        "episodes": episodes,
        "tool_calls": 2 * episodes,
        "verifier_calls": episodes,
        "prompt_tokens": 100 * episodes,
        "generated_tokens": 10 * episodes,
        "wall_s": 1.0,
    }


def _pipeline_run(root: Path, params: Params, episodes: list[int], curve: list[float]) -> str:
    """Log what the stages of one pipeline run log: finish_stage per stage (step = round), and,
    with a `curve`, evaluate's metrics and its per-round held-out success."""
    for r, n in enumerate(episodes, start=1):
        finish_stage(root, params, f"rollout@{r:02d}", _rollout(n), r)
    run_id = track.open_run(root, params.model_dump())
    if not curve:
        return run_id
    tasks = 10
    final = {"final_success": curve[-1], "final_success_lo": curve[-1] - 0.2}
    final["final_success_hi"] = curve[-1] + 0.1
    finish_stage(root, params, "evaluate", {"tasks": tasks, "cells": tasks * 3, **final}, None)
    for r, success in enumerate(curve):
        values = {"success": success, "success_lo": success - 0.2, "success_hi": success + 0.1}
        per_round = {f"evaluate/round_{k}": values[k] for k in ROUND_METRICS}
        track.log_metrics(run_id, per_round, step=r, root=root)
    return run_id


def _rows(out: str) -> dict[str, dict[str, str]]:
    """The printed table as {run id prefix: {column: cell}} (cells are 2+ spaces apart)."""
    lines = [line for line in out.splitlines() if line.strip()]
    head = re.split(r"\s{2,}", lines[0].strip())
    rows = {}
    for line in lines[2:]:
        if line.startswith("plot:"):
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = dict(zip(head, cells, strict=True))
    return rows


@pytest.fixture
def two_runs(server: str, tmp_path: Path) -> tuple[str, str]:
    a = _pipeline_run(
        tmp_path / "a", _params(**{"train.lr": 1e-4}), [10, 16], [0.2, 0.4, 0.6]
    )  # round 1 logged twice below: a rerun inside the same MLflow run
    finish_stage(tmp_path / "a", _params(**{"train.lr": 1e-4}), "rollout@01", _rollout(16), 1)
    b = _pipeline_run(
        tmp_path / "b",
        _params(**{"train.lr": 3e-4, "credit.std_norm": False}),
        [16, 16],
        [0.2, 0.3, 0.5],
    )
    return a, b


def test_compare_table_and_plot_for_two_runs(two_runs, tmp_path: Path, capsys):
    a, b = two_runs
    out = tmp_path / "plots" / "compare.png"
    assert cli.main(["compare", a, b, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = _rows(text)
    assert list(rows) == [a[:8], b[:8]]
    ra, rb = rows[a[:8]], rows[b[:8]]
    assert (ra["train.lr"], rb["train.lr"]) == ("0.0001", "0.0003")
    assert ra["credit.method"] == rb["credit.method"] == "grpo"
    assert ra["rounds"] == rb["rounds"] == "2"
    assert (ra["credit.std_norm"], rb["credit.std_norm"]) == ("True", "False")  # differs: shown
    assert "envs.seed" not in ra and not any(k.startswith("override.") for k in ra)
    assert ra["final success (95% CI)"] == "60.0% (40.0–70.0%)"
    assert rb["final success (95% CI)"] == "50.0% (30.0–60.0%)"
    assert ra["rollouts"] == "32"  # the rerun of round 1 replaced its first value, not added
    assert (ra["tool calls"], ra["verifier calls"], ra["eval cells"]) == ("64", "32", "30")
    assert ra["status"] == "RUNNING"
    assert out.read_bytes().startswith(PNG)
    assert f"plot: {out}" in text


def test_compare_experiment_lists_its_latest_runs(two_runs, tmp_path: Path, capsys):
    a, b = two_runs
    c = _pipeline_run(tmp_path / "c", _params(**{"schedule.seed": 5}), [16], [])  # no eval yet
    track.finish_run(c, root=tmp_path / "c")
    capsys.readouterr()  # MLflow prints a "View run" line when a run ends
    out = tmp_path / "exp.png"
    assert compare.main(["--experiment", track.EXPERIMENT, "--out", str(out)]) == 0
    rows = _rows(capsys.readouterr().out)
    assert list(rows)[-3:] == [a[:8], b[:8], c[:8]]  # oldest first
    rc = rows[c[:8]]
    assert (rc["status"], rc["schedule.seed"]) == ("FINISHED", "5")
    assert rows[a[:8]]["schedule.seed"] == "0"
    assert (rc["final success (95% CI)"], rc["eval cells"], rc["rollouts"]) == ("-", "-", "16")
    assert out.read_bytes().startswith(PNG)


def test_unknown_run_or_experiment_is_a_clear_error(server: str, tmp_path: Path, capsys):
    out = tmp_path / "never.png"
    assert compare.main(["0123456789abcdef0123456789abcdef", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no MLflow run '0123456789abcdef0123456789abcdef'" in err and server in err
    assert compare.main(["--experiment", "no-such-experiment"]) == 2
    err = capsys.readouterr().err
    assert "no MLflow experiment 'no-such-experiment'" in err and "there are:" in err
    assert compare.main(["abc", "--experiment", "x"]) == 2
    assert not out.exists()


def test_missing_store_and_dead_server(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert compare.main(["--root", str(tmp_path)]) == 2
    assert "no MLflow store at sqlite:///" in capsys.readouterr().err
    assert not (tmp_path / "mlflow.db").exists()  # looking did not create an empty one
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    assert compare.main([]) == 2
    assert "unreachable" in capsys.readouterr().err


def test_console_script_points_at_the_cli():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"rollwise": "rollwise.cli:main"}


# ---------------------------------------------------------------------------- without a store


def _summary(run_id: str, lr: str, **kw) -> RunSummary:
    params = {"train.lr": lr, "credit.method": "grpo", "rounds": "2", "envs.seed": "0"}
    return RunSummary(run_id, f"run-{run_id}", "FINISHED", {**params, **kw.pop("params", {})}, **kw)


def test_table_formats_missing_values_and_only_differing_params():
    runs = [
        _summary("aaaaaaaa11", "0.0001", success=0.5, success_lo=0.3, success_hi=0.7,
                 totals={"rollouts": 32, "tool_calls": 70, "verifier_calls": 32,
                         "eval_cells": 300}, params={"schedule.method": "random"}),
        _summary("bbbbbbbb22", "0.0001", params={"override.train.lr": "0.0001"}),
    ]  # fmt: skip
    text = compare.table(runs)
    assert text.splitlines()[1].startswith("----")
    rows = _rows(text)
    assert list(rows["aaaaaaaa"]) == [
        "run", "name", "status", "train.lr", "credit.method", "rounds", "schedule.method",
        "final success (95% CI)", "rollouts", "tool calls", "verifier calls", "eval cells",
    ]  # fmt: skip
    assert rows["aaaaaaaa"]["final success (95% CI)"] == "50.0% (30.0–70.0%)"
    assert rows["bbbbbbbb"]["schedule.method"] == "-"
    assert rows["bbbbbbbb"]["final success (95% CI)"] == rows["bbbbbbbb"]["eval cells"] == "-"


def test_compare_plot_with_and_without_curves(tmp_path: Path):
    with_curve = _summary("a1", "0.0001", success=0.6, success_lo=0.4, success_hi=0.7,
                          curve=[(0, 0, 0.2), (1, 16, 0.4), (2, 32, 0.6)])  # fmt: skip
    pending = _summary("b2", "0.0003")  # no evaluation logged yet
    compare.plot([with_curve, pending], tmp_path / "both.png")
    compare.plot([pending], tmp_path / "none.png")
    assert (tmp_path / "both.png").read_bytes().startswith(PNG)
    assert (tmp_path / "none.png").read_bytes().startswith(PNG)


# ---------------------------------------------------------------------------- evaluate artifacts


def _write_rollout_metrics(root: Path, per_round: dict[str, int]) -> None:
    folder = root / "data" / "metrics"
    folder.mkdir(parents=True, exist_ok=True)
    for r, n in per_round.items():
        (folder / f"rollout@{r}.json").write_text(json.dumps(_rollout(n)))


def test_rollout_spend_is_cumulative_per_candidate(tmp_path: Path):
    _write_rollout_metrics(tmp_path, {"01": 8, "02": 16})
    spend = rollout_spend(tmp_path, ["01", "02"])
    assert spend.to_dict("records") == [
        {"round": 0, "rollouts": 0, "rollout_tokens": 0, "tool_calls": 0},
        {"round": 1, "rollouts": 8, "rollout_tokens": 880, "tool_calls": 16},
        {"round": 2, "rollouts": 24, "rollout_tokens": 2640, "tool_calls": 48},
    ]
    assert rollout_spend(tmp_path, ["01", "02", "03"]) is None  # round 3's metrics missing


def test_spend_plots_and_report_sections(tmp_path: Path):
    _write_rollout_metrics(tmp_path, {"01": 8, "02": 16})
    summary = pd.DataFrame(
        {
            "round": [0, 1, 2],
            "candidate": ["round_00", "round_01", "round_02"],
            "n": [10, 10, 10],
            "success": [0.2, 0.3, 0.5],
            "success_lo": [0.05, 0.1, 0.2],
            "success_hi": [0.5, 0.6, 0.8],
            "reward": [0.4, 0.5, 0.6],
            "criterion_answer_correct": [0.3, 0.4, 0.5],
        }
    )
    curve = summary.merge(rollout_spend(tmp_path, ["01", "02"]), on="round")
    report.plot_spend(curve, "rollouts", "rollouts spent (episodes)", tmp_path / "r.png")
    report.plot_spend(curve, "rollout_tokens", report.COST_LABEL, tmp_path / "c.png")
    assert (tmp_path / "r.png").read_bytes().startswith(PNG)
    assert (tmp_path / "c.png").read_bytes().startswith(PNG)
    text = report.markdown(summary, 10, curve, ["01_a.txt"])
    assert "| 2 | 24 | 2640 | 48 | 50.0% |" in text
    assert report.COST_LABEL in text
    assert "![success vs cost](success_vs_cost.png)" in text
    assert "- [01_a.txt](trajectories/01_a.txt)" in text
    assert "## What the rollouts cost" not in report.markdown(summary, 10)


@pytest.fixture(scope="module")
def episode_frame(tmp_path_factory: pytest.TempPathFactory):
    """(episode rows built token by token as the engine builds them, the suite tokenizer):
    episode 0 calls the oracle's first tool, reads the observation, answers; the rest answer
    at once."""
    from rollwise.policy.chat import action_text, encode, observation_text, prompt_ids
    from tests.helpers import suite_and_tokenizer

    suite, tokenizer = suite_and_tokenizer(tmp_path_factory.mktemp("suite"))
    rows = []
    for i, task in enumerate(suite.split("heldout")[:4]):
        env = suite.envs[task.env_id]
        ids = prompt_ids(tokenizer, env.reset(task, 0), env.tools())
        mask, prompt_len, calls = [0] * len(ids), len(ids), task.oracle[:1] if i == 0 else ()
        for call in calls:
            turn = encode(tokenizer, action_text([call]))
            obs = encode(tokenizer, observation_text(tokenizer, [env.step(call)]))
            ids, mask = ids + turn + obs, mask + [1] * len(turn) + [0] * len(obs)
        answer = encode(tokenizer, action_text(answer=task.answer))
        ids, mask = ids + answer, mask + [1] * len(answer)
        rows.append(
            {"episode_id": f"eval/{task.task_id}", "task_id": task.task_id,
             "env_id": task.env_id, "token_ids": ids, "loss_mask": mask,
             "prompt_len": prompt_len, "answer": task.answer if i != 3 else None,
             "success": i == 2, "reward": 1.0 if i == 2 else 0.25, "rubric": "{}",
             "termination": "answer" if i != 3 else "max_tokens", "turns": 1 + len(calls),
             "tool_calls": len(calls)}
        )  # fmt: skip
    return pd.DataFrame(rows), tokenizer, suite.split("heldout")[0]


def test_render_trajectory_shows_prompt_calls_observations_answer(episode_frame):
    episodes, tokenizer, task = episode_frame
    text = report.render_trajectory(episodes.iloc[0].to_dict(), tokenizer)
    sections = re.findall(r"^--- (.*?) ---$", text, flags=re.M)
    prompt_len = episodes.iloc[0]["prompt_len"]
    assert sections[0] == f"prompt ({prompt_len} tokens)"
    assert [s.split(" (")[0] for s in sections[1:]] == [
        "policy, turn 1", "observation", "policy, turn 2", "answer"
    ]  # fmt: skip
    assert f'<tool_call>{{"name":"{task.oracle[0].name}"' in text
    assert "<tool_response>" in text
    assert text.rstrip().endswith(task.answer)
    assert f"task {task.task_id}" in text.splitlines()[0]
    no_answer = report.render_trajectory(episodes.iloc[3].to_dict(), tokenizer)
    assert no_answer.rstrip().endswith("(none; ended by max_tokens)")


def test_write_samples_mixes_successes_and_failures(episode_frame, tmp_path: Path):
    episodes, tokenizer, _ = episode_frame
    names = report.write_samples(episodes, tokenizer, tmp_path / "trajectories", k=3)
    tasks = episodes["task_id"].str.replace("/", "_")
    assert names == [f"01_{tasks[2]}.txt", f"02_{tasks[0]}.txt", f"03_{tasks[1]}.txt"]
    assert sorted(p.name for p in (tmp_path / "trajectories").iterdir()) == names
    first = (tmp_path / "trajectories" / names[0]).read_text()
    assert first.startswith(f"episode eval/{episodes['task_id'][2]}")
