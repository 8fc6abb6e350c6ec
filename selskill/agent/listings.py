"""Which skills each decision is shown, built one way for rollouts and demonstrations alike.

A policy trained on demonstrations that list every skill and then sampled with a retrieval
listing meets a prompt it never saw, and on the CPU micro policy that breaks its call syntax
(docs/benchmarks.md, "Retrieval inside rounds"). So the episode host (sample, fork, eval) and
the init's demonstrations (`selskill.sft.demos`) take each decision's listing from here:
`DecisionListings` says what the system prompt lists and what a `progress` step appends to
the observation the decision is taken on, and `prefix_after_action` / `prefix_after_skill`
say how one ALFWorld turn extends the prefix retrieval reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from selskill.envs.base import EnvState
from selskill.skills import SkillLibrary, render_listing
from selskill.skills.retrieval import SkillRetriever
from selskill.skills.step_records import EpisodePrefix, skill_step, text_step

# what heads a `progress` listing at the end of an observation message
STEP_SKILLS_HEADING = "Skills for this step:"
# what the system prompt's skill section says instead of a listing in `progress` mode
PROGRESS_LISTING = f'(listed after each observation, under "{STEP_SKILLS_HEADING}")'


def listing_text(library: SkillLibrary, names: Sequence[str], style: str = "compact") -> str:
    """`names` as `render_listing` lists them, best first: a library would sort them by name."""
    return "\n".join(render_listing(SkillLibrary({n: library[n]}), style=style) for n in names)


class DecisionListings:
    """The listing rules of one library and retriever (None, or mode `all`: every skill, always)."""

    def __init__(self, library: SkillLibrary, retriever: SkillRetriever | None, style: str = "compact"):
        self.library = library
        self.style = style
        self.retriever = retriever if retriever is not None and retriever.config.mode != "all" else None

    @property
    def mode(self) -> str:
        return "all" if self.retriever is None else self.retriever.config.mode

    def listed(self, prefix: EpisodePrefix | None, pseudo_skills: Sequence[str] = ()) -> tuple[str, ...]:
        """The skills a decision after `prefix` may call (every skill without retrieval)."""
        if self.retriever is None:
            return self.library.names
        return self.retriever.listing(prefix, pseudo_skills).names

    def system_listing(self, listed: Sequence[str], full: str) -> str:
        """The system prompt's skill section: `full` (the whole library's, or an eval mode's
        text) without retrieval, the task's skills in `task` mode, a pointer in `progress`."""
        if self.mode == "all":
            return full
        return self.text(listed) if self.mode == "task" else PROGRESS_LISTING

    def text(self, names: Sequence[str]) -> str:
        return listing_text(self.library, names, self.style)

    def after_turn(
        self, prefix: EpisodePrefix, message: dict, listed: tuple[str, ...]
    ) -> tuple[tuple[str, ...], dict]:
        """The next decision's listing and the reply to the turn that shows it: `progress` lists
        anew from `prefix` (the episode after the turn); the other modes keep `listed`."""
        if self.mode != "progress":
            return listed, message
        listed = self.listed(prefix)
        return listed, self.step_message(message, listed)

    def step_message(self, message: dict, listed: Sequence[str]) -> dict:
        """`message` with the step's listing at its end (`progress` only; otherwise `message`)."""
        if self.mode != "progress":
            return message
        text = self.text(listed) or "(none)"
        return {**message, "content": f"{message['content']}\n\n{STEP_SKILLS_HEADING}\n{text}"}


def first_prefix(state: EnvState) -> EpisodePrefix:
    """What retrieval sees before an ALFWorld episode's first decision."""
    return EpisodePrefix(task=state.task, observation=state.observation)


def prefix_after_action(prefix: EpisodePrefix, action: str, observation: str) -> EpisodePrefix:
    """The prefix after an ALFWorld action and what the engine answered."""
    return prefix.extend(text_step(action, observation), observation=observation)


def prefix_after_skill(prefix: EpisodePrefix, library: SkillLibrary, name: str, call) -> EpisodePrefix:
    """The prefix after a call of `name` (`call`: its `SkillCallRecord`). A memory skill leaves
    the current observation as it was: it returns text, not a new view of the environment."""
    observation = call.observation if library[name].is_executable else prefix.observation
    return prefix.extend(skill_step(name, call.observation, call.precise), observation=observation)


__all__ = [
    "PROGRESS_LISTING",
    "STEP_SKILLS_HEADING",
    "DecisionListings",
    "first_prefix",
    "listing_text",
    "prefix_after_action",
    "prefix_after_skill",
]
