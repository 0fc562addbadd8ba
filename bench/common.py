"""What every learning bench shares, written once: params from params.yaml plus overrides in the
pipeline's own dotted syntax, an arm as one more override set, the cached suite and warm start
(rollwise.loop.warm_start: the pipeline's round_00 for these params), and the rounds
themselves (rollwise.loop.run_rounds: the stages' own functions, in one process).

An arm is a params override set and nothing else, so its figure measures the pipeline."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rollwise import loop  # noqa: E402
from rollwise.artifacts import atomic_dir  # noqa: E402
from rollwise.config import (  # noqa: E402, F401  (parse_overrides: the benches' CLI)
    Params,
    apply_overrides,
    parse_overrides,
    read_raw,
    validate,
)
from rollwise.envs.runtime import Suite, load_suite  # noqa: E402


def bench_params(overrides: dict, params_file: Path = ROOT / "params.yaml") -> Params:
    """params.yaml with the bench's overrides; a bad key fails naming its path."""
    return validate(apply_overrides(read_raw(params_file), overrides))


def arm_params(p: Params, overrides: dict) -> Params:
    """An arm: the bench's params plus its own override set (pipeline syntax)."""
    return validate(apply_overrides(p.model_dump(), overrides), "arm overrides")


def seeded(seed: int) -> dict:
    """The overrides that make one seed of an arm: every stage's seed."""
    keys = ("schedule.seed", "rollout.seed", "train.seed", "curate.seed")
    return dict.fromkeys(keys, seed)


def key_of(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:10]


def suite_at(cache: Path, envs) -> tuple[Suite, Path]:
    """The generated suite of `envs` (an EnvsConfig), built once under `cache`."""
    from rollwise.envs.generate import generate_suite

    folder = Path(cache) / f"suite_{key_of(envs.model_dump())}"
    if not folder.exists():  # two seeds may share a cache: neither reads a half-built suite
        with atomic_dir(folder, keep_existing=True) as tmp:
            generate_suite(envs, tmp)
    return load_suite(folder), folder


def warm_start_folder(p: Params, suite: Suite, cache: Path, given: Path | None = None) -> Path:
    """The warm start's folder: built once per params under `cache` (loop.warm_start), or
    `given` (a saved policy folder: a partial warm start differs by machine, so comparisons
    share one)."""
    from rollwise.evaluate.folders import check_hf_folder

    if given is not None:
        check_hf_folder(given)
        return given
    base = None
    if p.policy.model:  # a pretrained model, converted once, then SFT'd (finetune_model)
        from rollwise.policy.build import load_policy, materialize_model

        folder = Path(cache) / f"model_{key_of(p.policy.model_dump())}"
        if not (folder / "config.json").exists():
            materialize_model(p.policy.model, folder, p.policy.tools_format)
        if not p.warmstart.finetune_model:
            return folder
        base = load_policy(folder)
    loop.warm_start(p, suite, cache, base=base)
    return Path(cache) / f"sft_{loop.warmstart_key(p)}"


def run_arm_rounds(
    p: Params,
    suite: Suite,
    folder: Path,
    guard_suite: Suite | None = None,
    on_round: Callable | None = None,
) -> tuple:
    """(model, tokenizer, final state): p.n_rounds rounds from the warm start in `folder`,
    exactly as the pipeline's stages run them; `on_round(r, loop.Round)` sees each round."""
    import torch

    from rollwise.policy.build import load_policy

    torch.set_num_threads(1)
    model, tokenizer = load_policy(folder)
    model, state = loop.run_rounds(p, suite, model, tokenizer, p.n_rounds, guard_suite, on_round)
    return model, tokenizer, state


def round_figures(r: int, done: loop.Round) -> dict:
    """What a bench keeps of each round: sampled success, KL moved, the guard's verdict."""
    stats = done.trained.metrics
    return {
        "round": r,
        "episodes": int(done.rollout.metrics["episodes"]),
        "sample_success": float(done.rollout.metrics["success_rate"]),
        "approx_kl": float(stats.get("approx_kl", 0.0)),
        **{k: v for k, v in stats.items() if k.startswith("guard_")},
    }


def reference_policy(model, cfg):
    """A frozen copy of the starting policy for train.kl_coef > 0 (what loop.run_rounds anchors
    to), for the bench-only experiments that call the trainer directly; else None."""
    import copy

    return copy.deepcopy(model).eval() if cfg.kl_coef > 0 else None


def oracle_items(suite: Suite, n: int, r: int, model, tok, p: Params) -> list[dict]:
    """`n` of the suite's train tasks' oracle trajectories (round `r` picks them), advantage +1
    on the policy tokens, the model's own log-probs as PPO's old policy: the trainer's update
    budget given a perfect signal, which bounds what any advantage could do with the same lr
    and steps."""
    import random

    from rollwise.train.sft import oracle_sequence
    from rollwise.train.trainer import policy_logprobs

    train = suite.split("train")
    if n > len(train):
        raise SystemExit(
            f"oracle control: {n} demos a round, the suite has {len(train)} train tasks"
        )
    items = []
    for t in random.Random(r).sample(train, n):
        ids, mask = oracle_sequence(t, suite.envs[t.env_id], tok)
        items.append({"ids": ids, "mask": mask, "adv": [float(m) for m in mask],
                      "logprobs": [0.0] * len(ids)})  # fmt: skip
    old = policy_logprobs(model, items, p.train, tok.pad_token_id, p.rollout.temperature)
    return [{**it, "logprobs": list(lp)} for it, lp in zip(items, old, strict=True)]


def run_oracle_rounds(
    p: Params, suite: Suite, model, tok, rounds: int, n: int, on_round: Callable | None = None
):
    """The oracle-demo control: `rounds` rounds of `n` oracle trajectories each through the
    pipeline's trainer (no rollout), its optimizer and reference kept across rounds as
    loop.run_rounds keeps them; `on_round(r, model, stats)` after each. Returns the model."""
    from rollwise.train.trainer import make_optimizer, train_round

    opt, ref, steps = make_optimizer(model, p.train), reference_policy(model, p.train), 0
    for r in range(1, rounds + 1):
        items = oracle_items(suite, n, r, model, tok, p)
        stats = train_round(model, items, p.train, opt, tok.pad_token_id, ref,
                            temperature=p.rollout.temperature, steps_before=steps)  # fmt: skip
        steps += int(stats.get("optimizer_steps", 0) + stats.get("nonfinite_steps", 0))
        if on_round is not None:
            on_round(r, model, stats)
    return model


def run_sft_control(p: Params, suite: Suite, model, tok, rounds: int, n: int, on_round=None):
    """The supervised reference at equal demos: the warm start's own SFT continued (sft(): its
    optimizer, batch and schedule) for `rounds` x `n` demos drawn from the demos it was built
    from (the suite's train oracles and the augment suites: other databases, so none of it can
    be memorized for the held-out tasks); `on_round(r, model)` after every n demos. What the
    trainer's oracle control gains below this is the update's cost, not the signal's."""
    import tempfile

    from rollwise.train.sft import sft
    from rollwise.train.warmstart import augment_suites, demo_limits, demos_with_kinds

    w = p.warmstart
    with tempfile.TemporaryDirectory() as scratch:
        suites = [suite, *augment_suites(p, Path(scratch))]
        seqs, kinds = demos_with_kinds(suites, tok, w.direct_answer_share, w.seed, demo_limits(p))
    per_round = max(1, n // w.batch_size)
    cfg = w.model_copy(update={"steps": rounds * per_round, "seed": w.seed + 1})

    def each(step: int, loss: float) -> None:
        if on_round is not None and (step + 1) % per_round == 0:
            on_round((step + 1) // per_round, model)
            model.train()

    sft(model, seqs, cfg, tok.pad_token_id, on_step=each, strata=kinds)  # the warm start's draw
    return model


class ScriptedBackend:
    """A scripted policy behind the policy backend contract: turn k of an episode is its
    script's k-th turn (the script found by the task prompt), cut to the token room like a
    model's. `cut_is_stop`: a cut turn still counts as ended (else the engine ends the episode
    on max_tokens, as it would a model's)."""

    def __init__(self, tok, scripts: dict[str, list[str]], cut_is_stop: bool = False):
        self.tok, self.scripts, self.cut_is_stop = tok, scripts, cut_is_stop

    def generate(self, prompts, max_new_tokens, temperature=1.0, greedy=False, seed=None,
                 top_p=1.0):  # fmt: skip
        from rollwise.policy.chat import encode
        from rollwise.policy.hf import Completion

        out = []
        for p in prompts:
            text = self.tok.decode(p)
            script = next(v for k, v in self.scripts.items() if f"user\n{k}<|im_end|>" in text)
            ids = encode(self.tok, script[text.count("<|im_start|>assistant") - 1])
            kept = ids[:max_new_tokens]
            stopped = self.cut_is_stop or len(ids) <= max_new_tokens
            out.append(Completion(kept, [0.0] * len(kept), stopped=stopped))
        return out
