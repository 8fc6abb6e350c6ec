"""The paper's engineering baselines (Appendix D) as prompt/library variants of one policy.

Each mode answers "can a prompt or listing change replace selectivity training?" without
touching the model, so each is a pure transformation of what the runner is given: the skill
library the executor accepts, the turn format (system prompt), and the skill text the
system prompt shows. Only evaluation uses them: sampling and forking always play the
`skills` mode, the one the policy is trained in.

- `skills`: the listing of the recipe (descriptions only; bodies on invocation).
- `no_skills`: no skill section and no skill tool; the policy can only act.
- `skills_as_context`: every skill body in the system message, no skill tool.
- `conservative`: the usual listing plus an instruction to prefer direct actions.
- `explicit_skip`: the usual listing plus `self_reasoning`, a memory skill whose listed
  purpose is "no other skill applies". Its calls are skill calls in every metric: they
  cost a turn and go through the tool like any other call.
- `listing_noise` (SelSkill's App. F): the usual listing of a library that the caller has
  padded with distractor skills (`selskill.stages.context.runner_library`, to
  `eval_listing_size`); here it is the `skills` mode, since only the library differs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from selskill.agent.turn_format import TurnFormat
from selskill.config.names import EVAL_MODES as MODES
from selskill.skills import Skill, SkillLibrary, render_listing

SKIP_SKILL = "self_reasoning"
SELF_REASONING = Skill(
    name=SKIP_SKILL,
    description=(
        "Use it when no other skill is applicable: reason about the observation yourself "
        "and then act directly."
    ),
    kind="memory",
    body=(
        "No skill applies here. Read the last observation, decide the next admissible "
        "command yourself and act directly."
    ),
)
CONSERVATIVE_INSTRUCTION = (
    "Prefer direct environment actions. Invoke a skill only when it is clearly necessary: "
    "when its preconditions hold now and acting directly would take more steps. "
    "Unneeded skill calls waste turns and can fail."
)


@dataclass(frozen=True)
class PromptSetup:
    """What the runner plays with: the callable skills, the turn format and the skill text."""

    library: SkillLibrary
    fmt: TurnFormat
    skill_text: str


def skill_bodies(library: SkillLibrary) -> str:
    """Every skill as `### name` + description + body, in library order."""
    return "\n\n".join(f"### {s.name}\n{s.description}\n{s.body.strip()}" for s in library.values())


def prompt_setup(mode: str, library: SkillLibrary, fmt: TurnFormat, listing_style: str) -> PromptSetup:
    if mode not in MODES:
        raise ValueError(f"unknown eval mode {mode!r}; choose one of: {', '.join(MODES)}")
    if mode == "no_skills":
        return PromptSetup(SkillLibrary(), dataclasses.replace(fmt, skills_section="none"), "")
    if mode == "skills_as_context":
        return PromptSetup(
            SkillLibrary(), dataclasses.replace(fmt, skills_section="context"), skill_bodies(library)
        )
    if mode == "explicit_skip":
        if SKIP_SKILL in library:
            raise ValueError(f"the skill library already has a skill named {SKIP_SKILL!r}")
        library = SkillLibrary({**library, SKIP_SKILL: SELF_REASONING})
    if mode == "conservative":
        fmt = dataclasses.replace(fmt, instruction=CONSERVATIVE_INSTRUCTION)
    return PromptSetup(library, fmt, render_listing(library, style=listing_style))
