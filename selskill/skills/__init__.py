"""Skills: SKILL.md files, the listing the model sees, and the executor that runs calls.

A skill is metadata (name, when to use it) that is always listed plus content that is
disclosed only on invocation: memory skills return text, executable skills expand into
environment commands (or function calls) checked step by step.
"""

from selskill.skills.executor import PRECONDITIONS, Navigation, SkillCallRecord, SkillExecutor
from selskill.skills.listing import render_listing
from selskill.skills.loader import load_skills, parse_skill
from selskill.skills.model import CallStep, FindStep, Parameter, Skill, SkillError, SkillLibrary

__all__ = [
    "PRECONDITIONS",
    "CallStep",
    "FindStep",
    "Navigation",
    "Parameter",
    "Skill",
    "SkillCallRecord",
    "SkillError",
    "SkillExecutor",
    "SkillLibrary",
    "load_skills",
    "parse_skill",
    "render_listing",
]
