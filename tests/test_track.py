"""rollwise.track against a real MLflow server (and a dead port for the buffer)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rollwise import track
from tests.servers import free_port


@pytest.fixture
def server(mlflow_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point track at the session's server, with short client retries."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    return mlflow_server


def _dead_uri() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def _git_commit(repo: Path, message: str) -> str:
    """An (empty) commit in `repo`, made a git work tree on first use; returns its hash."""
    if not (repo / ".git").exists():
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
    who = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    subprocess.run(
        ["git", "-C", str(repo), *who, "commit", "-q", "--allow-empty", "-m", message], check=True
    )
    out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True)
    return out.stdout.decode().strip()


def test_flatten_nests_to_dotted_keys():
    nested = {"a": {"b": 1, "c": {"d": "x"}}, "e": [1, 2], "f": {}}
    assert track.flatten(nested) == {"a.b": 1, "a.c.d": "x", "e": [1, 2], "f": {}}


def test_tracking_uri_defaults_to_sqlite_in_root(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert track.tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://example:5000")
    assert track.tracking_uri(tmp_path) == "http://example:5000"


def test_params_hash_ignores_key_order():
    assert track.params_hash({"a": 1, "b": {"c": 2, "d": 3}}) == track.params_hash(
        {"b": {"d": 3, "c": 2}, "a": 1}
    )


def test_open_run_is_stable_per_params(server: str, tmp_path: Path):
    params = {"test": "stable", "train": {"lr": 1e-3}}
    first = track.open_run(tmp_path, params, run_name="stage-a")
    assert track.open_run(tmp_path, params, run_name="stage-b") == first
    assert track.open_run(tmp_path, {**params, "train": {"lr": 2e-3}}) != first


def test_open_run_prefers_env_run_id(server: str, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("MLFLOW_RUN_ID", "abc123")
    assert track.open_run(tmp_path, {"x": 1}) == "abc123"


def test_finished_run_is_reused_failed_is_not(server: str, tmp_path: Path):
    params = {"test": "status"}
    run_id = track.open_run(tmp_path, params)
    track.finish_run(run_id, root=tmp_path)
    assert track.open_run(tmp_path, params) == run_id
    track.finish_run(run_id, status="FAILED", root=tmp_path)
    assert track.open_run(tmp_path, params) != run_id


def test_params_are_flattened_and_tagged(server: str, tmp_path: Path):
    params = {"test": "params", "policy": {"model": {"layers": 2}}, "long": "y" * 7000}
    run_id = track.open_run(tmp_path, params)
    track.log_params(run_id, {"override": {"seed": 7}}, root=tmp_path)
    run = MlflowClient(server).get_run(run_id)
    assert run.data.params["policy.model.layers"] == "2"
    assert run.data.params["override.seed"] == "7"
    assert len(run.data.params["long"]) == track.MAX_PARAM_CHARS
    assert run.data.tags[track.HASH_TAG] == track.params_hash(params)


def test_metrics_land_with_steps(server: str, tmp_path: Path):
    run_id = track.open_run(tmp_path, {"test": "metrics"})
    for step in range(3):
        track.log_metrics(run_id, {"loss": 1.0 / (step + 1), "reward": step}, step, tmp_path)
    history = MlflowClient(server).get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
        (0, 1.0),
        (1, 0.5),
        (2, pytest.approx(1 / 3)),
    ]


def test_artifacts_upload(server: str, tmp_path: Path):
    run_id = track.open_run(tmp_path, {"test": "artifacts"})
    (tmp_path / "report.md").write_text("# report\n")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "a.txt").write_text("a")
    track.log_artifacts(run_id, [tmp_path / "report.md", tmp_path / "plots"], "eval", tmp_path)
    names = {a.path for a in MlflowClient(server).list_artifacts(run_id, "eval")}
    assert names == {"eval/report.md", "eval/plots"}


def test_server_down_buffers_then_flush_replays(server: str, tmp_path: Path, monkeypatch, capsys):
    run_id = track.open_run(tmp_path, {"test": "buffer"})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _dead_uri())
    track.log_metrics(run_id, {"loss": 0.9}, 0, tmp_path)  # no exception
    track.log_metrics(run_id, {"loss": 0.8}, 1, tmp_path)
    track.finish_run(run_id, root=tmp_path)
    buffer = track.buffer_path(tmp_path)
    assert len(buffer.read_text().splitlines()) == 3
    assert "WARNING" in capsys.readouterr().err
    assert track.flush_buffer(tmp_path) is False  # still down: kept
    assert len(buffer.read_text().splitlines()) == 3

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    assert track.flush_buffer(tmp_path) is True
    assert not buffer.exists()
    client = MlflowClient(server)
    history = client.get_metric_history(run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.9), (1, 0.8)]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_open_run_while_down_gets_pending_id_resolved_on_flush(
    server: str, tmp_path: Path, monkeypatch
):
    params = {"test": "pending", "seed": 3}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _dead_uri())
    pending = track.open_run(tmp_path, params)
    assert pending.startswith("pending-")
    track.log_metrics(pending, {"acc": 0.5}, 4, tmp_path)

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    track.log_metrics(pending, {"acc": 0.6}, 5, tmp_path)  # flushes first, then resolves
    assert not track.buffer_path(tmp_path).exists()
    run_id = track.open_run(tmp_path, params)
    assert not run_id.startswith("pending-")
    history = MlflowClient(server).get_metric_history(run_id, "acc")
    assert sorted((m.step, m.value) for m in history) == [(4, 0.5), (5, 0.6)]
    assert MlflowClient(server).get_run(run_id).data.params["seed"] == "3"


def test_local_sqlite_store_without_server(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    run_id = track.open_run(tmp_path, {"test": "sqlite"})
    track.log_metrics(run_id, {"loss": 1.5}, 0, tmp_path)
    assert (tmp_path / "mlflow.db").exists()
    client = MlflowClient(track.tracking_uri(tmp_path))
    assert client.get_run(run_id).data.metrics == {"loss": 1.5}
    assert track.open_run(tmp_path, {"test": "sqlite"}) == run_id


def test_experiment_opens_as_training_runs_in_the_ui(server: str, tmp_path: Path):
    """MLflow 3's UI reads mlflow.experimentKind; without it our runs showed as a GenAI app."""
    track.open_run(tmp_path, {"test": "kind"})
    exp = MlflowClient(server).get_experiment_by_name(track.EXPERIMENT)
    assert exp.tags[track.KIND_TAG] == "custom_model_development"


def test_untagged_experiment_is_tagged_a_set_kind_kept(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    client = MlflowClient(track.tracking_uri(tmp_path))
    exp_id = client.create_experiment(track.EXPERIMENT)  # as an older rollwise made it
    assert track.KIND_TAG not in client.get_experiment(exp_id).tags
    track.open_run(tmp_path, {"test": "untagged"})
    assert client.get_experiment(exp_id).tags[track.KIND_TAG] == "custom_model_development"
    client.set_experiment_tag(exp_id, track.KIND_TAG, "genai_development")  # the user's choice
    track.open_run(tmp_path, {"test": "untagged", "again": 1})
    assert client.get_experiment(exp_id).tags[track.KIND_TAG] == "genai_development"


def test_pipeline_params_are_logged_with_dotted_names(tmp_path: Path, monkeypatch):
    """The real params.yaml, as a stage logs it: every leaf under its dotted path, no sections."""
    from rollwise.config import load_params

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    params = load_params(Path(__file__).resolve().parents[1] / "params.yaml")
    run_id = track.open_run(tmp_path, params.model_dump())
    logged = MlflowClient(track.tracking_uri(tmp_path)).get_run(run_id).data.params
    assert logged == {k: str(v) for k, v in track.flatten(params.model_dump()).items()}
    assert logged["train.lr"] == str(params.train.lr)
    assert logged["credit.method"] == params.credit.method
    assert logged["policy.model"] == "None"
    assert logged["rounds.01.start"] == logged["rounds.01.rollout_round"] == "00"
    assert logged["envs.domains"] == str(params.envs.domains)
    assert not {"train", "credit", "rounds", "envs"} & logged.keys()


def test_tags_commit_flow_run_and_dvc_lock(server: str, tmp_path: Path, monkeypatch):
    first = _git_commit(tmp_path, "one")
    monkeypatch.setenv(track.FLOW_RUN_ENV, "0b7e-flow-run")
    params = {"test": "tags"}
    run_id = track.open_run(tmp_path, params)
    tags = MlflowClient(server).get_run(run_id).data.tags
    assert tags[track.GIT_COMMIT_TAG] == first and len(first) == 40
    assert tags[track.FLOW_RUN_TAG] == "0b7e-flow-run"
    assert track.DVC_LOCK_TAG not in tags  # set when the run ends

    second = _git_commit(tmp_path, "two")  # a reused run records the code now writing to it
    assert track.open_run(tmp_path, params) == run_id
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    track.finish_run(run_id, root=tmp_path)
    tags = MlflowClient(server).get_run(run_id).data.tags
    assert tags[track.GIT_COMMIT_TAG] == second
    lock_hash = hashlib.sha256((tmp_path / "dvc.lock").read_bytes()).hexdigest()
    assert tags[track.DVC_LOCK_TAG] == lock_hash


def test_no_tags_outside_git_prefect_and_dvc(server: str, tmp_path: Path, monkeypatch):
    monkeypatch.delenv(track.FLOW_RUN_ENV, raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repo above tmp
    run_id = track.open_run(tmp_path, {"test": "no-tags"})
    track.finish_run(run_id, root=tmp_path)
    tags = MlflowClient(server).get_run(run_id).data.tags
    assert not {track.GIT_COMMIT_TAG, track.FLOW_RUN_TAG, track.DVC_LOCK_TAG} & tags.keys()
    assert track.git_commit(tmp_path / "missing") is None


def test_tags_survive_the_buffer(server: str, tmp_path: Path, monkeypatch):
    """Opened and finished while the server is down: the tags arrive with the replay."""
    monkeypatch.setenv(track.FLOW_RUN_ENV, "flow-while-down")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _dead_uri())
    params = {"test": "buffered-tags"}
    pending = track.open_run(tmp_path, params)
    (tmp_path / "dvc.lock").write_text("stages: {}\n")
    track.finish_run(pending, root=tmp_path)

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    assert track.flush_buffer(tmp_path) is True
    monkeypatch.delenv(track.FLOW_RUN_ENV)  # the lookup below must not re-tag the run itself
    run = MlflowClient(server).get_run(track.open_run(tmp_path, params))
    assert run.info.status == "FINISHED"
    assert run.data.tags[track.FLOW_RUN_TAG] == "flow-while-down"
    assert run.data.tags[track.DVC_LOCK_TAG] == track.dvc_lock_hash(tmp_path)
