"""What differs between benchmarks inside an episode, as one public protocol.

The episode host (`selskill.agent.episode_host.EpisodeHost`) does everything an episode shares
across benchmarks: tokens, parsing, skill calls, budgets, records. At the few points where a
benchmark's environment speaks its own language it asks the `EpisodeHooks` a benchmark
plugin hands it (`selskill.registry.Benchmark.hooks`). The defaults here serve an
environment whose commands are plain text and whose state says when the task is won, so a
text benchmark needs no hooks of its own (ALFWorld's only add `navigation`); one whose actions
are something else (BFCL's call lists) overrides the methods that differ. Hooks are stateless and picklable: the host
may run in a child process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from selskill.agent.listings import first_prefix, prefix_after_action, prefix_after_skill
from selskill.agent.transcript import MALFORMED_COMMAND, after_action, after_malformed, opening_messages

if TYPE_CHECKING:
    from selskill.agent.turn_format import TurnFormat
    from selskill.data.records import Turn
    from selskill.envs.base import Env, EnvState
    from selskill.skills import Navigation, SkillLibrary
    from selskill.skills.step_records import EpisodePrefix


class EpisodeHooks:
    """The default hooks: text commands, answered by the environment's observation."""

    # the commands skills move and look around with (`find` steps, receptacle checks); None: none
    navigation: Navigation | None = None

    def opening(self, fmt: TurnFormat, env: Env, state: EnvState, listing: str) -> list[dict]:
        """The episode's first messages: system prompt (with `listing`) and first observation."""
        return opening_messages(fmt, listing, state)

    def first_prefix(self, env: Env, state: EnvState) -> EpisodePrefix:
        """What retrieval sees before the first decision."""
        return first_prefix(state)

    def extend_prefix(
        self, library: SkillLibrary, prefix: EpisodePrefix, record: Turn, state: EnvState, call
    ) -> EpisodePrefix:
        """The prefix after one turn, from its record, the state after it and its skill call.

        A memory skill leaves the current observation as it was (it returns text, not a new
        view of the environment); a malformed turn adds no step, only what the engine answered.
        """
        if record.kind == "skill":
            return prefix_after_skill(prefix, library, record.skill, call)
        if record.kind == "action":
            return prefix_after_action(prefix, record.action, state.observation)
        return prefix.extend(observation=state.observation)

    def act(self, fmt: TurnFormat, env: Env, action: str) -> tuple[EnvState, list[str], dict]:
        """An action turn: (state after it, the commands it ran, the reply message)."""
        state = env.step(action)
        return state, [action], after_action(fmt, state)

    def classify(self, record: Turn) -> None:
        """Amend a played turn's record in place (e.g. an action the benchmark deems malformed)."""

    def malformed(self, fmt: TurnFormat, env: Env) -> tuple[EnvState, list[str], dict]:
        """A malformed turn, answered as an invalid command is."""
        state = env.step(MALFORMED_COMMAND)
        return state, [MALFORMED_COMMAND], after_malformed(fmt, state)

    def ended(self, state: EnvState) -> tuple[str, str | None] | None:
        """(termination, error) when the benchmark ends the episode on its own terms before the
        shared rules (won, budgets) apply; None: those rules decide."""
        return None


__all__ = ["EpisodeHooks"]
