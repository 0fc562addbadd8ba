"""Collapse guard: a round's update is kept only if greedy success on a fixed set of train tasks
did not fall more than `train.guard.max_drop` below the checkpoint the round started from
(`against: start`) or below the best checkpoint the run has kept (`against: best`, which also
stops a slide of a few points a round); else the round's checkpoint is its start, weights and
optimizer moments unchanged, and the next round tries again with fresh samples. Why: at a
learning rate that moves the policy, a few runs in ten fell 8-12 held-out points within a round
or two, and sampled success on the round's own tasks could rise while greedy success fell
(README: Credit assignment), so the check decodes greedily. Train tasks only, ordered by a hash
of their ids: the held-out split stays unseen. `suite: validation` takes them from the warm
start's validation suite instead, whose environments no stage trains on: a round that gains on
the trained environments and loses on new ones is undone too (README: Where it stands)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rollwise.config import GuardConfig


@dataclass(frozen=True)
class Verdict:
    start: float  # greedy validation success of the round's start
    after: float  # ... of the updated policy
    kept: bool  # False: the update was undone
    best: float  # ... of the best checkpoint kept before this round (>= start)

    @property
    def kept_success(self) -> float:
        """Validation success of the checkpoint the round leaves: the next round's start."""
        return self.after if self.kept else self.start

    @property
    def best_success(self) -> float:
        """The best kept checkpoint's validation success after this round: the next's `best`."""
        return max(self.best, self.kept_success)

    def metrics(self) -> dict[str, float]:
        return {"guard_start": self.start, "guard_after": self.after, "guard_best": self.best,
                "guard_reverted": float(not self.kept)}  # fmt: skip


def judge(start: float, after: float, cfg: GuardConfig, best: float | None = None) -> Verdict:
    """Keep unless success fell more than max_drop below the start, or with `against: best`
    below the best kept checkpoint (`best`; None: the start). A tie at the threshold is kept."""
    best = start if best is None else max(best, start)
    reference = best if cfg.against == "best" else start
    return Verdict(start, after, after >= reference - cfg.max_drop - 1e-9, best)


def validation_success(model, tokenizer, suite, cfg: GuardConfig, limits) -> float:
    """Greedy success on the first `cfg.tasks` train tasks (evaluate/full.py's stable order),
    under `limits` (loop.greedy_limits: the evaluated interface)."""
    from rollwise.evaluate.full import evaluate_policy, evaluation_tasks
    from rollwise.policy.hf import HFBackend

    tasks = evaluation_tasks(suite, "train", cfg.tasks)
    if not tasks:
        raise ValueError("train.guard: the suite has no train tasks to validate on")
    training = model.training
    episodes = evaluate_policy(HFBackend(model, tokenizer), tokenizer, suite, tasks, limits)
    model.train(training)  # HFBackend put it in eval mode
    return float(episodes["success"].mean())


def validation_guard_suite(params, folder, tokenizer):
    """`suite: validation`'s suite, generated into `folder`. Refused when the guard's tasks hold
    words the policy's tokenizer lacks (a built warm start has them only with stop_at_success)."""
    from rollwise.evaluate.full import evaluation_tasks
    from rollwise.train.warmstart import validation_suite

    suite = validation_suite(params, folder)
    unknown = tokenizer.unk_token_id
    for task in evaluation_tasks(suite, "train", params.train.guard.tasks):
        if unknown is not None and unknown in tokenizer(task.prompt)["input_ids"]:
            raise ValueError(
                "train.guard.suite: validation: the validation suite's words are not the "
                f"policy's tokens (task {task.task_id}); build the warm start with "
                "warmstart.stop_at_success set, which adds them, or use suite: train"
            )
    return suite


def travelled_kl(stats: dict) -> float:
    """The KL a round moved the policy (SPO's drift): its approx_kl, 0 if the guard undid it."""
    return 0.0 if stats.get("guard_reverted") else float(stats.get("approx_kl", 0.0))


def as_record(verdict: Verdict, cfg: GuardConfig) -> dict:
    """What a checkpoint folder keeps of its guard check (start_success reads it back)."""
    return {"tasks": cfg.tasks, "suite": cfg.suite, **asdict(verdict),
            "kept_success": verdict.kept_success, "best_success": verdict.best_success}  # fmt: skip
