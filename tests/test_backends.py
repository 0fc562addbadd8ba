"""The backend contract, one suite for every backend (policy/backends.py):

- `hf`: HFBackend in this process.
- `http`: VLLMBackend, the HTTP client, against tests/openai_server.py started by policy/vllm.py's
  launcher on 127.0.0.1. That server is a small standard-library server wrapping HFBackend: the
  installed `transformers serve` (5.24) takes text prompts only on /v1/completions and ignores
  `logprobs`, so it cannot do token ids in and log-probs out; vLLM itself needs CUDA and an
  environment of its own.
- `vllm`: VLLMBackend against a real `vllm serve` (from `make vllm-env`); skipped without CUDA.

Each backend must give the same Completion shapes, stop on the stop token (and include it), decode
greedily and deterministically to the model's argmax, and return the log-probs the model gives
the sampled tokens under the distribution sampled from (temperature, top-p).
"""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path
from typing import get_args

import pytest
import torch

from rollwise.config import PolicyConfig, RolloutConfig
from rollwise.policy.backends import BACKENDS
from rollwise.policy.hf import (
    HFBackend,
    RowSampler,
    nucleus,
    sampling_logprobs,
    shared_prefixes,
)
from rollwise.policy.vllm import (
    VLLMBackend,
    launch,
    parse_choice,
    reload,
    serving,
    stop,
    vllm_command,
)
from tests.helpers import TINY_POLICY, assert_same_episodes, scripted_policy

FAKE_VLLM = [sys.executable, str(Path(__file__).with_name("openai_server.py"))]
# vLLM's attention kernels want a head size of 64 or more; otherwise the same tiny recipe.
VLLM_POLICY = PolicyConfig(hidden=128, layers=1, heads=2, kv_heads=1, intermediate=128, seed=0)


def vllm_missing() -> str | None:
    """Why the real-vLLM half cannot run here, or None."""
    if not torch.cuda.is_available():
        return "no CUDA device: vLLM serves on a GPU only (this half runs where a GPU is lent)"
    if shutil.which(vllm_command()[0]) is None:
        return f"no {vllm_command()[0]}: run `make vllm-env` on the GPU machine first"
    return None


class Subject:
    """A backend under test and the model it must agree with."""

    def __init__(self, name: str, backend, policy):
        self.name, self.backend, self.policy = name, backend, policy
        self.model, self.tok = policy.model, policy.tokenizer
        self.stop_id = policy.tokenizer.eos_token_id
        self.atol = 2e-3 if name == "vllm" else 1e-5  # GPU kernels vs CPU float32


@pytest.fixture(scope="module")
def fake_server():
    """tests/openai_server.py on the scripted policy, started by the vLLM launcher."""
    with serving(scripted_policy().policy_dir, cmd=FAKE_VLLM, extra_args=[]) as server:
        yield server


@pytest.fixture(scope="module", params=["hf", "http", "vllm"])
def subject(request):
    if request.param == "hf":
        policy = scripted_policy()
        yield Subject("hf", HFBackend(policy.model, policy.tokenizer), policy)
        return
    if request.param == "http":
        policy, server = scripted_policy(), request.getfixturevalue("fake_server")
        yield Subject("http", VLLMBackend(server.url, policy.tokenizer.eos_token_id), policy)
        return
    if reason := vllm_missing():
        pytest.skip(reason)
    policy = scripted_policy(VLLM_POLICY)
    args = ["--dtype", "float32", "--gpu-memory-utilization", "0.3", "--enforce-eager"]
    with serving(policy.policy_dir, extra_args=args) as server:
        yield Subject("vllm", VLLMBackend(server.url, policy.tokenizer.eos_token_id), policy)


def prompts(policy, n: int = 4) -> list[list[int]]:
    """Opening prompts of n train tasks, each of another length (other left padding)."""
    from rollwise.policy.chat import prompt_ids

    by_length = {}
    for task in policy.suite.split("train"):
        env = policy.suite.envs[task.env_id]
        ids = prompt_ids(policy.tokenizer, env.reset(task, 0), env.tools())
        by_length.setdefault(len(ids), ids)
    assert len(by_length) >= n
    return list(by_length.values())[:n]


def scored(model, prompt: list[int], ids: list[int]) -> torch.Tensor:
    """[N, V] the model's logits for each generated position, teacher-forced."""
    seq = torch.tensor([prompt + ids])  # [1, T]
    with torch.no_grad():
        return model(input_ids=seq).logits[0, len(prompt) - 1 : -1].float()  # [N, V]


# ------------------------------------------------------------------------------ the contract


def test_completion_shapes(subject):
    outs = subject.backend.generate(prompts(subject.policy), 12, 0.7, seed=[1, 2, 3, 4])
    assert len(outs) == 4
    for out in outs:
        assert 1 <= len(out.token_ids) == len(out.logprobs) <= 12
        assert all(isinstance(t, int) and 0 <= t < len(subject.tok) for t in out.token_ids)
        assert all(isinstance(x, float) and -math.inf < x <= 0.0 for x in out.logprobs)
        assert out.stopped == (out.token_ids[-1] == subject.stop_id)
        assert subject.stop_id not in out.token_ids[:-1]  # nothing after the stop token
        if not out.stopped:
            assert len(out.token_ids) == 12


def test_stop_token_ends_the_turn_and_is_kept(subject):
    long = subject.backend.generate(prompts(subject.policy), 48, greedy=True)
    assert all(o.stopped and o.token_ids[-1] == subject.stop_id for o in long)
    text = subject.tok.decode(long[0].token_ids)
    assert text.startswith("<tool_call>") and text.endswith("</tool_call><|im_end|>"), text
    cut = subject.backend.generate(prompts(subject.policy), 3, greedy=True)
    assert [o.token_ids for o in cut] == [o.token_ids[:3] for o in long]
    assert not any(o.stopped for o in cut)


def test_greedy_is_deterministic_and_the_models_argmax(subject):
    batch = prompts(subject.policy)
    first = subject.backend.generate(batch, 16, greedy=True)
    again = subject.backend.generate(batch, 16, greedy=True)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    for prompt, out in zip(batch, first, strict=True):
        logits = scored(subject.model, prompt, out.token_ids)  # [N, V]
        assert logits.argmax(-1).tolist() == out.token_ids
        want = torch.log_softmax(logits, -1).max(-1).values  # [N]
        assert torch.allclose(torch.tensor(out.logprobs), want, atol=subject.atol)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_logprobs_are_the_models_under_the_sampling_distribution(subject, top_p):
    """What the trainer recomputes: log-softmax of logits / T, cut to the top-p nucleus."""
    batch = prompts(subject.policy)
    outs = subject.backend.generate(batch, 16, 1.3, seed=[5, 6, 7, 8], top_p=top_p)
    cut = 0
    for prompt, out in zip(batch, outs, strict=True):
        logits = scored(subject.model, prompt, out.token_ids)  # [N, V]
        logp = sampling_logprobs(logits, 1.3, top_p)  # [N, V]
        want = logp.gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]  # [N]
        assert torch.allclose(torch.tensor(out.logprobs), want, atol=subject.atol)
        cut += int(torch.isinf(logp).any(-1).sum())
    assert (cut > 0) == (top_p < 1.0), "top-p removed nothing: the test checked nothing"


def test_seeds_repeat_samples_and_differ_between_seeds(subject):
    batch = prompts(subject.policy)
    seeds = [11, 12, 13, 14]
    a = subject.backend.generate(batch, 16, 1.0, seed=seeds)
    b = subject.backend.generate(batch, 16, 1.0, seed=seeds)
    c = subject.backend.generate(batch, 16, 1.0, seed=[s + 100 for s in seeds])
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.token_ids for o in a] != [o.token_ids for o in c]


# ------------------------------------------------------------------------------ HF specifics


def test_shared_prefixes_group_a_tasks_samples_and_keep_a_token_to_generate_from():
    a, b = [1, 2, 3, 4, 5], [1, 2, 3, 9, 9, 9]
    cuts = shared_prefixes([a, b, a, [7], a + [6, 6], b])
    assert cuts[1] == cuts[5] == 5  # b's samples: all but b's last token
    assert cuts[0] == cuts[2] == cuts[4] == 4  # a's (a continued turn too): all but a's last
    assert cuts[3] == 0  # shares nothing
    assert shared_prefixes([a]) == [0] and shared_prefixes([a, a]) == [4, 4]


def test_shared_prefixes_generate_exactly_what_whole_prompts_do():
    """A GRPO turn: each task's samples share its prompt, later turns add their own history,
    and tasks share the tool listing. Prefilled once per group, the completions and log-probs
    are those of every prompt prefilled whole."""
    policy = scripted_policy()
    base = prompts(policy, 3)
    batch = [base[0], base[0], base[0] + [5, 6, 7], base[1], base[1] + [8] * 9, base[2], base[1]]
    assert sum(c > 0 for c in shared_prefixes(batch)) >= 5, "nothing shared: nothing checked"
    shared = HFBackend(policy.model, policy.tokenizer)
    whole = HFBackend(policy.model, policy.tokenizer, share_prefixes=False)
    seeds = list(range(len(batch)))
    for kwargs in ({"greedy": True}, {"temperature": 1.2, "seed": seeds}):
        got, want = shared.generate(batch, 12, **kwargs), whole.generate(batch, 12, **kwargs)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        for g, w in zip(got, want, strict=True):
            assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-5)


def test_a_kept_turn_prefills_only_its_new_tokens_and_generates_the_same():
    policy = scripted_policy()
    first = prompts(policy, 2) * 2
    fast = HFBackend(policy.model, policy.tokenizer)
    whole = HFBackend(policy.model, policy.tokenizer, share_prefixes=False)
    seeds = [1, 2, 3, 4]
    with fast.keeping():
        turn = fast.generate(first, 10, 1.0, seed=seeds)
        later = [p + o.token_ids + [7, 8, 9] for p, o in zip(first, turn, strict=True)]
        cuts, kvs = fast._cuts(later)
        assert all(kvs) and cuts == [
            len(p) + len(o.token_ids) - 1 for p, o in zip(first, turn, strict=True)
        ]
        got = fast.generate(later, 10, 1.0, seed=seeds)
        assert len(fast.kept) == len(later)  # the first turn's entries were consumed
    assert fast.kept is None
    want = whole.generate(later, 10, 1.0, seed=seeds)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-5)
    assert fast.generate(later, 10, 1.0, seed=seeds)[0].token_ids == got[0].token_ids  # no keep


# ------------------------------------------------------------------------------ HTTP specifics


def test_http_client_adds_nothing_to_the_backend_it_fronts(fake_server):
    """Same prompts and seeds: the HTTP client returns HFBackend's completions exactly."""
    policy = scripted_policy()
    batch, seeds = prompts(policy), [21, 22, 23, 24]
    args = (batch, 20, 1.3)
    local = HFBackend(policy.model, policy.tokenizer).generate(*args, seed=seeds, top_p=0.95)
    client = VLLMBackend(fake_server.url, policy.tokenizer.eos_token_id)
    remote = client.generate(*args, seed=seeds, top_p=0.95)
    assert [o.token_ids for o in remote] == [o.token_ids for o in local]
    assert [o.stopped for o in remote] == [o.stopped for o in local]
    for r, loc in zip(remote, local, strict=True):  # the server runs each prompt alone: 1e-5
        assert torch.allclose(torch.tensor(r.logprobs), torch.tensor(loc.logprobs), atol=1e-5)
    assert len({tuple(o.token_ids) for o in local}) > 1, "all samples alike: a weak check"


def test_engine_over_http_equals_engine_in_process(fake_server):
    """The rollout executor on `backend: vllm` (via rollout.vllm_url) gives the hf episodes."""
    from rollwise.rollout.engine import EpisodeSpec, Limits, clone_env
    from rollwise.rollout.executors import EXECUTORS

    policy = scripted_policy()
    tasks = policy.suite.split("train")[:4]

    def plan():
        return [
            EpisodeSpec(f"e/{t.task_id}/{k}", t, clone_env(policy.suite.envs[t.env_id]), "", k, k)
            for t in tasks
            for k in range(2)
        ]

    limits = Limits(max_turns=3, max_new_tokens=32, max_context=384, temperature=0.7, seed=3)
    hf = RolloutConfig(backend="hf")
    http = RolloutConfig(backend="vllm", vllm_url=fake_server.url)
    local, local_steps = EXECUTORS["local"](plan(), policy.policy_dir, policy.suite_dir, limits, hf)
    remote, remote_steps = EXECUTORS["local"](
        plan(), policy.policy_dir, policy.suite_dir, limits, http
    )
    assert local_steps == remote_steps and local_steps, "no tool call ran: nothing compared"
    assert_same_episodes(local, remote)


def test_launcher_reloads_new_weights_by_restart(tmp_path):
    from rollwise.policy.build import build_model, save_policy

    policy = scripted_policy()
    fresh = build_model(policy.tokenizer, TINY_POLICY)  # untrained: other greedy turns
    save_policy(fresh, policy.tokenizer, tmp_path / "round_01")
    batch = prompts(policy, 2)
    server = launch(policy.policy_dir, cmd=FAKE_VLLM, extra_args=[])
    try:
        client = VLLMBackend(server.url, policy.tokenizer.eos_token_id)
        before = client.generate(batch, 8, greedy=True)
        old = server.proc
        server = reload(server, tmp_path / "round_01")
        assert old.poll() is not None and server.url == client.url  # same port, new process
        after = client.generate(batch, 8, greedy=True)
    finally:
        stop(server)
    assert server.proc.poll() is not None
    want = HFBackend(fresh, policy.tokenizer).generate(batch, 8, greedy=True)
    assert [o.token_ids for o in after] == [o.token_ids for o in want]
    assert [o.token_ids for o in after] != [o.token_ids for o in before]


def test_launcher_reports_a_server_that_dies(tmp_path):
    with pytest.raises(RuntimeError, match="exited") as err:
        launch(tmp_path / "no-such-checkpoint", cmd=FAKE_VLLM, extra_args=[], timeout_s=120)
    assert "no config.json" in str(err.value)  # the log's tail says why


def test_client_refuses_completions_without_token_ids():
    with pytest.raises(RuntimeError, match="return_token_ids"):
        parse_choice({"text": "hi", "finish_reason": "stop"}, stop_id=2, url="http://x")
    choice = {"token_ids": [5, 2], "logprobs": {"token_logprobs": [-0.1, -0.2]}}
    assert parse_choice({**choice, "finish_reason": "stop"}, 2, "u").stopped
    assert not parse_choice({**choice, "finish_reason": "length"}, 2, "u").stopped


def test_backend_param_matches_the_dispatch_dict():
    from rollwise.config import ParamsError, validate

    assert set(get_args(RolloutConfig.model_fields["backend"].annotation)) == set(BACKENDS)
    with pytest.raises(ParamsError, match=r"rollout\.backend"):
        validate({"rollout": {"backend": "sglang"}})
    with pytest.raises(ParamsError, match=r"rollout\.top_p"):
        validate({"rollout": {"top_p": 0}})


# ------------------------------------------------------------------------------ top-p sampling


def test_row_sampler_draws_from_the_renormalized_nucleus():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])  # [V]
    rows, temperature, top_p = 20_000, 0.7, 0.9
    want = sampling_logprobs(logits, temperature, top_p).exp()  # [V]
    assert (want == 0).sum() == 2 and torch.isclose(want.sum(), torch.tensor(1.0))
    uniforms = torch.rand(rows, 1, generator=torch.Generator().manual_seed(0))  # [B, 1]
    sampler = RowSampler(uniforms, temperature, prompt_width=3, top_p=top_p)
    scores = sampler(torch.zeros(rows, 3, dtype=torch.long), logits.expand(rows, -1).clone())
    picks = scores.argmax(-1)  # [B]
    freq = torch.bincount(picks, minlength=5).float() / rows  # [V]
    assert torch.allclose(freq, want, atol=4 * math.sqrt(0.25 / rows))
    assert torch.allclose(sampler.logps[0], want.log()[picks])  # the log-prob of what was drawn


def test_nucleus_is_the_smallest_top_set_reaching_top_p():
    logp = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]]))  # [2, V]
    assert nucleus(logp, 0.3).tolist() == [[True, False, False, False], [True, True, True, True]]
    assert nucleus(logp, 0.6)[0].tolist() == [True, True, False, False]
    assert nucleus(logp, 0.81)[0].tolist() == [True, True, True, False]
    assert nucleus(logp, 1e-6)[0].tolist() == [True, False, False, False]  # the top token always
