"""TeamGym tasks: team decisions over the synthetic generator's relational state, built so that a
minimal set of pivotal facts is known.

A task names candidates (records of one world, or its owners) and a conjunctive rule ("the one
order among 412, 87, 530 whose status is delivered and whose amount is at least 230"); the
decision is the one candidate that satisfies every condition. A fact is one attribute value of
one candidate. The evaluator's model of the world: each (candidate, condition) holds
independently with the condition's prior (its base rate in the database) unless a known fact
settles it; so the posterior over decisions (each candidate, or NONE when zero or several
qualify) is exact in closed form, and a fact set determines the decision when every
(candidate, condition) is settled. The pivotal set is found by greedy elimination and verified
by ablation when the task is built: it determines the correct decision, and dropping any one of
its facts leaves the decision undetermined.

Three conditions share one task (`setup`): `single` (one participant holds every pivotal
fact), `split` (the pivotal facts dealt across k participants), `retrieval` (each participant
gets the raw rows its share of facts comes from, plus distractor rows of other entities, and
must extract the facts itself: `extract`). Split and retrieval deal the facts identically."""

from __future__ import annotations

import math
import random
import re
import sqlite3
from dataclasses import dataclass, replace

from rollwise.envs.generate import build_database
from rollwise.envs.spec import default_spec

NONE = -1  # the decision when no candidate, or more than one, satisfies the rule
CONDITIONS = ("single", "split", "retrieval")
RECORD_ATTRS = ("status", "amount", "priority", "tier")  # tier: the record's owner's
OWNER_ATTRS = ("city", "tier")
NUMERIC = ("amount", "priority")  # conditions on these are thresholds (>=), the rest equality


@dataclass(frozen=True)
class Condition:
    """One conjunct of the decision rule; `prior`: P(it holds for a candidate) before any fact."""

    attribute: str
    value: str | int | float
    prior: float

    def holds(self, value) -> bool:
        return value >= self.value if self.attribute in NUMERIC else value == self.value

    def text(self) -> str:
        verb = "is at least" if self.attribute in NUMERIC else "is"
        return f"{self.attribute} {verb} {self.value}"


@dataclass(frozen=True)
class Fact:
    """One attribute value of one candidate. `phrase` is its canonical wording: a message
    discloses the fact when its text contains the phrase."""

    noun: str  # the candidate's entity name (order, customer, ...)
    candidate: int
    attribute: str
    value: str | int | float

    @property
    def phrase(self) -> str:
        return f"{self.noun} {self.candidate} {self.attribute} is {self.value}"


@dataclass(frozen=True)
class Brief:
    """What every participant is told: the question, its candidates and rule, and how the
    world's rows are named (to read facts from them)."""

    kind: str  # refund (candidates are records) | qualify (candidates are owners)
    nouns: tuple[str, str]  # (owner, record) entity names
    owner_key: str  # the record rows' column naming their owner
    candidates: tuple[int, ...]
    rule: tuple[Condition, ...]

    @property
    def noun(self) -> str:
        return self.nouns[0] if self.kind == "qualify" else self.nouns[1]

    @property
    def question(self) -> str:
        ids = ", ".join(map(str, self.candidates))
        rule = " and whose ".join(c.text() for c in self.rule)
        act = "gets the refund" if self.kind == "refund" else "qualifies"
        return f"Which {self.noun} among {ids} {act}? The one whose {rule}."


@dataclass(frozen=True)
class TeamTask:
    task_id: str
    brief: Brief
    decision: int
    facts: tuple[Fact, ...]  # every true fact about the candidates' attributes
    pivotal: tuple[Fact, ...]
    rows: dict[str, tuple[dict, ...]]  # the world's raw rows by table: source material

    @property
    def candidates(self) -> tuple[int, ...]:
        return self.brief.candidates

    @property
    def rule(self) -> tuple[Condition, ...]:
        return self.brief.rule

    @property
    def kind(self) -> str:
        return self.brief.kind


def qualify_chance(rule: tuple[Condition, ...], candidate: int, known: dict) -> float:
    """P(candidate satisfies every condition | known facts); `known` maps (candidate,
    attribute) to a value."""
    p = 1.0
    for c in rule:
        value = known.get((candidate, c.attribute))
        p *= c.prior if value is None else float(c.holds(value))
    return p


def posterior(candidates, rule, facts) -> dict[int, float]:
    """The exact posterior over decisions (each candidate and NONE) given `facts`."""
    known = {(f.candidate, f.attribute): f.value for f in facts}
    q = {c: qualify_chance(rule, c, known) for c in candidates}
    out = {c: q[c] * math.prod(1 - q[o] for o in candidates if o != c) for c in candidates}
    out[NONE] = max(0.0, 1.0 - sum(out.values()))
    return out


def determined(candidates, rule, facts) -> int | None:
    """The decision `facts` force, or None when more than one decision stays possible."""
    best = [d for d, p in posterior(candidates, rule, facts).items() if p > 0]
    return best[0] if len(best) == 1 else None


def surprisal(task: TeamTask, facts) -> float:
    """-log2 P(correct decision | facts), in bits (inf when the facts rule it out)."""
    p = posterior(task.candidates, task.rule, facts)[task.decision]
    return -math.log2(p) if p > 0 else math.inf


def minimal_set(candidates, rule, facts, decision: int, rng: random.Random) -> tuple[Fact, ...]:
    """Greedy elimination in a random order: drop each fact whose removal keeps the decision
    determined; what is left is inclusion-minimal (`check_pivotal` verifies it)."""
    kept = [f for f in facts if f.attribute in {c.attribute for c in rule}]
    for f in rng.sample(kept, len(kept)):
        rest = [g for g in kept if g != f]
        if determined(candidates, rule, rest) == decision:
            kept = rest
    return tuple(kept)


def check_pivotal(task: TeamTask) -> None:
    """Ablation: the pivotal set determines the correct decision; without any one fact it does
    not. Raises ValueError otherwise."""
    if determined(task.candidates, task.rule, task.pivotal) != task.decision:
        raise ValueError(f"{task.task_id}: the pivotal set does not determine the decision")
    for f in task.pivotal:
        rest = [g for g in task.pivotal if g != f]
        if determined(task.candidates, task.rule, rest) is not None:
            raise ValueError(f"{task.task_id}: {f.phrase!r} is not necessary")


def world_rows(domain: str, seed: int, owners: int = 40, max_records: int = 3) -> dict:
    """The generator's relational state for one world (both extra columns on), as row dicts."""
    spec = replace(default_spec(domain), columns=("priority", "tier"))
    con = sqlite3.connect(":memory:")
    con.deserialize(build_database(spec, random.Random(seed), owners, max_records))
    con.row_factory = sqlite3.Row
    d = spec.entities
    tables = {"owners": f"{d.owner}s", "records": f"{d.record}s"}
    rows = {k: tuple(dict(r) for r in con.execute(f"SELECT * FROM {t}")) for k, t in tables.items()}
    return {**rows, "nouns": (d.owner, d.record), "owner_key": f"{d.owner}_id"}


def extract(brief: Brief, rows) -> list[Fact]:
    """Every fact raw rows state (the owner join included), in row order: what a perfect reader
    of the source material gets. Owner rows have a `name`; record rows the owner's key."""
    owners = {r["id"]: r for r in rows if "name" in r}
    out: dict[Fact, None] = {}
    for r in rows:
        if brief.kind == "qualify" and "name" in r:
            out |= dict.fromkeys(Fact(brief.noun, r["id"], a, r[a]) for a in OWNER_ATTRS)
        elif brief.kind == "refund" and brief.owner_key in r:
            out |= dict.fromkeys(Fact(brief.noun, r["id"], a, r[a]) for a in RECORD_ATTRS[:3])
            owner = owners.get(r[brief.owner_key])
            out |= {Fact(brief.noun, r["id"], "tier", owner["tier"]): None} if owner else {}
    return list(out)


def sources(task: TeamTask, fact: Fact) -> list[dict]:
    """The raw rows a fact is read from: an owner's row; a record's row (and its owner's, for
    the owner's tier)."""
    owners = {r["id"]: r for r in task.rows["owners"]}
    if task.kind == "qualify":
        return [owners[fact.candidate]]
    record = next(r for r in task.rows["records"] if r["id"] == fact.candidate)
    return [record] + ([owners[record[task.brief.owner_key]]] if fact.attribute == "tier" else [])


def candidate_values(kind: str, world: dict) -> dict[int, dict]:
    """Each possible candidate's attribute values."""
    if kind == "qualify":
        return {o["id"]: {a: o[a] for a in OWNER_ATTRS} for o in world["owners"]}
    tier = {o["id"]: o["tier"] for o in world["owners"]}
    key = world["owner_key"]
    return {
        r["id"]: {**{a: r[a] for a in RECORD_ATTRS[:3]}, "tier": tier[r[key]]}
        for r in world["records"]
    }


def base_rate(values: dict[int, dict], attribute: str, cond: Condition) -> float:
    return sum(cond.holds(v[attribute]) for v in values.values()) / len(values)


def draw_task(world: dict, kind: str, rng: random.Random, n_candidates: int, n_conditions: int,
              task_id: str) -> TeamTask | None:  # fmt: skip
    """One task whose rule exactly one of `n_candidates` satisfies, or None (redraw)."""
    values = candidate_values(kind, world)
    candidates = tuple(rng.sample(sorted(values), n_candidates))
    winner = rng.choice(candidates)
    attrs = rng.sample(OWNER_ATTRS if kind == "qualify" else RECORD_ATTRS, n_conditions)
    rule = []
    for a in attrs:
        cond = Condition(a, values[winner][a], 0.0)
        rule.append(replace(cond, prior=base_rate(values, a, cond)))
    if any(c.prior >= 1.0 for c in rule):
        return None  # a condition everyone meets decides nothing
    rule = tuple(rule)
    qualified = [c for c in candidates if all(r.holds(values[c][r.attribute]) for r in rule)]
    if qualified != [winner]:
        return None
    brief = Brief(kind, world["nouns"], world["owner_key"], candidates, rule)
    attr_names = OWNER_ATTRS if kind == "qualify" else RECORD_ATTRS
    facts = tuple(Fact(brief.noun, c, a, values[c][a]) for c in candidates for a in attr_names)
    pivotal = minimal_set(candidates, rule, facts, winner, rng)
    rows = {"owners": world["owners"], "records": world["records"]}
    task = TeamTask(task_id, brief, winner, facts, pivotal, rows)
    check_pivotal(task)
    return task


def make_tasks(domain: str, seed: int, n: int, n_candidates: int = 3, n_conditions: int = 2,
               kinds: tuple[str, ...] = ("refund", "qualify")) -> list[TeamTask]:  # fmt: skip
    """`n` verified tasks from one world of `domain`."""
    world = world_rows(domain, seed)
    rng = random.Random(f"team/{domain}/{seed}")
    tasks: list[TeamTask] = []
    for _ in range(n * 200):
        kind = kinds[len(tasks) % len(kinds)]
        task = draw_task(
            world, kind, rng, n_candidates, n_conditions, f"{domain}/{seed}/{len(tasks)}"
        )
        if task is not None and task.brief.question not in {t.brief.question for t in tasks}:
            tasks.append(task)
        if len(tasks) == n:
            return tasks
    raise ValueError(f"only {len(tasks)} of {n} team tasks after {n * 200} draws")


@dataclass(frozen=True)
class Setup:
    """One condition of a task: who holds what. `material` (retrieval only) is each
    participant's raw rows; `holdings` what each participant privately knows (in retrieval, what
    `extract` reads from its rows)."""

    condition: str
    decider: int
    holdings: tuple[frozenset[Fact], ...]
    material: tuple[tuple[dict, ...], ...] = ()


def deal(task: TeamTask, k: int, seed: int) -> list[list[Fact]]:
    """The pivotal facts dealt round-robin across k participants after a seeded shuffle (the
    same deal for split and retrieval)."""
    order = random.Random(f"deal/{task.task_id}/{seed}").sample(task.pivotal, len(task.pivotal))
    return [order[i::k] for i in range(k)]


def setup(task: TeamTask, condition: str, k: int, seed: int,
          distractors: int = 3) -> Setup:  # fmt: skip
    """The task under `condition` for k participants (single: one); participant 0 decides."""
    if condition == "single":
        return Setup("single", 0, (frozenset(task.pivotal),))
    hands = deal(task, k, seed)
    if condition == "split":
        return Setup("split", 0, tuple(frozenset(h) for h in hands))
    if condition != "retrieval":
        raise ValueError(f"unknown condition {condition!r}; known: {CONDITIONS}")
    rng = random.Random(f"material/{task.task_id}/{seed}")
    material = []
    for hand in hands:
        rows = {id(r): r for f in hand for r in sources(task, f)}
        for r in distractor_rows(task, rng, distractors):
            rows.setdefault(id(r), r)
        material.append(tuple(rng.sample(list(rows.values()), len(rows))))
    read = [extract(task.brief, m) for m in material]
    holdings = tuple(frozenset(f for f in r if f.candidate in task.candidates) for r in read)
    return Setup("retrieval", 0, holdings, tuple(material))


def distractor_rows(task: TeamTask, rng: random.Random, n: int) -> list[dict]:
    """Rows of `n` entities that are not candidates (a record comes with its owner's row)."""
    if task.kind == "qualify":
        pool = [o for o in task.rows["owners"] if o["id"] not in task.candidates]
        return rng.sample(pool, min(n, len(pool)))
    owners, key = {o["id"]: o for o in task.rows["owners"]}, task.brief.owner_key
    pool = [r for r in task.rows["records"] if r["id"] not in task.candidates]
    return [row for r in rng.sample(pool, min(n, len(pool))) for row in (r, owners[r[key]])]


def disclosed(text: str, facts) -> set[Fact]:
    """The facts among `facts` whose canonical phrase the text states (whole words, any case)."""
    low = text.lower()
    return {f for f in facts if re.search(rf"\b{re.escape(f.phrase.lower())}\b", low)}
