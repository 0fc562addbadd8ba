"""The built warm start: a word-level tokenizer and a tiny Qwen2 from the suite's text, SFT on
the train split's oracle trajectories. The `warmstart` stage and the learning benches share it,
so a bench's warm start is the pipeline's round_00 (same demos, same tokenizer)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from rollwise.config import FaultsConfig, Params
from rollwise.envs.runtime import Suite, load_suite


def sft_warm_start(
    params: Params, suite: Suite, on_step: Callable[[int, float], None] | None = None
) -> tuple:
    """(model, tokenizer, losses, demos): a tokenizer and tiny Qwen2 built from `suite` and its
    augment suites, SFT on their train oracles; `on_step(step, loss)` reports progress."""
    from rollwise.policy.build import build_model
    from rollwise.train.sft import oracle_sequence, sft

    with tempfile.TemporaryDirectory() as scratch:
        demo_suites = [suite, *augment_suites(params, Path(scratch))]
        tokenizer = suite_tokenizer(*demo_suites)
        model = build_model(tokenizer, params.policy)
        train = [
            oracle_sequence(t, s.envs[t.env_id], tokenizer)
            for s in demo_suites
            for t in s.split("train")
        ]
    losses = sft(model, train, params.warmstart, tokenizer.pad_token_id, on_step=on_step)
    return model, tokenizer, losses, len(train)


def augment_suites(params: Params, scratch: Path) -> list[Suite]:
    """`warmstart.augment_suites` more suites from the generator with other seeds (fresh
    databases and tasks; all their tasks are demos). On the default suite alone SFT memorized
    its demos' answers instead of reading the observations (bench/results/generalization.json:
    54% train vs 18% held-out tasks of the same environments). The evaluation's environments and
    held-out tasks are untouched: these are other environments."""
    from rollwise.envs.generate import generate_suite

    if params.envs.custom and params.warmstart.augment_suites:
        raise ValueError("warmstart.augment_suites needs the synthetic suite (envs.custom is set)")
    suites = []
    for k in range(1, params.warmstart.augment_suites + 1):
        cfg = params.envs.model_copy(
            update={"seed": params.envs.seed + 7919 * k, "heldout_envs": 0,
                    "heldout_task_frac": 0.0, "faults": FaultsConfig()}
        )  # fmt: skip
        generate_suite(cfg, scratch / f"augment_{k}")
        suites.append(load_suite(scratch / f"augment_{k}"))
    return suites


def suite_tokenizer(*suites: Suite):
    """Word-level vocabulary from the suites' text (vocabulary only: held-out tasks teach nothing
    here, but their words must be tokens so unseen environments are not [UNK] soup)."""
    from rollwise.policy.build import train_tokenizer
    from rollwise.train.sft import oracle_texts

    scratch = train_tokenizer([])
    texts = [ERROR_WORDS]
    for suite, task in ((s, t) for s in suites for t in s.tasks.values()):
        env = suite.envs[task.env_id]
        msgs = env.reset(task, seed=0)
        tools = [t.to_openai() for t in env.tools()]
        texts.append(scratch.apply_chat_template(msgs, tools=tools, tokenize=False))
        texts += [piece for turn in oracle_texts(task, env, scratch)[1] for piece in turn if piece]
    return train_tokenizer(texts)


# The wording of error observations (runtime.py, chat.py, engine.py): the policy must read them.
ERROR_WORDS = (
    "error unknown tool takes exactly one argument must be integer string not found: environment "
    "malformed tool call unbalanced tags not valid JSON expected name arguments must be an object "
    "too many calls in one turn timed out reset failed after s busy an earlier has returned "
    "run this"
)
