"""The environment protocol every benchmark implements.

It is deliberately small (reset, step, replay, what the agent holds) so that BFCL or any
other multi-turn benchmark can implement it without knowing about skills or policies. The
skill executor and the episode runner only ever talk to this protocol.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass
class EnvState:
    """What the agent can see after a reset or a step."""

    observation: str
    admissible_commands: list[str]
    task: str
    won: bool = False
    done: bool = False
    env_steps: int = 0  # environment steps consumed by the call that produced this state
    info: dict = field(default_factory=dict)


class EnvError(RuntimeError):
    """The engine failed on a game (not the agent's fault); the episode ends with reason `error`."""


@runtime_checkable
class Env(Protocol):
    """One environment instance plays one task at a time; reuse it across tasks."""

    def task_ids(self) -> list[str]:
        """Stable ids (same in every process) of the tasks this env can reset to."""

    def reset(self, task_id: str) -> EnvState:
        """Start `task_id` from its initial state."""

    def step(self, command: str) -> EnvState:
        """Execute one command. An inadmissible command consumes a step and changes nothing."""

    def replay(self, task_id: str, commands: Sequence[str]) -> EnvState:
        """Reset to `task_id` and execute `commands`; the returned state counts their steps."""

    def inventory(self) -> list[str]:
        """Names of the objects the agent carries (what it knows; consumes no step)."""

    @property
    def state(self) -> EnvState:
        """The latest state (after the last reset or step)."""


def replay_commands(env: Env, task_id: str, commands: Sequence[str]) -> EnvState:
    """Reset and step through `commands`; the shared implementation of `Env.replay`."""
    state = env.reset(task_id)
    steps = 0
    for command in commands:
        state = env.step(command)
        steps += state.env_steps
    state.env_steps = steps
    return state


def natural_key(name: str) -> tuple:
    """`microwave 2` before `microwave 10`: instance numbers compare as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))
