"""What the model sees of a skill library before it decides to invoke anything.

Only metadata is listed (the paper's progressive disclosure): a skill's body reaches the
context only when the skill is invoked, which is what makes invoking a decision with a
cost and a benefit that DPO can learn.
"""

from __future__ import annotations

import json

from selskill.config.names import LISTING_STYLES as STYLES
from selskill.skills.model import Skill, SkillLibrary


def _signature(skill: Skill) -> str:
    if not skill.is_executable:
        return skill.name
    params = ", ".join(p.name + ("?" if p.optional_in_call else "") for p in skill.parameters)
    return f"{skill.name}({params})"


def _full_entry(skill: Skill) -> list[str]:
    lines = [f"- {skill.name} ({skill.kind}): {skill.description}"]
    for param in skill.parameters:
        if param.default_from == "held_object":
            default = "; default: the object you hold"
        elif param.default_from:
            rtype = param.default_from.split(":", 1)[1]
            default = f"; default: the {rtype} you are at, else the lowest-numbered one"
        elif param.default is not None:
            default = f"; default: {json.dumps(param.default)}"
        else:
            default = ""
        need = "required" if param.required and not param.optional_in_call else "optional"
        if param.type != "name":
            need = f"{param.type}, {need}"
        lines.append(f"    {param.name} ({need}{default}): {param.description}")
    return lines


def render_listing(library: SkillLibrary, style: str = "compact") -> str:
    """One entry per skill in library order; `compact` is one line each, `full` adds parameters.

    In `compact`, executable skills show their parameter names, with `?` on those the call
    may leave out.
    """
    if style not in STYLES:
        raise ValueError(f"unknown listing style {style!r} (allowed: {', '.join(STYLES)})")
    lines: list[str] = []
    for skill in library.values():
        if style == "compact":
            lines.append(f"- {_signature(skill)}: {skill.description}")
        else:
            lines.extend(_full_entry(skill))
    return "\n".join(lines)
