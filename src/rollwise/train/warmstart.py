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
    params: Params,
    suite: Suite,
    on_step: Callable[[int, float], None] | None = None,
    checks: list[dict] | None = None,
    base: tuple | None = None,
) -> tuple:
    """(model, tokenizer, losses, demos): a tokenizer and tiny Qwen2 built from `suite` and its
    augment suites, or the pretrained (model, tokenizer) `base`, SFT on their train oracles;
    `on_step(step, loss)` reports progress. With warmstart.stop_at_success, each validation check
    is appended to `checks`."""
    from rollwise.policy.build import build_model
    from rollwise.train.sft import sft

    w = params.warmstart
    with tempfile.TemporaryDirectory() as scratch:
        demo_suites = [suite, *augment_suites(params, Path(scratch))]
        validation = None
        if w.stop_at_success is not None:  # its words are tokens too, as held-out tasks' are
            if params.envs.custom:
                raise ValueError(
                    "warmstart.stop_at_success needs the synthetic suite (envs.custom is set)"
                )
            validation = validation_suite(params, Path(scratch) / "validation")
        if base is None:
            code = params.rollout.action_mode == "code"
            tokenizer = suite_tokenizer(*demo_suites, *([validation] if validation else []),
                                        code=code)  # fmt: skip
            model = build_model(tokenizer, params.policy)
        else:  # a pretrained model's own tokenizer reads every word
            model, tokenizer = base
        train, kinds = demos_with_kinds(
            demo_suites,
            tokenizer,
            w.direct_answer_share,
            w.seed,
            demo_limits(params),
            w.skill_demos,
            params.rollout.memory.per_env,
        )
        if not train and w.steps:
            raise ValueError(
                "warm start: the suite has no train task to demonstrate (every environment "
                "held out: envs.heldout_envs >= envs.n_envs?)"
            )
        stop = None
        if validation is not None:
            stop = success_check(model, tokenizer, validation, params, checks)
        losses = sft(model, train, w, tokenizer.pad_token_id, on_step, stop, strata=kinds)
    return model, tokenizer, losses, len(train)


def demos(suites: list[Suite], tokenizer, direct_share: float, seed: int) -> list[tuple]:
    """The SFT sequences: every train task's oracle trajectory, except a seeded `direct_share`
    of them answered at once with another task's answer (the tool-free habit of a chat model
    that guesses instead of looking up: what agentic RL has to unlearn)."""
    return demos_with_kinds(suites, tokenizer, direct_share, seed)[0]


def demo_limits(params: Params):
    """What the demos act in: None for direct tool calls, else the rollout's Limits
    (rollout.action_mode: code), whose sandbox runs each oracle code action."""
    from rollwise.loop import limits_of

    return limits_of(params, 0) if params.rollout.action_mode == "code" else None


def demos_with_kinds(
    suites: list[Suite],
    tokenizer,
    direct_share: float,
    seed: int,
    code=None,
    skill_share: float = 0.0,
    per_env: int = 4,
) -> tuple[list[tuple], list[str]]:
    """demos() and each one's task kind ("direct" for a guessed answer): the strata a balanced
    SFT draw cycles through (warmstart.balance_kinds). `code`: demo_limits(). `skill_share` of
    the oracle demos (warmstart.skill_demos) offer their environment's demo_skills."""
    import random

    from rollwise.train.sft import direct_sequence, oracle_sequence, skill_sequence

    rng, skill_rng = random.Random(seed), random.Random(f"skills-{seed}")  # direct draws kept
    out, kinds = [], []
    for s in suites:
        tasks = s.split("train")
        offered = demo_skills(s, per_env) if skill_share else {}
        for t in tasks:
            env = s.envs[t.env_id]
            if direct_share and rng.random() < direct_share:
                wrong = [o.answer for o in rng.sample(tasks, min(8, len(tasks)))]
                wrong = [a for a in wrong if a != t.answer] or ["unknown"]
                out.append(direct_sequence(t, env, tokenizer, wrong[0], code))
                kinds.append("direct")
            elif offered.get(t.env_id) and skill_rng.random() < skill_share:
                out.append(skill_sequence(t, env, tokenizer, offered[t.env_id]))
                kinds.append(t.kind)
            else:
                out.append(oracle_sequence(t, env, tokenizer, code))
                kinds.append(t.kind)
    return out, kinds


def demo_skills(suite: Suite, per_env: int) -> dict[str, list]:
    """env_id -> the skills its multi-call train oracles abstract, the `per_env` most common
    (ties by id): the bank a skill-use demo offers, as the curator's bank would hold them once
    the policy solves such tasks."""
    from collections import Counter

    from rollwise.train.sft import oracle_skill

    found: dict[str, Counter] = {}
    skills = {}
    for t in suite.split("train"):
        env = suite.envs[t.env_id]
        if len(t.oracle) < 2 or hasattr(env, "oracle_turns"):
            continue
        skill = oracle_skill(t, env)
        skills[skill.skill_id] = skill
        found.setdefault(t.env_id, Counter())[skill.skill_id] += 1
    return {
        env_id: [skills[k] for k, _ in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:per_env]]
        for env_id, c in found.items()
    }


def success_check(model, tokenizer, suite: Suite, params: Params, checks: list[dict] | None):
    """stop(step) for sft: every check_every steps, greedy success on check_tasks of `suite`;
    true once it reaches stop_at_success."""
    from rollwise.evaluate.full import evaluate_policy, evaluation_tasks
    from rollwise.loop import greedy_limits
    from rollwise.policy.hf import HFBackend

    w = params.warmstart
    tasks = evaluation_tasks(suite, "train", w.check_tasks)
    limits = greedy_limits(params)
    checks = [] if checks is None else checks

    def stop(step: int) -> bool:
        if (step + 1) % w.check_every:
            return False
        episodes = evaluate_policy(HFBackend(model, tokenizer), tokenizer, suite, tasks, limits)
        model.train()  # evaluation left it in eval mode; SFT goes on
        checks.append({"step": step + 1, "validation_success": float(episodes["success"].mean())})
        return checks[-1]["validation_success"] >= w.stop_at_success

    return stop


def augment_suites(params: Params, scratch: Path) -> list[Suite]:
    """`warmstart.augment_suites` more suites from the generator with other seeds (fresh
    databases and tasks; all their tasks are demos). On the default suite alone SFT memorized
    its demos' answers instead of reading the observations (bench/results/generalization.json:
    54% train vs 18% held-out tasks of the same environments). The evaluation's environments and
    held-out tasks are untouched: these are other environments."""
    if params.envs.custom and params.warmstart.augment_suites:
        raise ValueError("warmstart.augment_suites needs the synthetic suite (envs.custom is set)")
    n = params.warmstart.augment_suites
    return [fresh_suite(params, scratch / f"augment_{k}", k) for k in range(1, n + 1)]


def fresh_suite(params: Params, folder: Path, k: int) -> Suite:
    """The k-th suite of the generator at another seed: all tasks in train, no faults."""
    from rollwise.envs.generate import generate_suite

    cfg = params.envs.model_copy(
        update={"seed": params.envs.seed + 7919 * k, "heldout_envs": 0,
                "heldout_task_frac": 0.0, "faults": FaultsConfig()}
    )  # fmt: skip
    generate_suite(cfg, folder)
    return load_suite(folder)


def validation_suite(params: Params, folder: Path) -> Suite:
    """The generator's suite after the augment suites: the stop rule's validation tasks (its
    words are in the built tokenizer when stop_at_success is set), in environments no stage
    trains on; `train.guard.suite: validation` and bench/unseen.py read it too."""
    if params.envs.custom:
        raise ValueError("the validation suite needs the synthetic suite (envs.custom is set)")
    return fresh_suite(params, folder, params.warmstart.augment_suites + 1)


def suite_tokenizer(*suites: Suite, code: bool = False):
    """Word-level vocabulary from the suites' text (vocabulary only: held-out tasks teach nothing
    here, but their words must be tokens so unseen environments are not [UNK] soup). `code`:
    code actions' words too (rollout.action_mode: code): the code prompt and the demos' code
    (train/sft.py; its results are the direct observations' values)."""
    from rollwise.policy.build import train_tokenizer
    from rollwise.policy.chat import code_action_text, code_messages
    from rollwise.rollout.code import grounded_blocks
    from rollwise.train.sft import dry_run, oracle_texts

    scratch = train_tokenizer([])
    texts = [ERROR_WORDS, *([CODE_ERROR_WORDS] if code else [])]
    for suite, task in ((s, t) for s in suites for t in s.tasks.values()):
        env = suite.envs[task.env_id]
        msgs = env.reset(task, seed=0)
        tools = [t.to_openai() for t in env.tools()]
        texts.append(scratch.apply_chat_template(msgs, tools=tools, tokenize=False))
        texts += [piece for turn in oracle_texts(task, env, scratch)[1] for piece in turn if piece]
        if code:
            opening = code_messages(msgs, env.tools())
            texts.append(scratch.apply_chat_template(opening, tokenize=False))
            calls = list(task.oracle)
            blocks = grounded_blocks(calls, dry_run(task, env, calls), task.prompt) if calls else []
            texts += [code_action_text(block) for block in blocks]
    return train_tokenizer(texts)


# The wording of error observations (runtime.py, chat.py, engine.py): the policy must read them.
ERROR_WORDS = (
    "error unknown tool takes exactly one argument must be integer string not found: environment "
    "malformed tool call unbalanced tags not valid JSON expected name arguments must be an object "
    "too many calls in one turn timed out reset failed after s busy an earlier has returned "
    "run this"
)
# ... and of a code action's (sandbox/, rollout/code.py).
CODE_ERROR_WORDS = (
    "Error: ImportError NameError TypeError ValueError KeyError IndexError SyntaxError ToolError "
    "AttributeError ZeroDivisionError RecursionError TimeoutError MemoryError is not allowed "
    "True False None print len"
)
