"""Benchmark: how many successes are guesses, before and after the rubric's grounded criterion.

No trained policy needed: three scripted policies run every read-only task of generated suites
(params.yaml's `envs`, seeds 0..N-1, every read-only kind of envs/generate.py):
- oracle: the task's oracle calls, then its answer (every success grounded);
- wrong_record: the oracle's calls with its last read pointed at another record (for a
  record's field the same owner's other record where there is one, for an owner's field another
  owner's) and the value that read shows as the answer: the issue's case (statistics enrollment
  read, music enrollment asked);
- constant: no call; the most common answer of the environment's other tasks of the same kind
  (what a policy learns from a skewed answer domain: school_005 holds 10 `applied` of 17
  enrollments).
A success "before" is types.SUCCESS_CRITERIA only (the old verdict); "after" adds `grounded`.
Figures per kind and policy: tasks, successes before and after, and the ungrounded share of
all successes (every policy's episodes pooled) before and after.

    .venv/bin/python bench/grounded.py [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from rollwise.config import load_params
from rollwise.envs.generate import KINDS, generate_suite
from rollwise.envs.rubric import normalize
from rollwise.envs.runtime import SyntheticEnv, load_suite
from rollwise.rollout.engine import clone_env
from rollwise.types import SUCCESS_CRITERIA, Task, ToolCall

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.provenance import STARTED_AT  # noqa: E402

OUT = ROOT / "bench" / "results"
# Kinds with read-only tasks (conditional's are read-only when its condition does not hold).
READ_KINDS = [k for k, kind in KINDS.items() if not kind.writes] + ["conditional"]
# Every read-only kind needs these tool templates and schema columns.
TOOLS = ["find", "get_owner", "list", "get_record", "cancel", "update", "filter", "total",
         "owner_of"]  # fmt: skip


def wrong_read(env: SyntheticEnv, task: Task) -> ToolCall | None:
    """The oracle's last call with its key argument pointed at another record (or owner)."""
    final, keys = task.oracle[-1], env.keys
    probe = clone_env(env)
    probe.reset(task, 0)
    rows = probe.rows()
    d = env.domain
    if keys["record"] in final.arguments:
        rid = final.arguments[keys["record"]]
        owner = rows[(f"{d.record}s", rid)][1]
        others = [k for (t, k), r in rows.items() if t == f"{d.record}s" and k != rid]
        # a record field: the same owner's other record; an owner field: another owner's
        same = final.name == env.spec.tool_name("get_record")
        mine = [k for k in others if (rows[(f"{d.record}s", k)][1] == owner) == same]
        pick, name = (mine or others)[0], keys["record"]
    else:
        oid = final.arguments[keys["owner"]]
        pick = next(k for (t, k) in rows if t == f"{d.owner}s" and k != oid)
        name = keys["owner"]
    return ToolCall(final.name, {**final.arguments, name: pick})


def shown_answer(result, reference, answer: str) -> str:
    """What a policy reading `result` would answer: the field that holds the answer in the
    oracle's read (a list: its length)."""
    if isinstance(reference, list):
        return str(len(result)) if isinstance(result, list) else ""
    field = next((k for k, v in reference.items() if normalize(str(v)) == normalize(answer)), None)
    return str(result.get(field, "")) if isinstance(result, dict) and field else ""


def episode(env: SyntheticEnv, task: Task, calls: list[ToolCall], answer) -> dict:
    run = clone_env(env)
    run.reset(task, 0)
    for call in calls:
        run.step(call)
    scores = run.verify(answer, calls).scores
    before = all(scores[k] == 1.0 for k in SUCCESS_CRITERIA)
    grounded = scores["grounded"] == 1.0
    after = before and grounded
    return {"before": before, "after": after, "guess_before": before and not grounded,
            "guess_after": after and not grounded}  # fmt: skip


def policies(env: SyntheticEnv, task: Task, constant: str) -> dict[str, dict]:
    wrong = wrong_read(env, task)
    said = shown_answer(
        env_read(env, task, wrong), env_read(env, task, task.oracle[-1]), task.answer
    )
    return {
        "oracle": episode(env, task, list(task.oracle), task.answer),
        "wrong_record": episode(env, task, [*task.oracle[:-1], wrong], said),
        "constant": episode(env, task, [], constant),
    }


def env_read(env: SyntheticEnv, task: Task, call: ToolCall):
    probe = clone_env(env)
    probe.reset(task, 0)
    return probe.read_at_start(call)


def measure(suite_dir: Path) -> dict[str, dict[str, Counter]]:
    suite = load_suite(suite_dir)
    tasks = [t for t in suite.tasks.values() if t.kind in READ_KINDS and not t.writes]
    common = defaultdict(Counter)  # (env, kind) -> answers
    for t in tasks:
        common[t.env_id, t.kind][normalize(t.answer)] += 1
    out: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for t in tasks:
        others = common[t.env_id, t.kind] - Counter([normalize(t.answer)])  # leave this one out
        constant = others.most_common(1)[0][0] if others else ""
        for name, r in policies(suite.envs[t.env_id], t, constant).items():
            out[t.kind][name].update(tasks=1, **{k: int(v) for k, v in r.items()})
    return out


def ungrounded_share(per_policy: dict[str, Counter], when: str) -> float | None:
    """Successes (every policy pooled) that did not read the record asked about."""
    wins = sum(c[when] for c in per_policy.values())
    guesses = sum(c[f"guess_{when}"] for c in per_policy.values())
    return None if not wins else round(guesses / wins, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    t0 = time.perf_counter()
    totals: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for seed in range(args.seeds):
        overrides = {"envs.seed": seed, "envs.task_kinds": READ_KINDS,
                     "envs.tool_templates": TOOLS, "envs.schema_templates": 3}  # fmt: skip
        cfg = load_params(ROOT / "params.yaml", overrides).envs
        with tempfile.TemporaryDirectory() as tmp:
            generate_suite(cfg, Path(tmp))
            for kind, per in measure(Path(tmp)).items():
                for name, c in per.items():
                    totals[kind][name].update(c)
    by_kind = {
        kind: {
            **{name: dict(c) for name, c in per.items()},
            "ungrounded_share_before": ungrounded_share(per, "before"),
            "ungrounded_share_after": ungrounded_share(per, "after"),
        }
        for kind, per in sorted(totals.items())
    }
    result = {
        "command": " ".join(["python bench/grounded.py", *sys.argv[1:]]),
        "git_commit": STARTED_AT,
        "suites": args.seeds,
        "by_kind": by_kind,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    (OUT / "grounded.json").write_text(json.dumps(result, indent=1) + "\n")
    for kind, row in by_kind.items():
        print(kind, {k: row[k] for k in ("ungrounded_share_before", "ungrounded_share_after")},
              {n: f"{row[n]['before']}->{row[n]['after']}/{row[n]['tasks']}"
               for n in ("oracle", "wrong_record", "constant")})  # fmt: skip


if __name__ == "__main__":
    main()
