"""TRL's side of bench/peer_trl.py; runs under the TRL venv's python (.rollwise/venv-trl), never
the project's, with the project's src/ on PYTHONPATH for the environment runtime only.

TRL's GRPOTrainer in tool mode on the bench's tiny model: each generated environment becomes an
`environment_factory` class whose methods are its tools (TRL renders them from signatures and
docstrings and runs them in its tool loop, as it does `tools=`): the suite's tools change
per-episode state (cancel), which plain `tools=` functions cannot hold per rollout. Each method
calls the project's runtime (envs/runtime.py); the reward function runs the project's verifier.

Protocol (stdin/stdout; each stdout line "@peer " + a JSON object): {"ready": ...} once loaded;
then per line "go" on stdin one RL step (one generation batch and its optimizer steps) and a line
{"step", "seconds", "generated_tokens", ...}; after the last, {"peak_rss_bytes": ...}.

    .rollwise/venv-trl/bin/python bench/peer_trl_side.py --model DIR --suite DIR --plan FILE
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import os
import resource
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.chat_template_utils import qwen2_5_chat_template  # noqa: E402

from rollwise.envs.runtime import load_suite  # noqa: E402
from rollwise.types import ToolCall  # noqa: E402

JSON_TYPES = {"integer": int, "string": str, "number": float, "boolean": bool}


def say(obj: dict) -> None:
    """A protocol line: marked, since TRL prints dicts of its own to stdout."""
    print("@peer " + json.dumps(obj), flush=True)


def tool_method(spec):
    """A method named after the tool, typed and documented so TRL renders its schema; the body
    hands the call, arguments as given, to the environment runtime (which checks them)."""
    props = spec.parameters.get("properties", {})
    required = set(spec.parameters.get("required", []))

    def call(self, **arguments):
        obs = self.env.step(ToolCall(spec.name, arguments))
        self.calls.append(ToolCall(spec.name, arguments))
        return obs.content

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for name, schema in props.items():
        default = inspect.Parameter.empty if name in required else None
        annotation = JSON_TYPES.get(schema.get("type"), str)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=annotation))  # fmt: skip
    call.__name__ = call.__qualname__ = spec.name
    call.__signature__ = inspect.Signature(params)
    call.__annotations__ = {p.name: p.annotation for p in params[1:]}
    args = "".join(f"\n    {name}: {name}" for name in props)
    call.__doc__ = spec.description + (f"\n\nArgs:{args}" if props else "")
    return call


class TaskEnv:
    """One rollout's private copy of a generated environment (state made fresh in reset)."""

    prototype = None  # set per environment class
    tasks: dict = {}

    def reset(self, task_id: str, **_):
        self.env, self.calls = copy.copy(self.prototype), []
        self.env.reset(self.tasks[task_id], seed=0)


def env_classes(suite) -> dict:
    """{env_id: factory}: a TaskEnv subclass per environment, its tools as methods."""
    out = {}
    for env_id, proto in suite.envs.items():
        methods = {t.name: tool_method(t) for t in proto.tools()}
        out[env_id] = type(f"Env_{env_id}", (TaskEnv,), {"prototype": proto, **methods})
        out[env_id].tasks = suite.tasks
    return out


def verifier_reward(completions, environments, **_) -> list[float]:
    """The project's verifier on each rollout: the last assistant text is the answer (None if
    the rollout ended on a tool call)."""
    out = []
    for messages, env in zip(completions, environments, strict=True):
        last = messages[-1]
        answer = None if last.get("tool_calls") or last["role"] != "assistant" else last["content"]
        out.append(float(env.env.verify(answer, env.calls).reward))
    return out


class CountingTrainer(GRPOTrainer):
    """GRPOTrainer that counts the tokens it generates (every turn, tool results excluded)."""

    generated = 0

    def _generate_single_turn(self, *args, **kwargs):
        ids, logprobs = super()._generate_single_turn(*args, **kwargs)
        self.generated += sum(len(x) for x in ids)
        return ids, logprobs


class StepClock(TrainerCallback):
    """One RL step = `per_rl` optimizer steps (one generation batch): wait for "go" before it,
    report its seconds and generated tokens after it."""

    def __init__(self, per_rl: int):
        self.per_rl, self.trainer, self.t0, self.tokens0 = per_rl, None, 0.0, 0

    def on_step_begin(self, args, state, control, **kw):
        if state.global_step % self.per_rl == 0:
            if sys.stdin.readline().strip() != "go":
                raise SystemExit("peer_trl_side: stdin closed")
            self.t0, self.tokens0 = time.perf_counter(), self.trainer.generated

    def on_step_end(self, args, state, control, **kw):
        if state.global_step % self.per_rl == 0:
            metrics = self.trainer._metrics["train"]
            say({"step": state.global_step // self.per_rl - 1,
                 "seconds": time.perf_counter() - self.t0,
                 "generated_tokens": self.trainer.generated - self.tokens0,
                 "tool_call_frequency": metrics.get("tools/call_frequency", [None])[-1],
                 "reward": metrics.get("reward", [None])[-1]})  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--suite", required=True)
    parser.add_argument("--plan", required=True, help="JSON: task ids per step, bench settings")
    args = parser.parse_args()
    plan = json.loads(open(args.plan).read())
    s = plan["settings"]
    torch.set_num_threads(s["threads"])
    suite = load_suite(args.suite)
    tok = PreTrainedTokenizerFast.from_pretrained(args.model, padding_side="left")
    if tok.chat_template != qwen2_5_chat_template:
        raise SystemExit("peer_trl_side: the model's chat template is not TRL's qwen2_5 template")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    rows = [
        {"prompt": suite.envs[suite.tasks[t].env_id].reset(suite.tasks[t], seed=0),
         "task_id": t, "environment": suite.tasks[t].env_id}
        for step in plan["steps"] for t in step
    ]  # fmt: skip
    per_rl = s["epochs"] * s["minibatches"]
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="peer_trl_"),
        use_cpu=True,
        seed=s["seed"],
        per_device_train_batch_size=s["tasks"] * s["samples"] // s["minibatches"],
        steps_per_generation=s["minibatches"],
        num_iterations=s["epochs"],
        num_generations=s["samples"],
        max_steps=per_rl * len(plan["steps"]),
        shuffle_dataset=False,  # the plan's order: step k runs the same tasks as rollwise's
        learning_rate=s["lr"],
        lr_scheduler_type="constant",
        max_grad_norm=s["grad_clip"],
        epsilon=s["clip_low"],
        epsilon_high=s["clip_high"],
        beta=0.0,
        loss_type="dapo",  # token-level aggregation, as rollwise's token-mean
        temperature=s["temperature"],
        max_completion_length=s["max_completion"],
        generation_kwargs={"max_new_tokens": s["max_new_tokens"]},
        max_tool_calling_iterations=s["max_turns"] - 1,
        gradient_checkpointing=False,  # TRL's default is on; rollwise's (and this bench's) off
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    clock = StepClock(per_rl)
    trainer = CountingTrainer(
        model=model,
        reward_funcs=[verifier_reward],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        environment_factory=env_classes(suite),
        callbacks=[clock],
    )
    clock.trainer = trainer
    say({"ready": True, "trl_threads": torch.get_num_threads()})
    trainer.train()
    say({"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})


if __name__ == "__main__":
    main()
