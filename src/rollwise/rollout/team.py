"""A chat model as every participant of a team episode (envs/teamplay.py's protocol, self-play):
each message and the decision is one generation through the policy backend, from a prompt built
from that participant's own view (the brief, its private facts or raw rows, the channel so
far). Every generation's prompt and completion ids and log-probs are kept (`turns`), so a
participant's messages are token-exact and can be credited and trained like episode turns.

The model's text is data: a message is shown to the others as written (cut to the protocol's
size), a decision is the first candidate id in the reply; anything else is no decision."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field

from rollwise.envs.teamplay import View
from rollwise.policy.chat import prompt_ids

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

    def generate(self, view: View, act: str, rng: random.Random) -> str:
        ids = prompt_ids(self.tokenizer, view_messages(view, act), [])
        (out,) = self.backend.generate([ids], self.max_new_tokens, temperature=self.temperature,
                                       greedy=self.greedy, seed=rng.getrandbits(62))  # fmt: skip
        text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True).strip()
        self.turns.append(TeamTurn(view.participant, act, ids, list(out.token_ids),
                                   list(out.logprobs), text))  # fmt: skip
        return text

    def speak(self, view: View, rng: random.Random) -> str | None:
        text = self.generate(view, "speak", rng)
        return None if not text or text.upper().startswith(PASS) else text

    def decide(self, view: View, rng: random.Random) -> int | None:
        found = re.search(r"\d+", self.generate(view, "decide", rng))
        choice = int(found.group()) if found else None
        return choice if choice in view.brief.candidates else None
