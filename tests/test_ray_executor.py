"""Batch-independent sampling, and the Ray executor giving the local executor's episodes."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest
import torch

from rollwise.config import RolloutConfig
from rollwise.policy.hf import HFBackend, RowSampler
from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env
from rollwise.rollout.executors import EXECUTORS, RolloutWorker, shards, spec_row
from tests.helpers import assert_same_episodes, scripted_policy

# A generous tool deadline: these tests compare batch shapes and processes, and a call that a
# loaded CI machine stalls past the 5 s default would become a timeout observation in one run only.
LIMITS = Limits(
    max_turns=3, max_new_tokens=48, max_context=384, temperature=0.7, seed=7, tool_timeout_s=120
)


@pytest.fixture(scope="module")
def policy():
    """(suite_dir, policy_dir, suite, tokenizer, model) of the session's scripted policy
    (tests/helpers.py): its episodes mix valid, wrong and malformed calls."""
    p = scripted_policy()
    return p.suite_dir, p.policy_dir, p.suite, p.tokenizer, p.model


def plan(suite, n_tasks: int = 8, samples: int = 2) -> list[EpisodeSpec]:
    """Specs the way tasks/rollout.py builds them (seeds repeat across tasks, as there)."""
    tasks = suite.split("train")[:n_tasks]
    return [
        EpisodeSpec(f"r01/{t.task_id}/s{k}", t, clone_env(suite.envs[t.env_id]), t.task_id, k, k)
        for t in tasks
        for k in range(samples)
    ]


def ragged_prompts(suite, tok, n: int) -> list[list[int]]:
    from rollwise.policy.chat import prompt_ids

    out = []
    for i, t in enumerate(list(suite.tasks.values())[:n]):
        env = suite.envs[t.env_id]
        ids = prompt_ids(tok, env.reset(t, 0), env.tools())
        out.append(ids[: len(ids) - 5 * i])  # different lengths: different left padding
    return out


# ---------------------------------------------------------------------------- sampling


def test_row_sampler_draws_from_the_tempered_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])  # [V]
    rows, temperature = 20_000, 0.7
    uniforms = torch.rand(rows, 1, generator=torch.Generator().manual_seed(0))  # [B, 1]
    scores = RowSampler(uniforms, temperature, prompt_width=3)(
        torch.zeros(rows, 3, dtype=torch.long), logits.expand(rows, -1).clone()
    )  # [B, V]
    assert torch.all((scores == 0).sum(-1) == 1)  # one finite score per row: greedy keeps it
    picks = scores.argmax(-1)  # [B]
    freq = torch.bincount(picks, minlength=5).float() / rows  # [V]
    want = torch.softmax(logits / temperature, dim=-1)  # [V]
    assert torch.allclose(freq, want, atol=4 * math.sqrt(0.25 / rows))


def test_an_episode_sample_does_not_depend_on_its_batch_mates(policy):
    _, _, suite, tok, model = policy
    backend = HFBackend(model, tok)
    prompts = ragged_prompts(suite, tok, 8)
    seeds = [1000 + i for i in range(8)]
    batch = backend.generate(prompts, 16, 0.7, seed=seeds)
    flipped = backend.generate(prompts[::-1], 16, 0.7, seed=seeds[::-1])[::-1]
    for i, prompt in enumerate(prompts):
        (alone,) = backend.generate([prompt], 16, 0.7, seed=[seeds[i]])
        for other in (batch[i], flipped[i]):
            assert alone.token_ids == other.token_ids, i
            assert alone.stopped == other.stopped
            assert torch.allclose(  # 1e-4: alone, a prompt shares no prefix (policy/hf.py),
                torch.tensor(alone.logprobs), torch.tensor(other.logprobs), atol=1e-4
            )  # so float32 sums its attention in another order
    reseeded = backend.generate(prompts, 16, 0.7, seed=[s + 1 for s in seeds])
    assert [c.token_ids for c in reseeded] != [c.token_ids for c in batch]  # the seed matters


def test_logprobs_are_those_of_the_sampling_distribution(policy):
    """Scoring the sampled tokens with the model at the same temperature gives the same
    log-probs (what the trainer recomputes as PPO's old policy)."""
    _, _, suite, tok, model = policy
    prompt = ragged_prompts(suite, tok, 1)[0]
    (out,) = HFBackend(model, tok).generate([prompt], 12, 0.7, seed=[3])
    ids = torch.tensor([prompt + out.token_ids])  # [1, T]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / 0.7  # [N, V]
    want = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]  # [N]
    assert torch.allclose(torch.tensor(out.logprobs), want, atol=1e-5)


def test_local_episodes_do_not_depend_on_the_batch_size(policy):
    envs, ckpt, suite, _, _ = policy
    cfg = RolloutConfig()
    whole, whole_steps = EXECUTORS["local"](plan(suite), ckpt, envs, LIMITS, cfg)
    small = dataclasses.replace(LIMITS, batch_size=5)
    split, split_steps = EXECUTORS["local"](plan(suite), ckpt, envs, small, cfg)
    assert_same_episodes(whole, split)
    assert whole_steps == split_steps


def test_shards_are_contiguous_and_cover_the_plan():
    assert shards(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert shards([1, 2], 4) == [[1], [2]]
    assert shards([], 2) == []


def test_executor_params_are_validated_and_match_the_dispatch_dict():
    from typing import get_args

    from rollwise.config import ParamsError, validate

    assert set(get_args(RolloutConfig.model_fields["executor"].annotation)) == set(EXECUTORS)
    with pytest.raises(ParamsError, match=r"rollout\.executor"):
        validate({"rollout": {"executor": "dask"}})
    with pytest.raises(ParamsError, match=r"rollout\.workers"):
        validate({"rollout": {"workers": 0}})
    with pytest.raises(ParamsError, match=r"rollout\.ray_adress"):
        validate({"rollout": {"ray_adress": "auto"}})


def test_the_library_imports_neither_ray_nor_prefect():
    code = (
        "import sys, rollwise.rollout.executors, rollwise.policy.hf; "
        "print(sorted({'ray', 'prefect', 'dvc'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- Ray


def demonstrated(specs: list[EpisodeSpec], suite) -> list[EpisodeSpec]:
    """The first task's specs open with a demonstration (curate.demonstrations)."""
    from rollwise.curate.success_bank import Demonstrated

    first = specs[0].task
    demo = [{"role": "user", "content": suite.tasks[first.task_id].prompt},
            {"role": "assistant", "content": first.answer}]  # fmt: skip
    return [dataclasses.replace(s, env=Demonstrated(s.env, demo)) if s.task is first else s
            for s in specs]  # fmt: skip


def test_a_worker_rebuilds_demonstrated_episodes_as_the_local_executor_runs_them(policy):
    """Environments never travel to a Ray worker; the demonstration rides on the spec row."""
    envs, ckpt, suite, tok, _ = policy
    specs = demonstrated(plan(suite, n_tasks=3), suite)
    local, local_steps = EXECUTORS["local"](specs, ckpt, envs, LIMITS, RolloutConfig())
    remote, remote_steps = RolloutWorker(ckpt, envs).run([spec_row(s) for s in specs], LIMITS)
    assert_same_episodes(local, remote)
    assert local_steps == remote_steps
    answer = tok.encode(specs[0].task.answer, add_special_tokens=False)
    opened = [e["token_ids"][: e["prompt_len"]] for e in local]
    has = [any(o[i : i + len(answer)] == answer for i in range(len(o))) for o in opened]
    assert has[:2] == [True, True] and not any(has[2:])  # only the demonstrated task's prompts


@pytest.mark.e2e
def test_ray_executor_equals_local_episode_for_episode(policy):
    ray = pytest.importorskip("ray")
    envs, ckpt, suite, _, _ = policy
    cfg = RolloutConfig(executor="ray", workers=2, ray_address=None)
    limits = dataclasses.replace(LIMITS, batch_size=5)  # other batches than the shards'
    specs = demonstrated(plan(suite), suite)  # demonstrations ride along to the workers
    local, local_steps = EXECUTORS["local"](specs, ckpt, envs, limits, cfg)
    try:
        remote, remote_steps = EXECUTORS["ray"](specs, ckpt, envs, limits, cfg)
    finally:
        ray.shutdown()  # the executor shuts down the Ray it started; this is for a failure
    assert_same_episodes(local, remote)
    assert local_steps == remote_steps
    assert {s["observation_kind"] for s in local_steps} >= {"ok"}, "the steps compared nothing"
    assert len({tuple(e["token_ids"]) for e in local}) > len(local) // 2, "samples barely differ"
    assert not ray.is_initialized()
