"""The messages an episode produces, built one way for rollouts and demonstrations alike.

The init policy is trained on demonstrations and then sampled by the episode runner; if
the two wrote observations, skill returns or invalid-turn feedback differently, the policy
would see at sampling time a format it never saw in training. Both go through here.
"""

from __future__ import annotations

from selskill.agent.turn_format import TurnFormat
from selskill.envs.base import EnvState
from selskill.skills.step_records import NO_EFFECT_FEEDBACK as INVALID_TURN_FEEDBACK

# What the runner sends the engine for a malformed turn: never admissible, so the engine
# answers "Nothing happens." and counts the step exactly as for any invalid command.
MALFORMED_COMMAND = "<malformed turn>"


def opening_messages(fmt: TurnFormat, listing: str, state: EnvState) -> list[dict]:
    """System message (protocol + skill listing) and the first observation with the task."""
    return [
        fmt.system_message(listing),
        fmt.observation_message(state.observation, state.admissible_commands, task=state.task),
    ]


def _reminder(fmt: TurnFormat, state: EnvState) -> str | None:
    return state.task if fmt.task_reminder else None


def after_action(fmt: TurnFormat, state: EnvState) -> dict:
    return fmt.observation_message(state.observation, state.admissible_commands, task=_reminder(fmt, state))


def after_skill(fmt: TurnFormat, skill_output: str, state: EnvState) -> dict:
    """A skill's return (memory text, or what its actions did) plus where the agent now stands."""
    return fmt.skill_return_message(
        fmt.observation_text(
            skill_output or "(no output)", state.admissible_commands, task=_reminder(fmt, state)
        )
    )


def after_malformed(fmt: TurnFormat, state: EnvState) -> dict:
    """A malformed turn is answered as an invalid command is."""
    return fmt.observation_message(
        INVALID_TURN_FEEDBACK, state.admissible_commands, task=_reminder(fmt, state)
    )
