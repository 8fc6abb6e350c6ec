"""ALFWorld's words in the turn format: what `TurnFormat` writes that only ALFWorld means.

Kept apart from `selskill.agent.turn_format` so that the format's structure (tags, sections,
the order of the parts) is the environment-generic part and these strings are what ALFWorld
supplies to it, as `selskill.benchmarks.bfcl.episode` supplies BFCL's. They are `AlfworldTurnFormat`'s
defaults: every ALFWorld prompt recorded so far was written with them, and a change of one
character changes every ALFWorld prompt's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from selskill.agent.turn_format import TurnFormat

INTRO = "You are an agent solving a task in a text-based household environment."
# the admissible command the system prompt's format examples show
EXAMPLE_COMMAND = "go to desk 1"
# the arguments of the thinking style's example skill call
EXAMPLE_ARGUMENTS: tuple[tuple[str, str], ...] = (("object", "mug 1"),)
# commands that are admissible wherever the agent stands, which the first observation already
# names (go to / examine a receptacle, look, inventory, help): "local" leaves them out
ALWAYS_AVAILABLE: tuple[str, ...] = ("go to ", "examine ", "look", "inventory", "help")
# ALFWorld's own phrasing of the task line; its first observation usually already ends with it
TASK_PREFIX = "Your task is to: "
# "; " never occurs inside an ALFWorld command, unlike ", "
COMMAND_SEPARATOR = "; "


@dataclass(frozen=True)
class AlfworldTurnFormat(TurnFormat):
    """The turn format with ALFWorld's words."""

    intro: str = INTRO
    example_command: str = EXAMPLE_COMMAND
    example_arguments: tuple[tuple[str, str], ...] = EXAMPLE_ARGUMENTS
    always_available: tuple[str, ...] = ALWAYS_AVAILABLE
    task_prefix: str = TASK_PREFIX
    command_separator: str = COMMAND_SEPARATOR
