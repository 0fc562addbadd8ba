"""params.yaml validation: every error names its key path, before any work is done."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rollwise.config import (
    ROUNDS_FILE,
    Params,
    ParamsError,
    apply_overrides,
    check_rounds_file,
    dump_for_dvc,
    load_params,
    read_raw,
    rounds_dict,
    rounds_file_text,
    validate,
    write_rounds_file,
)

REPO = Path(__file__).resolve().parents[1]


def error_of(raw: dict) -> str:
    with pytest.raises(ParamsError) as info:
        validate(raw)
    return str(info.value)


def test_unknown_key_names_its_path():
    msg = error_of({"train": {"lrr": 0.1}})
    assert "train.lrr" in msg and msg.startswith("params.yaml: ")


def test_unknown_section_names_it():
    assert "trian" in error_of({"trian": {"lr": 0.1}})


def test_wrong_type_names_its_path():
    msg = error_of({"train": {"lr": "fast"}})
    assert "train.lr" in msg and "number" in msg


def test_out_of_range_names_its_path():
    assert "rollout.samples_per_task" in error_of({"rollout": {"samples_per_task": 0}})
    assert "envs.heldout_task_frac" in error_of({"envs": {"heldout_task_frac": 1.5}})
    assert "schedule.method" in error_of({"schedule": {"method": "psychic"}})


def test_every_error_is_reported():
    msg = error_of({"train": {"lr": -1, "epochs": 0}})
    assert "train.lr" in msg and "train.epochs" in msg


def link(start: str, rollout_round: str) -> dict:
    return {"start": start, "rollout_round": rollout_round}


@pytest.mark.parametrize(
    "rounds",
    [
        {"01": "00", "02": "01"},  # the old format: one checkpoint per round
        {"01": link("00", "00"), "03": link("02", "02")},
        {"01": link("01", "01")},
        {"1": link("0", "0")},
        {"02": link("01", "01")},
        {"01": link("00", "00"), "02": link("00", "00")},
        {"01": link("00", "00"), "02": link("01", "00")},  # lag 0
        {"01": {"start": "00"}},
    ],
)
def test_bad_rounds_mapping(rounds):
    msg = error_of({"rounds": rounds})
    assert msg.startswith("params.yaml: rounds:") and "rounds must be" in msg
    assert f"`rounds={len(rounds)}`" in msg  # says what to pass


def test_rounds_is_a_count():
    params = validate({"rounds": 3})
    assert params.n_rounds == 3 and params.model_dump()["rounds"] == rounds_dict(3)
    lagged = validate({"rounds": 3, "rollout": {"policy_lag": 1}, "train": {"tis_cap": 2.0}})
    assert lagged.model_dump()["rounds"] == rounds_dict(3, lag=1)
    assert error_of({"rounds": 0}).startswith("params.yaml: rounds: Value error, must be a count")
    assert "rounds" in error_of({"rounds": True})


def test_good_rounds_mapping():
    """The mapping older params files (a run's branch) hold still reads, when it is consistent."""
    params = validate({"rounds": rounds_dict(3)})
    link = params.rounds["03"]
    assert params.n_rounds == 3 and link.start == link.rollout_round == "02"
    assert rounds_dict(2) == {
        "01": {"start": "00", "rollout_round": "00"},
        "02": {"start": "01", "rollout_round": "01"},
    }


LAGGED = {"rollout": {"policy_lag": 1}, "train": {"tis_cap": 2.0}}


def test_lagged_rounds_sample_with_the_checkpoint_before_the_start():
    assert rounds_dict(3, lag=1) == {
        "01": {"start": "00", "rollout_round": "00"},  # nothing older than the warm start
        "02": {"start": "01", "rollout_round": "00"},
        "03": {"start": "02", "rollout_round": "01"},
    }
    params = validate({**LAGGED, "rounds": rounds_dict(3, lag=1)})
    assert [(x.start, x.rollout_round) for x in params.rounds.values()] == [
        ("00", "00"), ("01", "00"), ("02", "01"),
    ]  # fmt: skip


def test_rounds_must_match_the_policy_lag():
    msg = error_of({**LAGGED, "rounds": rounds_dict(3)})
    assert "rounds:" in msg and "rollout.policy_lag 1" in msg and "`rounds=3`" in msg
    assert '"03": {start: "02", rollout_round: "01"}' in msg  # in params.yaml's words
    msg = error_of({"rounds": rounds_dict(2, lag=1)})
    assert "rollout.policy_lag 0" in msg


def test_policy_lag_needs_tis():
    msg = error_of({"rollout": {"policy_lag": 1}, "rounds": rounds_dict(2, lag=1)})
    assert "rollout.policy_lag: 1 needs train.tis_cap" in msg
    assert msg.startswith("params.yaml: rollout.policy_lag")  # no empty key path


def test_policy_lag_is_zero_or_one():
    assert "rollout.policy_lag" in error_of({"rollout": {"policy_lag": 2}, "train": {"tis_cap": 2}})


def test_repo_params_validate():
    params = load_params(REPO / "params.yaml")
    assert isinstance(params, Params)
    assert params.n_rounds == yaml.safe_load((REPO / "params.yaml").read_text())["rounds"]
    micro = load_params(REPO / "tests" / "e2e" / "micro_params.yaml")
    assert micro.n_rounds == 2


@pytest.mark.parametrize("params_file", ["params.yaml", "tests/e2e/micro_params.yaml"])
def test_dvc_yaml_params_exist(params_file: str):
    """Every params key a dvc.yaml stage lists is a real key path of Params, and is written in
    the params file: DVC reads the file, not config.py's defaults, and fails on a missing key."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    written = read_raw(REPO / params_file)
    for name, stage in stages.items():
        body = stage.get("do", stage)
        for key in body.get("params", []):
            model, node, parts = Params, written, key.split(".")
            for i, part in enumerate(parts):
                assert part in model.model_fields, f"{name}: {key}"
                assert isinstance(node, dict) and part in node, f"{params_file} lacks {key}"
                node = node[part]
                if i < len(parts) - 1:
                    model = model.model_fields[part].annotation


def test_repo_rounds_file_is_current():
    """rounds.yaml (what dvc.yaml loops over) is params.yaml's rounds: `rollwise params
    --write-rounds` regenerates it."""
    assert (REPO / ROUNDS_FILE).read_text() == rounds_file_text(load_params(REPO / "params.yaml"))


def test_a_stale_rounds_file_is_named(tmp_path: Path):
    write_rounds_file(tmp_path, validate({"rounds": 2}))
    check_rounds_file(tmp_path, validate({"rounds": 2}))
    with pytest.raises(ParamsError, match=r"rounds\.yaml does not match.*--write-rounds"):
        check_rounds_file(tmp_path, validate({"rounds": 3}))


# ------------------------------------------------------------------------------ seeds

SEED_PATHS = ("envs", "envs.faults", "policy", "warmstart", "schedule", "rollout", "curate",
              "train", "evaluate.halving")  # fmt: skip


def seed_of(params: Params, path: str) -> int:
    node = params
    for part in path.split("."):
        node = getattr(node, part)
    return node.seed


def test_every_section_seed_derives_from_the_top_level_seed():
    assert {seed_of(load_params(REPO / "params.yaml"), p) for p in SEED_PATHS} == {0}
    params = validate({"seed": 7, "train": {"seed": 3}, "rollout": {"seed": None}})
    assert {p: seed_of(params, p) for p in SEED_PATHS} == dict.fromkeys(SEED_PATHS, 7) | {
        "train": 3  # a stage's own seed overrides
    }
    assert validate({}).train.seed == 0  # the top-level default
    assert "seed" in error_of({"seed": "x"}) and "train.seed" in error_of({"train": {"seed": "x"}})


def test_seed_override_reaches_the_stages(raw):
    params = load_params(REPO / "params.yaml", {"seed": 5})
    assert {seed_of(params, p) for p in SEED_PATHS} == {5}


def test_read_raw_errors(tmp_path: Path):
    with pytest.raises(ParamsError, match="file not found"):
        read_raw(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ParamsError, match="mapping"):
        read_raw(tmp_path / "list.yaml")
    (tmp_path / "bad.yaml").write_text("train: {lr: [\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        read_raw(tmp_path / "bad.yaml")


# ------------------------------------------------------------------------------ overrides


@pytest.fixture
def raw() -> dict:
    return read_raw(REPO / "params.yaml")


def test_override_sets_a_dotted_key(raw):
    out = apply_overrides(raw, {"train.lr": 0.5, "schedule.tasks_per_round": 4})
    assert out["train"]["lr"] == 0.5 and out["schedule"]["tasks_per_round"] == 4
    assert raw["train"]["lr"] != 0.5  # the input is not mutated
    params = validate(out)
    assert params.train.lr == 0.5 and params.train.epochs == validate(raw).train.epochs


def test_override_of_a_missing_section_value(tmp_path: Path):
    assert apply_overrides({}, {"train.lr": 0.5})["train"] == {"lr": 0.5}


def test_override_inside_a_null_optional_section(raw):
    assert validate(raw).train.lora is None  # params.yaml: full fine-tune
    out = apply_overrides(raw, {"train.lora.rank": 4})
    lora = validate(out).train.lora
    assert lora is not None and lora.rank == 4 and lora.alpha == 16.0  # the rest: defaults
    with pytest.raises(ParamsError, match=r"train\.lora\.rnk"):
        apply_overrides(raw, {"train.lora.rnk": 4})


@pytest.mark.parametrize("key", ["train.lrr", "trian.lr", "nosuch", "train.lr.x"])
def test_unknown_override_names_it(raw, key: str):
    with pytest.raises(ParamsError, match=key.replace(".", r"\.")):
        apply_overrides(raw, {key: 1})


def test_bad_override_value_names_its_path(raw):
    with pytest.raises(ParamsError, match=r"train\.lr"):
        apply_overrides(raw, {"train.lr": -1.0})


def test_rounds_override_expands(raw, tmp_path: Path):
    out = apply_overrides(raw, {"rounds": 3})
    assert out["rounds"] == 3 and validate(out).model_dump()["rounds"] == rounds_dict(3)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert load_params(path, {"rounds": 3}).n_rounds == 3


def test_rounds_file_reads_alike_in_dvc():
    """Round keys 08 and 09 are not octal in YAML 1.1, so PyYAML writes them bare; DVC (YAML 1.2)
    would read them as ints beside the str keys of the other rounds and fail its foreach."""
    from dvc.utils.serialize import parse_yaml

    links = {"round_links": rounds_dict(10)}
    assert 8 in parse_yaml(yaml.safe_dump(links), "rounds.yaml")["round_links"]  # the trap itself
    text = rounds_file_text(validate({"rounds": 10}))
    for read in (yaml.safe_load(text), parse_yaml(text, "rounds.yaml")):
        assert list(read["round_links"]) == [f"{r:02d}" for r in range(1, 11)]
        assert read["round_links"]["09"] == {"start": "08", "rollout_round": "08"}
    assert yaml.safe_load(dump_for_dvc(links)) == links


# ------------------------------------------------------------------------------ stage CLIs


def stage(module: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(
        [sys.executable, "-m", module],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_stage_rejects_bad_params_by_key_path(tmp_path: Path):
    raw = read_raw(REPO / "tests" / "e2e" / "micro_params.yaml")
    raw["envs"]["n_envz"] = 3
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    done = stage("tasks.generate", tmp_path)
    assert done.returncode != 0
    assert "envs.n_envz" in done.stderr
    assert not (tmp_path / "data").exists()  # failed before any work


def test_stage_names_the_missing_upstream(tmp_path: Path):
    (tmp_path / "params.yaml").write_text(
        (REPO / "tests" / "e2e" / "micro_params.yaml").read_text()
    )
    done = stage("tasks.warmstart", tmp_path)
    assert done.returncode != 0
    assert "data/envs" in done.stderr and "`generate`" in done.stderr
    assert not (tmp_path / "models").exists()


def resolved_rounds(raw: dict) -> dict:
    return validate(raw).model_dump()["rounds"]


@pytest.mark.parametrize("count", [True, False])
def test_policy_lag_override_rebuilds_the_rounds(raw, count: bool):
    n = raw["rounds"]
    if not count:  # an older file's mapping
        raw = {**raw, "rounds": rounds_dict(n)}
    out = apply_overrides(raw, {"rollout.policy_lag": 1, "train.tis_cap": 2.0})
    assert resolved_rounds(out) == rounds_dict(n, lag=1)  # the round count kept
    back = apply_overrides(out, {"rollout.policy_lag": 0})
    assert resolved_rounds(back) == rounds_dict(n)


@pytest.mark.parametrize("order", [("rounds", "lag"), ("lag", "rounds")])
def test_rounds_count_and_policy_lag_together(raw, order):
    given = {"rounds": 2, "lag": 1}
    keys = {"rounds": "rounds", "lag": "rollout.policy_lag"}
    overrides = {keys[k]: given[k] for k in order} | {"train.tis_cap": 2.0}
    assert resolved_rounds(apply_overrides(raw, overrides)) == rounds_dict(2, lag=1)


def test_rounds_count_keeps_the_file_policy_lag(raw):
    lagged = apply_overrides(raw, {"rollout.policy_lag": 1, "train.tis_cap": 2.0})
    assert resolved_rounds(apply_overrides(lagged, {"rounds": 5})) == rounds_dict(5, lag=1)


def test_policy_lag_override_without_tis_names_both_keys(raw):
    with pytest.raises(ParamsError, match=r"rollout\.policy_lag: 1 needs train\.tis_cap"):
        apply_overrides(raw, {"rollout.policy_lag": 1})
