"""Damaged or missing stage outputs fail with the file and the stage that writes it named."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tasks.common import CorruptArtifact, MissingUpstream, load_checkpoint, read_table
from tests.helpers import TINY_POLICY


def test_a_truncated_parquet_names_file_and_stage(tmp_path: Path):
    path = tmp_path / "episodes.parquet"
    pd.DataFrame({"a": range(100), "b": ["x"] * 100}).to_parquet(path)
    assert len(read_table(path, "rollout@01")) == 100
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CorruptArtifact, match="episodes.parquet.*rollout@01.*dvc repro -f -s"):
        read_table(path, "rollout@01")


def test_a_missing_table_names_the_stage(tmp_path: Path):
    with pytest.raises(MissingUpstream, match="written by the `credit@02` stage"):
        read_table(tmp_path / "advantages.parquet", "credit@02")


def test_a_damaged_checkpoint_names_folder_and_stage(tmp_path: Path):
    from rollwise.policy.build import build_model, save_policy, train_tokenizer

    tok = train_tokenizer(["the answer is paris"])
    folder = tmp_path / "round_01"
    save_policy(build_model(tok, TINY_POLICY), tok, folder)
    model, _ = load_checkpoint(folder, "train@01", take=True)
    assert model.config.hidden_size == TINY_POLICY.hidden
    weights = folder / "model.safetensors"
    weights.write_bytes(b"\x00garbage" + weights.read_bytes()[:64])
    with pytest.raises(CorruptArtifact, match="round_01.*train@01"):
        load_checkpoint(folder, "train@01")


def test_a_shared_cache_keeps_a_live_writers_folder_and_the_first_finished_copy(tmp_path: Path):
    import subprocess
    import sys

    from rollwise.artifacts import atomic_dir

    path = tmp_path / "suite_abc"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        busy = tmp_path / f".suite_abc.tmp-{live.pid}"  # another seed still generating
        busy.mkdir()
        dead = tmp_path / ".suite_abc.tmp-999999999"  # a killed writer's leftovers
        dead.mkdir()
        with atomic_dir(path, keep_existing=True) as tmp:
            (tmp / "catalog.parquet").write_text("first")
        assert busy.exists() and not dead.exists()
        assert (path / "catalog.parquet").read_text() == "first"
        with atomic_dir(path, keep_existing=True) as tmp:  # the slower seed finishes second
            (tmp / "catalog.parquet").write_text("second")
        assert (path / "catalog.parquet").read_text() == "first"
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([busy.name, "suite_abc"])
        with atomic_dir(path) as tmp:  # a stage output is replaced as before
            (tmp / "catalog.parquet").write_text("rerun")
        assert (path / "catalog.parquet").read_text() == "rerun"
    finally:
        live.kill()
