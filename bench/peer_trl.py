"""The peer side by side (COMPASS P9): one full RL step of rollwise against TRL's GRPOTrainer in
tool mode, the same tiny model, tasks, limits and update shape, both on this machine.

One RL step: `--tasks` tasks x rollout.samples_per_task samples, the multi-turn tool loop with at
most rollout.max_new_tokens (64) new tokens a turn and rollout.max_turns turns, GRPO advantages
and the update (train.epochs x train.minibatches optimizer steps, AdamW, clip 0.2/0.28, no KL).
  rollwise  rollwise_step below: one round of rollwise.loop.run_round (rollout, curate, credit
            GRPO, train), the pipeline's own round
  TRL       bench/peer_trl_side.py under a venv of its own (.rollwise/venv-trl, made here when
            missing), so TRL's pins never touch the project's: environment_factory classes whose
            methods call the project's environment runtime, the project's verifier as reward
The model: TRL's tool mode accepts only chat templates byte-identical to its bundled ones, so the
bench's tiny Qwen2 (policy section, max_context raised to fit the JSON tool list) carries TRL's
qwen2_5 template (ChatML + Hermes tool calls, read from the TRL venv) and a word-level tokenizer
over the suite rendered with it, then `--sft-steps` of SFT on the train oracles so that it calls
tools (an untrained model would never enter the tool loop). Saved once; both sides load it.
Each side runs in its own process (its own peak RSS), one torch thread each, steps interleaved
(only one side computes at a time; the order alternates), the first `--warmup` steps untimed.
Writes bench/results/peer_trl.json.

    nice -n 10 .venv/bin/python bench/peer_trl.py [--steps 4] [--warmup 1] [--tasks 8] \
        [--sft-steps 400] [key=value overrides of params.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
import weakref
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import key_of  # noqa: E402
from bench.provenance import STARTED_AT  # noqa: E402
from rollwise.config import EnvsConfig, apply_overrides, read_raw, validate  # noqa: E402
from rollwise.envs.generate import generate_suite  # noqa: E402
from rollwise.envs.runtime import load_suite  # noqa: E402
from rollwise.policy.build import build_model, load_policy, save_policy  # noqa: E402
from rollwise.policy.chat import prompt_ids  # noqa: E402
from rollwise.rollout.engine import clone_env  # noqa: E402
from rollwise.train.sft import oracle_sequence, oracle_texts, sft  # noqa: E402
from rollwise.train.warmstart import ERROR_WORDS  # noqa: E402

TRL_VENV = ROOT / ".rollwise" / "venv-trl"
TRL_PINS = ["trl==1.16.0", "transformers==5.24.0", "tokenizers==0.23.3"]
TORCH_PIN = "torch==2.13.0"  # first, alone: the CPU wheel (unpinned, pip takes a CUDA build)
BENCH_OVERRIDES = {"rollout.max_new_tokens": 64, "policy.max_context": 1024}
SFT_BATCH = 8  # prompts run ~700 tokens (JSON tool lists): a short SFT that still calls tools
OUT = ROOT / "bench" / "results" / "peer_trl.json"
MARK = "@peer "  # protocol lines of both sides (bench/peer_trl_side.py writes the same)
_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (round, its state)


# ------------------------------------------------------------------------------ pure helpers
def plan_steps(pool: list[str], n_steps: int, n_tasks: int, seed: int) -> list[list[str]]:
    """The task ids of each RL step, drawn without replacement within a step; both sides run
    step k on the same tasks."""
    return [random.Random(seed * 1000 + k).sample(pool, n_tasks) for k in range(n_steps)]


def side_order(step: int) -> tuple[str, str]:
    """Which side runs step k first: alternating, so drift in the machine's load hits both."""
    return ("rollwise", "trl") if step % 2 == 0 else ("trl", "rollwise")


def summarize(steps: list[dict], warmup: int, peak_rss_bytes: int) -> dict:
    """Median seconds per timed step, generated tokens/s over the timed steps, peak RSS."""
    timed = [s for s in steps if s["step"] >= warmup]
    if not timed:
        raise ValueError(f"no timed steps: {len(steps)} steps, {warmup} warm-up")
    seconds = sum(s["seconds"] for s in timed)
    return {
        "seconds_per_step": statistics.median(s["seconds"] for s in timed),
        "step_seconds": [round(s["seconds"], 3) for s in timed],
        "generated_tokens_per_s": sum(s["generated_tokens"] for s in timed) / seconds,
        "generated_tokens_per_step": statistics.mean(s["generated_tokens"] for s in timed),
        "peak_rss_gb": peak_rss_bytes / 1e9,
    }


def step_ratio(rollwise: dict, trl: dict) -> float:
    return rollwise["seconds_per_step"] / trl["seconds_per_step"]


# ------------------------------------------------------------------------------ the TRL venv
def ensure_trl_venv(venv: Path = TRL_VENV) -> Path:
    """The TRL venv's python, creating the venv first when it is missing (torch first and
    pinned, then TRL with the project's transformers/tokenizers versions)."""
    python = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", TORCH_PIN], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *TRL_PINS], check=True)
        (venv / ".installed").write_text("\n".join([TORCH_PIN, *TRL_PINS]) + "\n")
    return python


def trl_template(python: Path, name: str = "qwen2_5") -> str:
    """A chat template bundled with TRL, read from the TRL venv (byte for byte)."""
    code = f"import trl.chat_template_utils as u; print(u._CHAT_TEMPLATES_DIR / '{name}.jinja')"
    path = subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True)
    return Path(path.stdout.strip()).read_text(encoding="utf-8")


# ------------------------------------------------------------------------------ the model
def bench_tokenizer(suite, template: str):
    """Word-level tokenizer over the suite's prompts rendered with `template`, the oracle turns
    and the runtime's error words; the template is its chat template."""
    from rollwise.policy.build import train_tokenizer

    scratch = train_tokenizer([])
    scratch.chat_template = template
    texts = [ERROR_WORDS]
    for task in suite.tasks.values():
        env = suite.envs[task.env_id]
        tools = [t.to_openai() for t in env.tools()]
        texts.append(scratch.apply_chat_template(env.reset(task, 0), tools=tools, tokenize=False))
        texts += [p for turn in oracle_texts(task, env, scratch)[1] for p in turn if p]
    tok = train_tokenizer(texts)
    tok.chat_template = template
    return tok


def prepare(p, cache: Path, template: str, sft_steps: int) -> tuple[Path, Path]:
    """(suite folder, model folder), cached by their settings."""
    suite_dir = cache / f"suite_{key_of(p.envs.model_dump())}"
    if not suite_dir.exists():
        generate_suite(p.envs, suite_dir)
    folder = cache / f"model_{key_of(p.envs.model_dump(), p.policy.model_dump(), sft_steps)}"
    if not folder.exists():
        suite = load_suite(suite_dir)
        tok = bench_tokenizer(suite, template)
        model = build_model(tok, p.policy)
        demos = [oracle_sequence(t, suite.envs[t.env_id], tok) for t in suite.split("train")]
        w = p.warmstart.model_copy(update={"steps": sft_steps, "batch_size": SFT_BATCH})
        sft(model, demos, w, tok.pad_token_id)
        info = {"sft_steps": sft_steps, "sft_batch": SFT_BATCH, "chat_template": "trl qwen2_5"}
        save_policy(model, tok, folder, info)
    return suite_dir, folder


# ------------------------------------------------------------------------------ rollwise's side
def rollwise_step(model, tok, suite, params, task_ids: list[str], seed: int) -> dict:
    """One rollwise RL step: one round of the pipeline (rollwise.loop.run_round: rollout,
    curate, credit, train) on exactly these tasks (the suite's catalog narrowed to them, so the
    scheduler plans them all). The round state (optimizer moments included) lives across steps
    with the model."""
    import copy

    from rollwise import loop

    narrowed = copy.copy(suite)
    narrowed.catalog = suite.catalog[suite.catalog["task_id"].isin(task_ids)]
    r, state = _STATES.get(model, (0, loop.RoundState()))
    cfg = params.model_copy(update={"schedule": params.schedule.model_copy(
        update={"tasks_per_round": len(task_ids), "seed": seed})})  # fmt: skip
    state, done = loop.run_round(cfg, narrowed, model, tok, state, r + 1)
    _STATES[model] = (r + 1, state)
    episodes = done.rollout.episodes
    return {"generated_tokens": int(done.rollout.metrics["generated_tokens"]),
            "tool_calls_per_episode": float(episodes["tool_calls"].mean()),
            "reward": float(episodes["reward"].mean()),
            "optimizer_steps": done.trained.metrics.get("optimizer_steps", 0.0)}  # fmt: skip


def rollwise_side(model_dir: Path, suite_dir: Path, plan: dict, overrides: list[str]) -> None:
    """The rollwise process: the same stdin/stdout protocol as bench/peer_trl_side.py."""
    torch.set_num_threads(plan["settings"]["threads"])
    p = bench_params(overrides)
    model, tok = load_policy(model_dir)
    suite = load_suite(suite_dir)
    print(MARK + json.dumps({"ready": True}), flush=True)
    for k, task_ids in enumerate(plan["steps"]):
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("rollwise side: stdin closed")
        t0 = time.perf_counter()
        out = rollwise_step(model, tok, suite, p, task_ids, plan["settings"]["seed"] * 1000 + k)
        line = {"step": k, "seconds": time.perf_counter() - t0, **out}
        print(MARK + json.dumps(line), flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(MARK + json.dumps({"peak_rss_bytes": rss}), flush=True)


# ------------------------------------------------------------------------------ both
def prompt_length(suite, tok, task_id: str) -> int:
    task = suite.tasks[task_id]
    env = clone_env(suite.envs[task.env_id])
    return len(prompt_ids(tok, env.reset(task, 0), env.tools()))


def bench_params(overrides: list[str]):
    raw = read_raw(ROOT / "params.yaml")
    raw = apply_overrides(raw, {**BENCH_OVERRIDES, **dict(o.split("=", 1) for o in overrides)})
    p = validate(raw)
    if p.train.optimizer != "adamw" or p.train.kl_coef or p.train.tis_cap:
        raise SystemExit("peer_trl: TRL's side mirrors AdamW, no KL, no TIS; keep train so")
    return p.model_copy(update={"envs": EnvsConfig()})  # the generator's defaults


def settings(p, args, max_prompt: int) -> dict:
    """What TRL's side mirrors of rollwise's settings."""
    t, r = p.train, p.rollout
    return {"threads": 1, "seed": args.seed, "tasks": args.tasks, "samples": r.samples_per_task,
            "epochs": t.epochs, "minibatches": t.minibatches, "lr": t.lr,
            "grad_clip": t.grad_clip, "clip_low": t.clip_low, "clip_high": t.clip_high,
            "temperature": r.temperature, "max_new_tokens": r.max_new_tokens,
            "max_turns": r.max_turns,
            "max_completion": p.policy.max_context - max_prompt}  # fmt: skip


class Side:
    """A side's process: send "go", read its step line."""

    def __init__(self, name: str, argv: list[str], env: dict):
        self.name, self.lines = name, []
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env, cwd=ROOT)  # fmt: skip
        self.ready = self.read()

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        raise RuntimeError(f"{self.name} side exited ({self.proc.wait()}) before answering")

    def step(self) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        self.lines.append(self.read())
        print(self.name, json.dumps(self.lines[-1]), flush=True)
        return self.lines[-1]

    def finish(self) -> int:
        rss = self.read()["peak_rss_bytes"]
        self.proc.wait()
        return rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="RL steps per side, warm-up included")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--sft-steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=ROOT / ".rollwise" / "peer_trl")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--side", choices=["rollwise"], help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--suite", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    if args.side == "rollwise":
        return rollwise_side(args.model, args.suite, json.loads(args.plan.read_text()), overrides)
    torch.set_num_threads(1)
    p = bench_params(overrides)
    python = ensure_trl_venv()
    suite_dir, model_dir = prepare(p, args.cache, trl_template(python), args.sft_steps)
    suite = load_suite(suite_dir)
    model, tok = load_policy(model_dir)
    n_params = sum(x.numel() for x in model.parameters())
    pool = sorted(t.task_id for t in suite.split("train"))
    steps = plan_steps(pool, args.steps, args.tasks, args.seed)
    prompts = [prompt_length(suite, tok, t) for step in steps for t in step]
    plan = {"settings": settings(p, args, max(prompts)), "steps": steps}
    plan_file = args.cache / "plan.json"
    plan_file.write_text(json.dumps(plan))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
           "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}  # fmt: skip
    common = ["--model", str(model_dir), "--suite", str(suite_dir), "--plan", str(plan_file)]
    sides = {
        "rollwise": Side(
            "rollwise", [sys.executable, __file__, "--side", "rollwise", *common, *overrides], env
        ),  # fmt: skip
        "trl": Side("trl", [str(python), str(ROOT / "bench" / "peer_trl_side.py"), *common], env),
    }
    for k in range(args.steps):
        for name in side_order(k):
            sides[name].step()
    rss = {name: side.finish() for name, side in sides.items()}
    result = {name: summarize(side.lines, args.warmup, rss[name]) for name, side in sides.items()}
    write(args, plan, prompts, n_params, result, sides)


def write(args, plan, prompts, n_params: int, result: dict, sides: dict) -> None:
    out = {
        "rollwise_vs_trl_step_ratio": step_ratio(result["rollwise"], result["trl"]),
        "target_ratio": 0.5,
        **result,
        "steps": {name: side.lines for name, side in sides.items()},
        "setup": {
            **plan["settings"],
            "steps": args.steps,
            "warmup": args.warmup,
            "sft_steps": args.sft_steps,
            "trl": TRL_PINS[0],
            "torch": torch.__version__,
            "prompt_tokens_mean": statistics.mean(prompts),
            "model_params": n_params,
        },  # fmt: skip
        "command": " ".join(["nice -n 10 python bench/peer_trl.py", *sys.argv[1:]]),
        "git_commit": STARTED_AT,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("rollwise_vs_trl_step_ratio", "rollwise", "trl")}))


if __name__ == "__main__":
    main()
