"""The whole pipeline on the micro config: `python -m flows.run` (dvc repro under one MLflow run)
in a fresh git+DVC copy of the project, against a real MLflow server."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

from rollwise import track
from rollwise.config import load_params, write_rounds_file
from rollwise.types import ADVANTAGE_COLUMNS, DECISION_COLUMNS, EPISODE_COLUMNS, STEP_COLUMNS

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ROUNDS = ("01", "02")
ROLLOUT_METRICS = [
    "reward_mean",
    "success_rate",
    "zero_variance_groups",
    "prompt_tokens",
    "generated_tokens",
    "tool_calls",
    "tool_errors",
    "verifier_calls",
    "wall_s",
]
STAGES = [
    "generate",
    "warmstart",
    *(f"{s}@{r}" for r in ROUNDS for s in ("rollout", "curate", "credit", "train")),
    "evaluate",
]


def copy_project(dst: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("src", "tasks", "flows"):
        shutil.copytree(REPO / name, dst / name, ignore=ignore)
    shutil.copy(REPO / "dvc.yaml", dst / "dvc.yaml")
    shutil.copy(REPO / "tests" / "e2e" / "micro_params.yaml", dst / "params.yaml")
    write_rounds_file(dst, load_params(dst / "params.yaml"))  # what dvc.yaml loops over
    (dst / ".gitignore").write_text("__pycache__/\nmlflow.db\nmlruns/\n.rollwise/\n")


def run(cmd: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory, mlflow_server: str):
    """Run the pipeline once; yields (root, env, first run's process)."""
    root = tmp_path_factory.mktemp("project")
    assert REPO not in root.parents  # DVC and git must not nest in the main repo
    copy_project(root)
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": mlflow_server,
        "DVC_NO_ANALYTICS": "1",
        "OMP_NUM_THREADS": "1",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "GIT_AUTHOR_NAME": "test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
    }
    env.pop("MLFLOW_RUN_ID", None)
    for cmd in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"]):
        done = run(cmd, root, env, 60)
        assert done.returncode == 0, done.stderr
    # As from a plain shell, the venv not activated: flows.run must give the stages its python.
    plain = os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if d and Path(d) != BIN)
    first = run([sys.executable, "-m", "flows.run"], root, {**env, "PATH": plain}, 900)
    return root, env, first


def test_pipeline_exits_zero(pipeline):
    _, _, first = pipeline
    assert first.returncode == 0, (
        f"stdout:\n{first.stdout[-4000:]}\nstderr:\n{first.stderr[-4000:]}"
    )
    assert "rollwise summary" in first.stdout
    assert "shipped policy" in first.stdout and "paired successive halving:" in first.stdout


def read(path: Path) -> pd.DataFrame:
    assert path.exists(), f"{path} is missing"
    return pd.read_parquet(path)


def has_columns(df: pd.DataFrame, columns: list[str], where: Path | str) -> None:
    missing = [c for c in columns if c not in df.columns]
    assert not missing, f"{where}: missing columns {missing}"


def test_suite_artifacts(pipeline):
    root = pipeline[0]
    envs = root / "data" / "envs"
    catalog = read(envs / "catalog.parquet")
    has_columns(catalog, ["env_id", "task_id", "split", "tools", "tables", "verifier"], "catalog")
    assert set(catalog["split"]) == {"train", "heldout"}
    for env_id in catalog["env_id"].unique():
        for name in ("state.sqlite", "tools.json", "tasks.parquet"):
            assert (envs / env_id / name).exists(), f"{env_id}/{name}"
        assert "oracle" in read(envs / env_id / "tasks.parquet").columns


@pytest.mark.parametrize("r", ROUNDS)
def test_round_artifacts(pipeline, r: str):
    root = pipeline[0]
    rollouts = root / "data" / "rollouts" / f"round_{r}"
    plan = read(rollouts / "plan.parquet")
    has_columns(plan, ["env_id", "task_id", "n_samples", "reason"], "plan")
    episodes = read(rollouts / "episodes.parquet")
    has_columns(episodes, EPISODE_COLUMNS, "episodes")
    assert len(episodes) == plan["n_samples"].sum() > 0
    assert (episodes["round"] == int(r)).all()
    assert (episodes["policy_version"] == int(r) - 1).all()
    for ids, mask, logp in episodes[["token_ids", "loss_mask", "logprobs"]].to_numpy():
        assert len(ids) == len(mask) == len(logp)
    steps = read(rollouts / "steps.parquet")
    has_columns(steps, STEP_COLUMNS, "steps")
    assert set(steps["episode_id"]) <= set(episodes["episode_id"])

    decisions = read(root / "data" / "curated" / f"round_{r}" / "decisions.parquet")
    has_columns(decisions, DECISION_COLUMNS, "decisions")
    assert set(decisions["episode_id"]) == set(episodes["episode_id"])

    advantages = read(root / "data" / "advantages" / f"round_{r}" / "advantages.parquet")
    has_columns(advantages, ADVANTAGE_COLUMNS, "advantages")
    assert set(advantages["episode_id"]) <= set(decisions.loc[decisions["kept"], "episode_id"])


@pytest.mark.parametrize("r", ["00", *ROUNDS])
def test_checkpoints(pipeline, r: str):
    folder = pipeline[0] / "models" / f"round_{r}"
    assert json.loads((folder / "config.json").read_text())["model_type"] == "qwen2"
    assert (folder / "model.safetensors").exists()
    if r != "00":
        assert (folder / "trainer_state.pt").exists()


def test_eval_artifacts(pipeline):
    out = pipeline[0] / "data" / "eval"
    matrix = read(out / "matrix.parquet")
    has_columns(matrix, ["candidate", "task_id", "success", "reward"], "matrix")
    assert set(matrix["candidate"]) == {"round_00", "round_01", "round_02"}
    selection = json.loads((out / "selection.json").read_text())
    assert selection["winner"] in set(matrix["candidate"])
    # halving is the default: it chose with fewer cells than full evaluation
    assert selection["method"] == "halving"
    assert selection["cells_used"] == matrix["ran"].sum() < selection["cells_full"] == len(matrix)
    assert (out / "report.md").read_text().startswith("# Held-out evaluation")
    assert (out / "per_round.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_metrics_files(pipeline):
    metrics = pipeline[0] / "data" / "metrics"
    assert sorted(p.stem for p in metrics.glob("*.json")) == sorted(STAGES)


def test_mlflow_run(pipeline, mlflow_server: str):
    root = pipeline[0]
    params = load_params(root / "params.yaml").model_dump()
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name(track.EXPERIMENT)
    assert exp is not None
    runs = client.search_runs(
        [exp.experiment_id], f"tags.`{track.HASH_TAG}` = '{track.params_hash(params)}'"
    )
    assert len(runs) == 1, [r.info.run_id for r in runs]  # every stage landed in one run
    run_id = runs[0].info.run_id
    assert runs[0].info.status == "FINISHED"
    for name in ROLLOUT_METRICS:
        history = client.get_metric_history(run_id, f"rollout/{name}")
        assert sorted(m.step for m in history) == [1, 2], name
    for name in ("train/episodes", "train/guard_after", "curate/kept", "credit/turns"):
        assert sorted(m.step for m in client.get_metric_history(run_id, name)) == [1, 2], name
    assert "evaluate/final_success" in runs[0].data.metrics
    assert runs[0].data.params["rollout.samples_per_task"] == "3"
    artifacts = {a.path for a in client.list_artifacts(run_id, "eval")}
    assert "eval/report.md" in artifacts


def test_second_repro_is_a_noop(pipeline):
    root, env, _ = pipeline
    again = run([str(BIN / "dvc"), "repro"], root, env, 300)
    assert again.returncode == 0, again.stderr
    for stage in STAGES:
        assert f"Stage '{stage}' didn't change" in again.stdout, (stage, again.stdout)
    assert "Running stage" not in again.stdout
    status = run([str(BIN / "dvc"), "status"], root, env, 120)
    assert "up to date" in status.stdout, status.stdout


def ran_stages(stdout: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", stdout))


def test_credit_change_reruns_from_credit_on(pipeline):
    """Only credit.* changed: DVC reuses generate, warmstart, rollout@01 and curate@01."""
    root, env, _ = pipeline
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["credit"]["eps"] = 1.0e-4
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    again = run([str(BIN / "dvc"), "repro"], root, env, 600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    ran = ran_stages(again.stdout)
    assert {"credit@01", "credit@02"} <= ran, again.stdout
    assert not ran & {"generate", "warmstart", "rollout@01", "curate@01"}, again.stdout
    for stage in ("generate", "warmstart", "rollout@01", "curate@01"):
        assert f"Stage '{stage}' didn't change" in again.stdout, stage


def test_dvc_exp_run_sets_a_param(pipeline):
    """`dvc exp run -S credit.std_norm=false` runs as an experiment and records the param."""
    root, env, _ = pipeline
    for cmd in (["git", "add", "-A"], ["git", "commit", "-q", "-m", "baseline"]):
        done = run(cmd, root, env, 60)
        assert done.returncode == 0, done.stderr
    exp = run([str(BIN / "dvc"), "exp", "run", "-S", "credit.std_norm=false"], root, env, 600)
    assert exp.returncode == 0, exp.stdout[-3000:] + exp.stderr[-3000:]
    ran = ran_stages(exp.stdout)
    assert "credit@01" in ran and "rollout@01" not in ran, exp.stdout
    shown = run([str(BIN / "dvc"), "exp", "show", "--json"], root, env, 120)
    assert shown.returncode == 0, shown.stderr
    values = re.findall(r'"std_norm":\s*(true|false)', shown.stdout)
    assert "false" in values and "true" in values, shown.stdout[:2000]  # baseline and experiment


def test_a_bench_arm_of_the_same_params_runs_the_same_rounds(pipeline):
    """rollwise.loop.run_rounds in this process (what every bench arm runs) from the pipeline's
    round_00, with its params, gives the episodes, advantages and checkpoint weights that
    `dvc repro` wrote stage by stage: the benches measure the pipeline, not a copy of it."""
    from tests.helpers import assert_bench_arm_matches

    root, _, _ = pipeline
    assert_bench_arm_matches(root, ROUNDS)
