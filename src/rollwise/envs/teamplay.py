"""The team protocol: turns over one shared channel, a designated decider, every participant the
same policy with its own context (self-play), a budget of messages.

A pure module: it runs participants given as a `Policy` (the scripted ones below) and records
who said what and which facts, pivotal ones included, each message discloses (read from the
message text by the facts' canonical phrases, never from the policy's own account). A chat model
plays through rollout/team.py `ChatPolicy` (one generation per message, token-exact turns);
the rollout engine's batched loop does not run team episodes.

Rounds: every participant in turn (the decider last), until the budget is spent or a whole
round passes in silence; then the decider decides. Metrics (`round_metrics`): success per
condition, the communication gap (single minus split, points), the retrieval gap (split minus
retrieval), disclosure rate, use rate and failure-to-use rate."""

from __future__ import annotations

import random
import re
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Protocol

from rollwise.envs.team import (
    CONDITIONS,
    Brief,
    Fact,
    Setup,
    TeamTask,
    determined,
    disclosed,
    extract,
    posterior,
)

MAX_CHARS = 400  # a longer message is cut: the budget counts messages, so their size is capped


@dataclass(frozen=True)
class View:
    """What one participant sees: the brief, its own context, and the channel so far."""

    participant: int
    decider: bool
    brief: Brief
    facts: frozenset[Fact]  # private facts (single, split)
    material: tuple[dict, ...]  # raw rows to read facts from (retrieval)
    channel: tuple[tuple[int, str], ...]  # (speaker, text) so far


Request = tuple[View, str]  # a participant's view and its act: "speak" or "decide"
Reply = str | int | None  # the message (None: pass) or the decision (None: no valid choice)


class Policy(Protocol):
    def speak(self, view: View, rng: random.Random) -> str | None:
        """The next message, or None to pass."""

    def decide(self, view: View, rng: random.Random) -> int | None:
        """The decider's choice of candidate (None: no valid choice)."""


@dataclass(frozen=True)
class Message:
    index: int
    speaker: int
    text: str
    disclosed: frozenset[Fact]  # true facts about the candidates the text states
    pivotal: frozenset[Fact]  # the pivotal ones among them


@dataclass
class TeamEpisode:
    task: TeamTask
    setup: Setup
    messages: list[Message] = field(default_factory=list)
    decision: int | None = None

    @property
    def success(self) -> bool:
        return self.decision == self.task.decision

    def channel_facts(self, upto: int | None = None) -> set[Fact]:
        return {f for m in self.messages[:upto] for f in m.disclosed}

    def decider_facts(self) -> set[Fact]:
        """What the decider held privately plus every true fact stated on the channel."""
        return set(self.setup.holdings[self.setup.decider]) | self.channel_facts()


def view_of(ep: TeamEpisode, p: int) -> View:
    material = ep.setup.material[p] if ep.setup.material else ()
    channel = tuple((m.speaker, m.text) for m in ep.messages)
    facts = frozenset() if material else ep.setup.holdings[p]
    return View(p, p == ep.setup.decider, ep.task.brief, facts, material, channel)


def protocol(task: TeamTask, setup: Setup, budget: int) -> Generator[Request, Reply, TeamEpisode]:
    """One episode's turns as requests: yields (view, "speak") and is sent the message text or
    None, then yields (view, "decide") and is sent the choice; returns the episode. `play`
    drives one with a Policy; rollout/team.py drives many at once, a batch per turn."""
    ep = TeamEpisode(task, setup)
    k = len(setup.holdings)
    order = [p for p in range(k) if p != setup.decider] + [setup.decider]
    while len(ep.messages) < budget:
        spoke = False
        for p in order:
            if len(ep.messages) >= budget:
                break
            text = yield view_of(ep, p), "speak"
            if text:
                text = text[:MAX_CHARS]
                said = frozenset(disclosed(text, task.facts))
                piv = said & set(task.pivotal)
                ep.messages.append(Message(len(ep.messages), p, text, said, frozenset(piv)))
                spoke = True
        if not spoke:
            break
    ep.decision = yield view_of(ep, setup.decider), "decide"
    return ep


def play(task: TeamTask, setup: Setup, policy: Policy, budget: int, seed: int) -> TeamEpisode:
    """One episode under `setup` with every participant playing `policy`."""
    rng = random.Random(f"play/{task.task_id}/{setup.condition}/{seed}")
    turns = protocol(task, setup, budget)
    view, act = next(turns)
    try:
        while True:
            reply = policy.speak(view, rng) if act == "speak" else policy.decide(view, rng)
            view, act = turns.send(reply)
    except StopIteration as done:
        return done.value


# Scripted policies: a participant's known facts are its private facts, or what it reads from
# its raw rows; it states one fact per message, in the canonical phrase.
FACT_RE = re.compile(r"\b([a-z]+) (\d+) ([a-z]+) is ([\w.]+)\b")


def parse_facts(text: str) -> set[Fact]:
    """The facts a message states in canonical phrases (numbers read back as numbers)."""
    out = set()
    for noun, cand, attr, value in FACT_RE.findall(text.lower()):
        number = re.fullmatch(r"\d+(\.\d+)?", value)
        val = (float(value) if "." in value else int(value)) if number else value
        out.add(Fact(noun, int(cand), attr, val))
    return out


@dataclass(frozen=True)
class Scripted:
    """share: every fact it knows, in its own order (`all`), nothing (`none`), or each turn a
    random unshared fact with probability `p` (`random`). The decider picks the candidate most
    probable under the exact posterior given its own facts and, unless `ignore_channel`, the
    facts stated on the channel (ties: the first in the brief's order)."""

    share: str  # all | none | random
    p: float = 0.5
    ignore_channel: bool = False

    def speak(self, view: View, rng: random.Random) -> str | None:
        said = heard(view)
        fresh = [f for f in known(view) if f not in said]
        if not fresh or self.share == "none":
            return None
        if self.share == "random":
            return rng.choice(fresh).phrase if rng.random() < self.p else None
        return fresh[0].phrase

    def decide(self, view: View, rng: random.Random) -> int:
        facts = set(known(view)) | (set() if self.ignore_channel else heard(view))
        post = posterior(view.brief.candidates, view.brief.rule, facts)
        return max(view.brief.candidates, key=lambda c: post[c])


def known(view: View) -> list[Fact]:
    """A scripted participant's facts: its private ones, or what it reads from its rows (in row
    order, distractors and all)."""
    if view.material:
        return extract(view.brief, view.material)
    return sorted(view.facts, key=lambda f: f.phrase)


def heard(view: View) -> set[Fact]:
    return set().union(*(parse_facts(text) for _, text in view.channel))


def round_metrics(episodes: list[TeamEpisode]) -> dict:
    """Success per condition (%), the two gaps (points), and over the multi-participant
    conditions: the disclosure rate (pivotal facts a non-decider held privately that reached
    the channel), the use rate (decisions the decider's facts, own and received, leave
    possible) and the failure-to-use rate (wrong decisions among episodes whose decider's facts
    determined the right one)."""
    by = {c: [e for e in episodes if e.setup.condition == c] for c in CONDITIONS}
    success = {c: pct([e.success for e in eps]) for c, eps in by.items()}
    team = by["split"] + by["retrieval"]
    use = [posterior(e.task.candidates, e.task.rule, e.decider_facts()).get(e.decision, 0) > 0
           for e in team]  # fmt: skip
    enough = [e for e in team if decided(e) == e.task.decision]
    return {
        "success_pct": success,
        "communication_gap_pts": gap(success["single"], success["split"]),
        "retrieval_gap_pts": gap(success["split"], success["retrieval"]),
        "disclosure_rate": share(told(team)),
        "disclosure_rate_by_condition": {c: share(told(by[c])) for c in ("split", "retrieval")},
        "use_rate": share(use),
        "failure_to_use_rate": share([not e.success for e in enough]),
        "episodes": {c: len(eps) for c, eps in by.items()},
    }


def told(episodes: list[TeamEpisode]) -> list[bool]:
    """For each pivotal fact a non-decider held privately: did it reach the channel?"""
    return [f in e.channel_facts() for e in episodes
            for p, hand in enumerate(e.setup.holdings) if p != e.setup.decider
            for f in hand & set(e.task.pivotal)]  # fmt: skip


def decided(e: TeamEpisode) -> int | None:
    return determined(e.task.candidates, e.task.rule, e.decider_facts())


def share(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def pct(flags: list[bool]) -> float | None:
    return None if not flags else 100.0 * sum(flags) / len(flags)


def gap(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b
