"""CoSIR: credit for shared information, by how much it reduces the team's surprisal about the
answer.

The evaluator is exact: the generator knows the decision rule (envs/team.py), so the posterior
over decisions given the true facts stated on the channel so far is computed in closed form.
Message t earns drop_t = S(F_{t-1}) - S(F_t) bits, S(F) = -log2 P(correct decision | F), F_t the
facts disclosed by messages 0..t (from the prior: what the decider holds privately is not
counted, so the reward is a property of the channel alone). A message that states only facts
already on the channel, or none, leaves F unchanged and earns exactly 0; a true fact never
raises the surprisal of the correct decision to infinity.

Combined with the team outcome: each message's credit is R + weight * drop_t (R the team's
success, shared by every message of the episode); a participant's credit is the sum over its
messages. As a credit estimator (`cosir`, off unless `credit.method: cosir`), with the one
signature: `episodes` holds one row per (team episode, participant) with the team's reward, its
task as `group` and its turns' spans; `steps` one row per message with `surprisal_drop` and its
turn's span_start; the advantage of a turn is the GRPO outcome advantage of its team episode
plus `credit.cosir.weight` * the turn's surprisal drop. `team_tables` writes both tables from
played episodes.

Trained (loop.team_round): `generation_tables` gives each generation of a played episode (a
message, a pass, the decision; rollout/team.py TeamPlay) the GRPO outcome advantage of its team
episode within its group, plus weight x the surprisal drop of the message it posted: weight 0
is the outcome-only arm CoSIR is measured against.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rollwise.credit.grpo import group_advantages
from rollwise.credit.turns import advantage_rows, per_episode, turn_table
from rollwise.envs.team import Fact, TeamTask, surprisal
from rollwise.envs.teamplay import TeamEpisode

STEP_COLUMNS = ["episode_id", "step", "span_start", "surprisal_drop"]


def surprisal_drops(task: TeamTask, disclosures: list[frozenset[Fact]]) -> list[float]:
    """Bits of surprisal of the correct decision each message removes, in channel order."""
    known: set[Fact] = set()
    before, drops = surprisal(task, known), []
    for facts in disclosures:
        known |= facts
        after = surprisal(task, known)
        drops.append(before - after)
        before = after
    return drops


def message_credit(ep: TeamEpisode, weight: float) -> list[dict]:
    """One row per message: speaker, surprisal drop and credit R + weight * drop."""
    drops = surprisal_drops(ep.task, [m.disclosed for m in ep.messages])
    outcome = float(ep.success)
    return [
        {
            "index": m.index,
            "speaker": m.speaker,
            "surprisal_drop": d,
            "credit": outcome + weight * d,
        }
        for m, d in zip(ep.messages, drops, strict=True)
    ]


def participant_credit(ep: TeamEpisode, weight: float) -> dict[int, float]:
    """Each participant's credit: the sum over its messages (a silent one gets 0)."""
    out = dict.fromkeys(range(len(ep.setup.holdings)), 0.0)
    for row in message_credit(ep, weight):
        out[row["speaker"]] += row["credit"]
    return out


def team_tables(episodes: list[TeamEpisode], ids: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The estimator's inputs: one episode row per (team episode, participant) whose turns are
    its messages, one step row per message with its surprisal drop. A turn's span is the
    message's index on the channel: a placeholder until the rollout engine tokenizes each
    participant's context (passes, which say nothing, get no turn here)."""
    eps, steps = [], []
    for ep, team_id in zip(episodes, ids, strict=True):
        rows = message_credit(ep, 0.0)
        for p in range(len(ep.setup.holdings)):
            mine = [r for r in rows if r["speaker"] == p]
            eps.append(
                {"episode_id": f"{team_id}/p{p}", "team_id": team_id, "participant": p,
                 "group": ep.task.task_id, "reward": float(ep.success),
                 "turn_spans": [(r["index"], r["index"] + 1) for r in mine]}
            )  # fmt: skip
            steps += [
                {"episode_id": f"{team_id}/p{p}", "step": k, "span_start": r["index"],
                 "surprisal_drop": r["surprisal_drop"]}
                for k, r in enumerate(mine)
            ]  # fmt: skip
    return pd.DataFrame(eps), pd.DataFrame(steps, columns=STEP_COLUMNS)


def cosir(episodes: pd.DataFrame, steps: pd.DataFrame, cfg) -> pd.DataFrame:
    """Per turn: the GRPO outcome advantage of its episode plus weight x the surprisal its
    messages removed (steps' `surprisal_drop`; absent, as in single-agent episodes, it is 0 and
    this is GRPO)."""
    turns = turn_table(episodes, steps.iloc[0:0])  # team steps are messages, not tool calls
    outcome = per_episode(turns, episodes, group_advantages(episodes, cfg.std_norm, cfg.eps))
    drop = np.zeros(len(turns))
    if "surprisal_drop" in steps and not steps.empty:
        by_turn = steps.groupby(["episode_id", "span_start"])["surprisal_drop"].sum()
        keys = pd.MultiIndex.from_arrays([turns["episode_id"], turns["span_start"]])
        drop = by_turn.reindex(keys).fillna(0.0).to_numpy(float)  # [T]
    return advantage_rows(turns, outcome + cfg.cosir.weight * drop)


def generation_tables(plays: list, groups: list[str], weight: float, std_norm: bool, eps: float):
    """The trainer's inputs from played team episodes (rollout/team.py TeamPlay): one row per
    generation (prompt and completion token-exact, the rollout's log-probs on the completion),
    and its advantage over the completion's span. The outcome advantage is normalized over
    team episodes, not generations, so a long episode does not weigh more in its group."""
    teams = pd.DataFrame({"group": groups, "reward": [float(p.episode.success) for p in plays]})
    outcome = group_advantages(teams, std_norm, eps).to_numpy(float)  # [E]
    rows, adv = [], []
    for e, play in enumerate(plays):
        drops = surprisal_drops(play.episode.task, [m.disclosed for m in play.episode.messages])
        for k, (turn, posted) in enumerate(zip(play.turns, play.posted(), strict=True)):
            n, m = len(turn.prompt_ids), len(turn.completion_ids)
            gid = f"team{e:05d}/g{k:02d}"
            rows.append({"episode_id": gid, "group": groups[e],
                         "token_ids": turn.prompt_ids + turn.completion_ids,
                         "loss_mask": [0] * n + [1] * m,
                         "logprobs": [0.0] * n + list(turn.logprobs)})  # fmt: skip
            drop = drops[posted] if posted is not None else 0.0
            adv.append({"episode_id": gid, "step": 0, "span_start": n, "span_end": n + m,
                        "advantage": outcome[e] + weight * drop,
                        "surprisal_drop": drop})  # fmt: skip
    return pd.DataFrame(rows), pd.DataFrame(adv)
