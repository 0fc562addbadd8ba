"""Warm start: supervised fine-tuning on oracle trajectories, built with the rollout's own
token pieces so SFT and RL see identical formats."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import torch

from rollwise.envs.protocol import next_turn
from rollwise.policy.chat import (
    action_text,
    code_action_text,
    code_messages,
    encode,
    observation_text,
    prompt_ids,
    user_text,
)
from rollwise.train.optim import make_optimizer
from rollwise.types import Task, ToolCall

MAX_USER_TURNS = 100  # a demo whose user never stops is an environment bug, not a demo


def opening(task: Task, env, tokenizer, code=None) -> list[int]:
    """A demo's prompt ids as the rollout builds them: in code mode (`code`: the rollout's
    Limits) the code format, with the tools listed as the code's functions."""
    messages, tools = env.reset(task, seed=0), env.tools()
    if code is not None:
        messages, tools = code_messages(messages, tools), []
    return prompt_ids(tokenizer, messages, tools)


def oracle_texts(
    task: Task, env, tokenizer, code=None
) -> tuple[list[int], list[tuple[str, str | None]]]:
    """Prompt ids and the (action text, what follows it) turns of the oracle solution, in the
    engine's order: each user turn's oracle calls with their observations, then a reply (the
    task's answer); a multi-turn environment's next user turn follows that reply, and the last
    reply ends the conversation. A single-turn environment: its calls, then the answer.
    `code` (the rollout's Limits, rollout.action_mode: code): each user turn's calls as code a
    policy could write without seeing their results (rollout/code.py grounded_blocks: one block
    when it can, else a block a call), run in the sandbox as a rollout runs it."""
    from rollwise.rollout.code import execute_code, grounded_blocks

    prompt = opening(task, env, tokenizer, code)
    per_turn = env.oracle_turns(task) if hasattr(env, "oracle_turns") else [list(task.oracle)]
    turns: list[tuple[str, str | None]] = []
    eos = tokenizer.eos_token
    made: list = []  # the calls of earlier user turns (a dry run replays them)
    question = task.prompt
    for user_turn in range(MAX_USER_TURNS):
        calls = list(per_turn[user_turn]) if user_turn < len(per_turn) else []
        if code is not None and calls:
            results = dry_run(task, env, made + calls)[len(made) :]
            made += calls
            for source in grounded_blocks(calls, results, question):
                _, shown, _ = execute_code(env, source, code)
                observation = observation_text(tokenizer, shown)
                turns.append((code_action_text(source, eos=eos), observation))
            calls = []
        for call in calls:
            observation = observation_text(tokenizer, [env.step(call)])
            turns.append((action_text([call], eos=eos), observation))
        said = next_turn(env, task.answer)
        question += f"\n{said}" if said is not None else ""
        after = None if said is None else user_text(tokenizer, said)
        turns.append((action_text(answer=task.answer, eos=eos), after))
        if said is None:
            return prompt, turns
    raise ValueError(f"{task.task_id}: the user still speaks after {MAX_USER_TURNS} turns")


def dry_run(task: Task, env, calls: list) -> list[str]:
    """Each call's result content on a private copy of the environment from the task's start:
    what the oracle's calls return, known before the demo's code is written."""
    from rollwise.rollout.engine import clone_env

    probe = clone_env(env)
    probe.reset(task, seed=0)
    return [probe.step(call).content for call in calls]


def oracle_skill(task: Task, env):
    """The skill (memory/skills.py) the task's oracle calls abstract, their results read by a
    dry run."""
    from rollwise.memory.skills import induce

    calls = list(task.oracle)
    return induce(task.env_id, list(zip(calls, dry_run(task, env, calls), strict=True)))


def oracle_sequence(task: Task, env, tokenizer, code=None) -> tuple[list[int], list[int]]:
    """(token ids, loss mask): mask 1 on the assistant's tokens only (`code`: oracle_texts)."""
    return masked(*oracle_texts(task, env, tokenizer, code), tokenizer)


def skill_sequence(task: Task, env, tokenizer, skills: list) -> tuple[list[int], list[int]]:
    """oracle_sequence with `skills` offered as tools (memory.wrap, as rollout.memory offers a
    bank): one call to the skill that abstracts the task's oracle calls when it is offered (its
    expansion makes the same real calls), else the oracle's own calls, since not every offered
    skill fits. A multi-turn conversation (env.oracle_turns) keeps its own calls."""
    from rollwise.memory import wrap

    skilled = wrap(env, skills)
    own = oracle_skill(task, env) if not hasattr(env, "oracle_turns") else None
    fit = next((s for s in skills if own and s.skill_id == own.skill_id), None)
    if fit is not None:
        prompt = opening(task, skilled, tokenizer)
        call = ToolCall(fit.name, dict(own.example))
        shown = skilled.step(call)
        if shown.kind == "ok":
            eos = tokenizer.eos_token
            turns = [(action_text([call], eos=eos), observation_text(tokenizer, [shown])),
                     (action_text(answer=task.answer, eos=eos), None)]  # fmt: skip
            return masked(prompt, turns, tokenizer)
    return oracle_sequence(task, skilled, tokenizer)


def masked(prompt: list[int], turns: list, tokenizer) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of a prompt and its (action, what follows) turns: mask 1 on the
    actions' tokens only."""
    ids, mask = list(prompt), [0] * len(prompt)
    for action, observation in turns:
        piece = encode(tokenizer, action)
        ids, mask = ids + piece, mask + [1] * len(piece)
        if observation is not None:
            piece = encode(tokenizer, observation)
            ids, mask = ids + piece, mask + [0] * len(piece)
    return ids, mask


def direct_sequence(
    task: Task, env, tokenizer, answer: str, code=None
) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of the tool-free habit: the prompt, then `answer` at once, no call
    made and nothing read (warmstart.direct_answer_share)."""
    prompt = opening(task, env, tokenizer, code)
    piece = encode(tokenizer, action_text(answer=answer, eos=tokenizer.eos_token))
    return prompt + piece, [0] * len(prompt) + [1] * len(piece)


def balanced_draw(strata: list[str], rng) -> Callable[[int], list[int]]:
    """draw(n): n sequence indices, one per stratum in turn (a shuffled cycle over the strata,
    reshuffled each pass), each a random member of its stratum: a short SFT's few demos then
    cover every task kind about equally, whatever the suite's mix of kinds."""
    members: dict[str, list[int]] = {}
    for i, s in enumerate(strata):
        members.setdefault(s, []).append(i)
    order: list[str] = []

    def draw(n: int) -> list[int]:
        out = []
        for _ in range(n):
            if not order:
                order.extend(rng.sample(sorted(members), len(members)))
            out.append(rng.choice(members[order.pop()]))
        return out

    return draw


def pad_batch(seqs: list[tuple[list[int], list[int]]], pad_id: int):
    """Right-padded [B, T] ids, attention mask and loss mask."""
    width = max(len(ids) for ids, _ in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # [B, T]
    attn = torch.zeros_like(ids)  # [B, T]
    loss_mask = torch.zeros_like(ids, dtype=torch.float)  # [B, T]
    for i, (s, m) in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        loss_mask[i, : len(m)] = torch.tensor(m, dtype=torch.float)
    return ids, attn, loss_mask


def masked_nll(model, ids, attn, loss_mask) -> torch.Tensor:
    """Mean next-token NLL over the loss-mask tokens. The head runs on those positions only
    (~1/4 of an oracle sequence: the prompt and observations are context, not targets): the same
    loss as full logits, about a third less time per SFT step on 2 cores."""
    hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state  # [B, T, H]
    targets = loss_mask[:, 1:].bool()  # [B, T-1]
    logits = model.get_output_embeddings()(hidden[:, :-1][targets])  # [N, V]
    return torch.nn.functional.cross_entropy(logits, ids[:, 1:][targets])  # []


def sft(
    model,
    seqs: list[tuple[list[int], list[int]]],
    cfg,
    pad_id: int,
    on_step: Callable[[int, float], None] | None = None,
    stop: Callable[[int], bool] | None = None,
    strata: list[str] | None = None,
) -> list[float]:
    """Masked next-token cross-entropy, AdamW (or Muon + AdamW) with warmup and cosine decay
    over cfg.steps; returns losses. `stop(step)` after a step ends training early when true (the
    warm start's check of validation success); it must leave the model in train mode. With
    cfg.balance_kinds and `strata` (each sequence's task kind), batches cycle through the kinds."""
    if cfg.steps == 0:  # steps: 0 is "no warm start": the built model as it is
        model.eval()
        return []
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    opt = make_optimizer(model, cfg)  # cfg names its optimizer, lr, muon_lr, weight_decay
    warmup = max(1, cfg.steps // 20)

    def lr_scale(step: int) -> float:
        return min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))

    scheds = [torch.optim.lr_scheduler.LambdaLR(part, lr_scale) for part in opt.parts.values()]
    model.train()
    losses = []
    draw = balanced_draw(strata, rng) if cfg.balance_kinds and strata else None
    for step in range(cfg.steps):
        size = min(cfg.batch_size, len(seqs))
        batch = [seqs[i] for i in draw(size)] if draw else rng.sample(seqs, size)
        ids, attn, loss_mask = pad_batch(batch, pad_id)
        loss = masked_nll(model, ids, attn, loss_mask)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for sched in scheds:
            sched.step()
        losses.append(loss.item())
        if on_step:
            on_step(step, loss.item())
        if stop is not None and stop(step):
            break
    model.eval()
    return losses
