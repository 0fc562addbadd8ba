"""Memory across episodes: a skill bank (skills.py, bank.py), working memory (working.py) and a
validation-gated rule-based updater of the skill memory (meta.py). Off unless an episode's
environment is wrapped (`wrap`); the default rollout never is."""

from __future__ import annotations


def wrap(env, skills: list | None = None, working: bool = False):
    """An episode's environment with the memory asked for: Skilled(Working(env)), so that a
    skill's real calls each reach working memory."""
    from rollwise.memory.skills import Skilled
    from rollwise.memory.working import Working

    env = Working(env) if working else env
    return Skilled(env, list(skills)) if skills else env
