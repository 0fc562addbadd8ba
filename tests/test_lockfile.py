"""flows/lockfile.py: a dvc.lock cut at any byte is repaired into one DVC accepts, keeping
exactly the whole entries before the cut."""

from __future__ import annotations

from itertools import pairwise

import yaml
from dvc.utils.serialize import dumps_yaml

from flows.lockfile import is_valid, repair


def entry(name: str) -> dict:
    return {
        "cmd": f"python -m tasks.{name.split('@')[0]}",
        "deps": [
            {
                "path": "src/rollwise",
                "hash": "md5",
                "md5": f"{name}-src.dir",
                "size": 123,
                "nfiles": 4,
            }
        ],  # fmt: skip
        "params": {"params.yaml": {"train": {"lr": 0.0001, "epochs": 2}}},
        "outs": [{"path": f"data/{name}", "hash": "md5", "md5": f"{name}-out.dir"}],
    }


NAMES = ["generate", "warmstart", "rollout@01"]
LOCK = dumps_yaml({"schema": "2.0", "stages": {n: entry(n) for n in NAMES}})


def test_a_whole_lock_is_left_alone(tmp_path):
    (tmp_path / "dvc.lock").write_text(LOCK)
    assert repair(tmp_path) is None
    assert (tmp_path / "dvc.lock").read_text() == LOCK
    assert repair(tmp_path / "absent") is None


def test_every_cut_is_repaired_to_the_whole_entries_before_it(tmp_path):
    lock = tmp_path / "dvc.lock"
    repaired = 0
    for cut in range(len(LOCK)):
        lock.write_text(LOCK[:cut])
        kept = repair(tmp_path)
        text = lock.read_text()
        assert is_valid(text), cut
        if kept is None:  # DVC accepts this prefix as it is
            continue
        repaired += 1
        stages = yaml.safe_load(text)["stages"]
        assert list(stages) == kept == NAMES[: len(kept)], cut
        assert all(stages[n] == entry(n) for n in kept), cut
        for name, after in pairwise(NAMES):  # whole, and the next entry begun: kept
            header = f"\n  {after}:"
            assert (name in kept) == (cut >= LOCK.index(header) + len(header)), (cut, name)
    assert repaired > len(LOCK) // 4  # many cuts leave a file DVC refuses (437 of 1006 here)
