"""A chat model as every participant of a team episode (envs/teamplay.py's protocol, self-play):
each message and the decision is one generation through the policy backend, from a prompt built
from that participant's own view (the brief, its private facts or raw rows, the channel so
far). Every generation's prompt and completion ids and log-probs are kept (`turns`), so a
participant's messages are token-exact and can be credited and trained like episode turns.

The model's text is data: a message is shown to the others as written (cut to the protocol's
size), a decision is the first candidate id in the reply; anything else is no decision.

For training (loop.team_round): `play_chats` plays many episodes, a batch per turn, each kept
with its own generations; `demo_sequences` writes a scripted teacher's episode
(envs/teamplay.py Scripted) as the same prompts with the teacher's text as completions: the SFT
warm start of a team policy."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field

from rollwise.envs.team import Setup, TeamTask
from rollwise.envs.teamplay import Policy, Reply, Request, TeamEpisode, View, play, protocol
from rollwise.policy.chat import encode, prompt_ids

PASS = "PASS"


@dataclass(frozen=True)
class TeamTurn:
    participant: int
    act: str  # "speak" or "decide"
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str


def view_messages(view: View, act: str) -> list[dict]:
    """The chat prompt of one participant's next act."""
    b = view.brief
    role = "You make the team's decision." if view.decider else "Another participant decides."
    if view.material:
        own = "Your rows:\n" + "\n".join(json.dumps(r, sort_keys=True) for r in view.material)
    else:
        own = "Your facts:\n" + ("\n".join(sorted(f.phrase for f in view.facts)) or "none")
    channel = "\n".join(f"participant {s}: {t}" for s, t in view.channel) or "nothing yet"
    if act == "speak":
        ask = (f"Write one message telling your team a fact it needs, as '{b.noun} <id> "
               f"<attribute> is <value>', or reply {PASS}.")  # fmt: skip
    else:
        ask = f"Reply with the id of the {b.noun} that is the answer, and nothing else."
    system = f"You are participant {view.participant} of a team. {role}"
    user = f"{b.question}\n\n{own}\n\nChannel so far:\n{channel}\n\n{ask}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


@dataclass
class ChatPolicy:
    """envs/teamplay.Policy over a backend (policy/hf.py HFBackend or the vLLM client)."""

    backend: object
    tokenizer: object
    max_new_tokens: int = 48
    temperature: float = 1.0
    greedy: bool = False
    turns: list[TeamTurn] = field(default_factory=list)
    batch_size: int = 32  # generations a forward pass (play_chats)

    def replies(self, requests: list[Request], seeds: list[int]) -> list[TeamTurn]:
        """One generation per (view, act), in batches; a seed per row, so a reply does not
        depend on what else is in its batch."""
        out = []
        for k in range(0, len(requests), self.batch_size):
            part = requests[k : k + self.batch_size]
            prompts = [prompt_ids(self.tokenizer, view_messages(v, a), []) for v, a in part]
            made = self.backend.generate(
                prompts, self.max_new_tokens, temperature=self.temperature, greedy=self.greedy,
                seed=seeds[k : k + len(part)],
            )  # fmt: skip
            for (view, act), ids, c in zip(part, prompts, made, strict=True):
                text = self.tokenizer.decode(c.token_ids, skip_special_tokens=True).strip()
                out.append(TeamTurn(view.participant, act, ids, list(c.token_ids),
                                    list(c.logprobs), text))  # fmt: skip
        self.turns.extend(out)
        return out

    def speak(self, view: View, rng: random.Random) -> str | None:
        (turn,) = self.replies([(view, "speak")], [rng.getrandbits(62)])
        return reply_of(turn, view)

    def decide(self, view: View, rng: random.Random) -> int | None:
        (turn,) = self.replies([(view, "decide")], [rng.getrandbits(62)])
        return reply_of(turn, view)


def posts(turn: TeamTurn) -> bool:
    """A speak turn that puts a message on the channel (not empty, not a pass)."""
    return turn.act == "speak" and bool(turn.text) and not turn.text.upper().startswith(PASS)


def reply_of(turn: TeamTurn, view: View) -> Reply:
    """What the protocol takes from a generation: the message (a pass or nothing: None), or
    the first candidate id in the reply (anything else: no decision)."""
    if turn.act == "speak":
        return turn.text if posts(turn) else None
    found = re.search(r"\d+", turn.text)
    choice = int(found.group()) if found else None
    return choice if choice in view.brief.candidates else None


@dataclass(frozen=True)
class TeamSettings:
    """How a team episode is dealt and played (bench/teamgym.py's defaults)."""

    k: int = 3  # participants (split and retrieval)
    budget: int = 8  # messages per episode
    distractors: int = 3  # distractor entities per hand (retrieval)


@dataclass(frozen=True)
class TeamPlay:
    """One team episode and the generations that played it, in order."""

    episode: TeamEpisode
    turns: list[TeamTurn]

    def posted(self) -> list[int | None]:
        """Each turn's message index on the channel: speak turns the protocol posted (a pass
        posts nothing), in order; None for a pass or the decision."""
        out, k = [], 0
        for t in self.turns:
            out.append(k if posts(t) and k < len(self.episode.messages) else None)
            k += posts(t)
        return out


def play_chats(jobs: list[tuple[TeamTask, Setup, int]], chat: ChatPolicy,
               budget: int) -> list[TeamPlay]:  # fmt: skip
    """Many (task, setup, seed) episodes at once: each turn, every unfinished episode's next
    generation in one batch. Each episode draws its seeds as `play` would, so it is the episode
    `play(task, setup, chat, budget, seed)` plays alone."""
    runs = [protocol(task, dealt, budget) for task, dealt, _ in jobs]
    rngs = [random.Random(f"play/{t.task_id}/{d.condition}/{seed}") for t, d, seed in jobs]
    pending = {i: next(run) for i, run in enumerate(runs)}
    turns: list[list[TeamTurn]] = [[] for _ in jobs]
    episodes: list[TeamEpisode | None] = [None] * len(jobs)
    while pending:
        order = list(pending)
        made = chat.replies([pending[i] for i in order], [rngs[i].getrandbits(62) for i in order])
        for i, turn in zip(order, made, strict=True):
            turns[i].append(turn)
            try:
                pending[i] = runs[i].send(reply_of(turn, pending[i][0]))
            except StopIteration as done:
                episodes[i] = done.value
                del pending[i]
    return [TeamPlay(e, t) for e, t in zip(episodes, turns, strict=True)]


@dataclass
class Recorder:
    """A Policy that plays `teacher` and keeps each act's chat prompt and the teacher's reply
    as the policy would write it (PASS for silence, the id alone for a decision)."""

    teacher: Policy
    acts: list[tuple[list[dict], str]] = field(default_factory=list)

    def speak(self, view: View, rng: random.Random) -> str | None:
        text = self.teacher.speak(view, rng)
        self.acts.append((view_messages(view, "speak"), text or PASS))
        return text

    def decide(self, view: View, rng: random.Random) -> int | None:
        choice = self.teacher.decide(view, rng)
        self.acts.append((view_messages(view, "decide"), "" if choice is None else str(choice)))
        return choice


def demo_sequences(
    tokenizer, task: TeamTask, setup: Setup, teacher: Policy, budget: int, seed: int
) -> list[tuple[list[int], list[int]]]:
    """(ids, loss mask) per act of the teacher's episode: the chat prompt, then the reply and
    the eos token as the only targets (train/sft.py's sequence format)."""
    rec = Recorder(teacher)
    play(task, setup, rec, budget, seed)
    out = []
    for messages, text in rec.acts:
        prompt = prompt_ids(tokenizer, messages, [])
        reply = encode(tokenizer, text + tokenizer.eos_token)
        out.append((prompt + reply, [0] * len(prompt) + [1] * len(reply)))
    return out
