"""The protocols every benchmark implements: its environment and its task index.

They are deliberately small (reset, step, replay, what the agent holds; the tasks of a split
and what loading them skipped) so that BFCL or any other multi-turn benchmark can implement
them without knowing about skills or policies. The skill executor and the episode runner only
ever talk to `Env`, the stages to `TaskIndex`; `selskill.registry.Benchmark` types its
plugin's functions with them, so a type checker holds a plugin to them, and a test checks
each built-in one at run time (both are `runtime_checkable`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
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


@runtime_checkable
class TaskRecord(Protocol):
    """One task of an index."""

    @property
    def task_id(self) -> str:
        """`<split>/<id>`, the same in every process."""

    @property
    def task_type(self) -> str:
        """What metrics per task type group it by (ALFWorld's task type, BFCL's category)."""


@runtime_checkable
class TaskIndex(Protocol):
    """The tasks of one split of a benchmark (`Benchmark.task_index`), as the stages read them."""

    @property
    def benchmark(self) -> str:
        """Its benchmark's registry name: the spec of whatever index a stage is handed is found by it."""

    @property
    def games(self) -> Sequence[TaskRecord]:
        """The playable tasks."""

    @property
    def skipped(self) -> Mapping[str, int]:
        """Tasks that were found but cannot play, by reason (empty where every task plays)."""

    def by_id(self) -> Mapping[str, TaskRecord]:
        """`games` by task id."""

    def summary(self) -> str:
        """One line a stage logs when tasks were skipped: how many, where from, why."""

    def stats(self) -> dict[str, int]:
        """Figures of how its tasks were loaded that the sampling stage records in its stats, named by the
        benchmark (ALFWorld: games patched from alfworld's old grammar); {} where there are none."""


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
