"""Evaluation over any list of Hugging Face folders (a user's own checkpoints), and the evaluate
stage's damaged inputs: every failure names the folder or file, before any cell runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from rollwise.config import ParamsError, load_params
from rollwise.evaluate.candidates import check_candidates
from tasks import evaluate
from tasks.common import CorruptArtifact, MissingUpstream, envs_dir, read_suite
from tests.helpers import TINY_POLICY, scripted_policy

EVAL = {"split": "train", "max_tasks": 20, "max_turns": 4, "max_new_tokens": 48}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A project root (params.yaml, data/envs) and two tiny checkpoints in folders of their own:
    `sft`, SFT'd on the train split's oracles, and `blank`, the same architecture untrained."""
    from rollwise.policy.build import build_model, save_policy

    sp = scripted_policy()
    root = tmp_path_factory.mktemp("project")
    shutil.copytree(sp.suite_dir, root / "data" / "envs")
    (root / "params.yaml").write_text(yaml.safe_dump({"evaluate": EVAL}))
    mine = tmp_path_factory.mktemp("mine")
    shutil.copytree(sp.policy_dir, mine / "sft")
    save_policy(build_model(sp.tokenizer, TINY_POLICY), sp.tokenizer, mine / "blank")
    return {"root": root, "sft": mine / "sft", "blank": mine / "blank"}


def damaged_copy(src: Path, dst: Path) -> Path:
    """A copy of a checkpoint whose model.safetensors lost its second half."""
    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return dst


def count_cells(monkeypatch) -> list[int]:
    """Counts the episodes evaluate_policy is asked to run."""
    from rollwise.evaluate import full

    calls: list[int] = []
    real = full.evaluate_policy

    def counting(backend, tokenizer, suite, tasks, limits):
        calls.append(len(tasks))
        return real(backend, tokenizer, suite, tasks, limits)

    monkeypatch.setattr(full, "evaluate_policy", counting)
    return calls


def test_cli_evaluates_just_the_named_folders(project, tmp_path, monkeypatch):
    calls = count_cells(monkeypatch)
    out = tmp_path / "out"
    root = tmp_path / "full_root"  # full evaluation asked for (halving is the default)
    shutil.copytree(project["root"], root)
    (root / "params.yaml").write_text(yaml.safe_dump({"evaluate": {**EVAL, "method": "full"}}))
    args = ["--candidate", f"blank={project['blank']}", "--candidate", f"sft={project['sft']}"]
    evaluate.main([*args, "--root", str(root), "--out", str(out)])
    sel = json.loads((out / "selection.json").read_text())
    summary = pd.read_parquet(out / "summary.parquet").set_index("candidate")
    assert sorted(summary.index) == ["blank", "sft"] and summary["round"].isna().all()
    assert sel["method"] == "full"
    assert sel["cells_used"] == sel["cells_full"] == 2 * 20 == sum(calls)
    # The SFT'd checkpoint solves train tasks the untrained one cannot: it is chosen.
    assert summary.loc["sft", "success"] > summary.loc["blank", "success"]
    assert sel["winner"] == "sft"
    assert sel["interval"] == [summary.loc["sft", "success_lo"], summary.loc["sft", "success_hi"]]
    matrix = pd.read_parquet(out / "matrix.parquet")
    assert len(matrix) == 40 and matrix["ran"].all()
    assert set(matrix["candidate"]) == {"blank", "sft"}
    report = (out / "report.md").read_text()
    assert "## Checkpoint selection" in report and "Winner: **sft**" in report
    assert (out / "candidates.png").exists() and not (out / "per_round.png").exists()
    assert not (root / "data" / "metrics").exists()  # nothing recorded for DVC


def test_params_candidates_join_the_rounds(project):
    params = load_params(project["root"] / "params.yaml", {"evaluate.candidates": {"mine": "x/y"}})
    found = evaluate.pipeline_candidates(params, Path("/proj"))
    assert [c.name for c in found] == ["round_00", "round_01", "mine"]
    assert found[1].folder == Path("/proj/models/round_01") and found[1].stage == "train@01"
    assert found[2].folder == Path("/proj/x/y") and found[2].stage is None
    assert [c.round for c in found] == [0, 1, None]


@pytest.mark.parametrize("bad", ["round_01", "a b", "x/y"])
def test_a_bad_candidate_name_is_named(project, bad):
    with pytest.raises(ParamsError, match="evaluate.candidates"):
        load_params(project["root"] / "params.yaml", {"evaluate.candidates": {bad: "/x"}})


@pytest.mark.parametrize("arg", ["noequals", "=/x", "a=", "round_00=/x"])
def test_a_bad_candidate_argument_is_named(arg):
    with pytest.raises(ParamsError, match="--candidate"):
        evaluate.parse_candidates([arg])
    with pytest.raises(ParamsError, match="given twice"):
        evaluate.parse_candidates(["a=/x", "a=/y"])


def test_a_missing_folder_fails_before_any_cell(project, tmp_path, monkeypatch):
    calls = count_cells(monkeypatch)
    gone = tmp_path / "no_such_model"
    with pytest.raises(SystemExit, match=f"candidate gone: {gone} does not exist"):
        args = ["--candidate", f"sft={project['sft']}", "--candidate", f"gone={gone}"]
        evaluate.main([*args, "--root", str(project["root"]), "--out", str(tmp_path / "out")])
    assert calls == [] and not (tmp_path / "out").exists()


def test_a_folder_that_is_not_a_model_is_named(project, tmp_path):
    params = load_params(project["root"] / "params.yaml")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a model")
    broken = tmp_path / "broken"
    shutil.copytree(project["sft"], broken)
    (broken / "config.json").write_text('{"model_type": "qwen2", "hidden_size": ')
    for name, folder, why in [("notes", tmp_path / "notes", "no config.json"),
                              ("broken", broken, "config.json")]:  # fmt: skip
        found = evaluate.user_candidates({name: str(folder)}, project["root"])
        with pytest.raises(CorruptArtifact, match=f"candidate {name}: {folder} .*{why}"):
            evaluate.evaluate_candidates(params, project["root"], found, tmp_path / "out")


def test_a_truncated_safetensors_is_named_before_and_at_load(project, tmp_path):
    folder = damaged_copy(project["sft"], tmp_path / "cut")
    (cut,) = evaluate.user_candidates({"cut": str(folder)}, project["root"])
    with pytest.raises(CorruptArtifact, match=f"candidate cut: {folder} .*model.safetensors"):
        check_candidates([cut])
    with pytest.raises(CorruptArtifact, match=f"candidate cut: {folder} failed to load"):
        evaluate.load_candidate(cut)


def test_a_damaged_round_checkpoint_names_folder_and_stage(project, tmp_path):
    folder = damaged_copy(project["sft"], tmp_path / "models" / "round_01")
    params = load_params(project["root"] / "params.yaml")
    found = evaluate.pipeline_candidates(params, tmp_path)
    with pytest.raises(MissingUpstream, match="round_00 is missing.*`warmstart`"):
        check_candidates(found)
    with pytest.raises(CorruptArtifact, match=f"{folder} is unreadable.*`train@01` stage"):
        check_candidates(found[1:])


def test_a_truncated_suite_parquet_is_named(project, tmp_path):
    root = tmp_path / "proj"
    shutil.copytree(project["root"] / "data", root / "data")
    assert read_suite(envs_dir(root)).split("train")
    tasks = sorted((root / "data" / "envs").glob("*/tasks.parquet"))[0]
    tasks.write_bytes(tasks.read_bytes()[: tasks.stat().st_size // 2])
    with pytest.raises(CorruptArtifact, match=f"{tasks} is unreadable.*`generate` stage"):
        read_suite(envs_dir(root))


def test_a_corrupt_rollout_metrics_file_is_named(tmp_path):
    path = tmp_path / "data" / "metrics" / "rollout@01.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"episodes": 8, "prompt_')
    with pytest.raises(CorruptArtifact, match="rollout@01.json is unreadable"):
        evaluate.rollout_spend(tmp_path, ["01"])


def test_the_evaluate_deployment_takes_candidates_as_a_typed_parameter():
    from flows.pipeline import evaluate_only

    props = evaluate_only.parameters.properties
    assert props["candidates"]["type"] == "object"
    assert props["candidates"]["additionalProperties"] == {"type": "string"}
    assert props["candidates_only"]["type"] == "boolean"


def test_the_stage_adds_params_candidates_to_the_rounds(project, tmp_path, monkeypatch):
    """The DVC stage under halving: rounds and a params candidate, one report, one record."""
    from rollwise import track
    from tasks.common import timed_stage

    logged: dict[str, float] = {}
    monkeypatch.setattr(track, "open_run", lambda *a, **k: "run")
    monkeypatch.setattr(track, "log_metrics", lambda run, m, step=None, root=None: logged.update(m))
    monkeypatch.setattr(track, "log_artifacts", lambda *a, **k: None)
    root = tmp_path / "proj"
    shutil.copytree(project["root"] / "data", root / "data")
    shutil.copytree(project["blank"], root / "models" / "round_00")
    shutil.copytree(project["blank"], root / "models" / "round_01")
    evaluate_params = {**EVAL, "method": "halving", "candidates": {"sft": str(project["sft"])}}
    (root / "params.yaml").write_text(yaml.safe_dump({"evaluate": evaluate_params}))
    params = load_params(root / "params.yaml")
    metrics = timed_stage("evaluate", evaluate.run, params, root)
    out = root / "data" / "eval"
    sel = json.loads((out / "selection.json").read_text())
    summary = pd.read_parquet(out / "summary.parquet")
    assert summary["candidate"].tolist() == ["round_00", "round_01", "sft"]
    assert summary["round"].tolist()[:2] == [0, 1] and pd.isna(summary["round"].iloc[2])
    assert sel["method"] == "halving" and sel["rungs"][0] == ["round_00", "round_01", "sft"]
    ran = pd.read_parquet(out / "matrix.parquet")["ran"]
    assert metrics["cells"] == sel["cells_used"] == ran.sum() <= 0.6 * len(ran)  # budget_frac
    assert metrics["cells_full"] == 3 * 20 and metrics["chosen"] == sel["winner"]
    assert metrics["chosen_round"] == {"round_00": 0, "round_01": 1, "sft": -1}[sel["winner"]]
    assert logged["evaluate/cells"] == metrics["cells"]
    assert logged["evaluate/chosen_round"] == metrics["chosen_round"]
    assert "evaluate/final_success" in logged  # round_01, the last round
    assert (out / "per_round.png").exists() and (out / "candidates.png").exists()
    report = (out / "report.md").read_text()
    assert "Method: paired successive halving" in report and "| 0 (warm-up) | 3:" in report


def test_halving_is_the_default_and_spends_fewer_cells_on_the_micro_config(project, tmp_path,
                                                                          monkeypatch):  # fmt: skip
    """The e2e micro config (no evaluate.method) runs paired successive halving: fewer cells
    than full evaluation; report.md and `make run`'s summary name the shipped policy (the
    winner), its held-out success with its interval on the tasks it ran, and cells against full."""
    from flows.summary import summary_table
    from rollwise import track
    from tasks.common import timed_stage

    calls = count_cells(monkeypatch)
    for name in ("open_run", "log_metrics", "log_artifacts"):
        monkeypatch.setattr(track, name, lambda *a, **k: "run")
    root = tmp_path / "proj"
    shutil.copytree(project["root"] / "data", root / "data")
    for r, folder in (("00", "blank"), ("01", "blank"), ("02", "sft")):
        shutil.copytree(project[folder], root / "models" / f"round_{r}")
    shutil.copy(Path(__file__).parent / "e2e" / "micro_params.yaml", root / "params.yaml")
    params = load_params(root / "params.yaml")
    assert "method" not in yaml.safe_load((root / "params.yaml").read_text())["evaluate"]
    metrics = timed_stage("evaluate", evaluate.run, params, root)
    sel = json.loads((root / "data" / "eval" / "selection.json").read_text())
    assert sel["method"] == "halving"
    assert sel["cells_used"] == sum(calls) == metrics["cells"] < metrics["cells_full"] == 3 * 6
    report = (root / "data" / "eval" / "report.md").read_text()
    assert f"Shipped policy: **{sel['winner']}**, held-out success" in report
    assert f"in {sel['cells_used']} of the 18 cells of full evaluation" in report
    text = summary_table(root, params)
    assert f"shipped policy                {sel['winner']} (models/{sel['winner']})" in text
    lo, hi = (f"{100 * v:.1f}" for v in sel["interval"])
    assert f"(95% CI {lo}–{hi}%) on {sel['winner_cells']} tasks" in text
    assert f"paired successive halving: {sel['cells_used']} of 18 cells" in text
    assert "held-out tasks both ran (final minus warm start)" in text


def test_the_deployments_candidates_only_task(project, tmp_path):
    """What the `evaluate` deployment runs with candidates_only: params' folders, no rounds."""
    from flows.pipeline import evaluate_candidates_task

    root = tmp_path / "proj"
    shutil.copytree(project["root"] / "data", root / "data")
    params = load_params(project["root"] / "params.yaml", {"evaluate.max_tasks": 6,
                         "evaluate.candidates": {"sft": str(project["sft"])}})  # fmt: skip
    metrics = evaluate_candidates_task.fn(params, root)
    assert metrics["chosen"] == "sft" and metrics["chosen_round"] == -1
    assert metrics["cells"] == metrics["cells_full"] == 6 and "final_success" not in metrics
    sel = json.loads((root / evaluate.CANDIDATES_OUT / "selection.json").read_text())
    assert sel["winner"] == "sft" and not (root / "data" / "eval").exists()
