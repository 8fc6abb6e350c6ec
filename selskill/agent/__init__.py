"""The agent's side of an episode: chat messages in, one parsed decision out per turn."""

from selskill.agent.parser import END_OF_TURN_TOKENS, ParsedTurn, parse_turn
from selskill.agent.turn_format import (
    ACTION_CLOSE,
    ACTION_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TurnFormat,
    forced_prefix,
    render_action,
    render_skill_call,
)

__all__ = [
    "ACTION_CLOSE",
    "ACTION_OPEN",
    "END_OF_TURN_TOKENS",
    "THINK_CLOSE",
    "THINK_OPEN",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "ParsedTurn",
    "TurnFormat",
    "forced_prefix",
    "parse_turn",
    "render_action",
    "render_skill_call",
]
