"""ALFWorld's episode hooks: text commands as the defaults play them, and the commands its skills
navigate the household with (`go to X` moves, `examine X` is admissible where the agent is)."""

from __future__ import annotations

from selskill.agent.hooks import EpisodeHooks
from selskill.skills import Navigation

NAVIGATION = Navigation(go="go to", look="examine")


class AlfworldHooks(EpisodeHooks):
    navigation = NAVIGATION


__all__ = ["NAVIGATION", "AlfworldHooks"]
