"""The in-memory form of a skill library.

Skills are immutable values so that one library can be shared by every episode, fork and
process of a stage without any of them changing what another sees.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

Kind = Literal["memory", "executable"]
KINDS: tuple[str, ...] = ("memory", "executable")
# what an argument may be: `name` is an object name, normalised (lower case, single spaces)
# as ALFWorld writes them; the others are JSON values passed on unchanged (call templates)
PARAMETER_TYPES: tuple[str, ...] = ("name", "string", "integer", "number", "boolean", "array")


class SkillError(ValueError):
    """A skill file or library is invalid; the message names the file and the field."""


@dataclass(frozen=True)
class Parameter:
    """One argument of an executable skill.

    `default_from` lets the model call the skill with no arguments at all, which is how
    small policies call it in practice; `required` says the value must exist (given or
    derived) before any step runs. `default` is a fixed value used when the call leaves
    the argument out (a call template's optional argument, e.g. no tags on a post).
    """

    name: str
    description: str
    required: bool = True
    default_from: str | None = None
    type: str = "name"
    default: object = None

    @property
    def optional_in_call(self) -> bool:
        """Whether the model may leave the argument out of its call."""
        return not self.required or self.default_from is not None or self.default is not None


@dataclass(frozen=True)
class FindStep:
    """Visit receptacles of the listed types, in order, until `target` is within reach.

    Needed where the place of an object is unknown ahead of time (a lamp for
    `examine_with_light`); the found instance name is bound to `bind` for later steps.
    """

    target: str
    visit: tuple[str, ...]
    bind: str


@dataclass(frozen=True)
class CallStep:
    """One function call, `name(arg={placeholder}, ...)`, for envs whose commands are calls.

    Placeholders stand for whole argument values and are filled with Python literals; the
    step fails when the env reports the call's result as an error. `bind` names fields of
    the call's JSON-object result for later steps, as (name, field) pairs.
    """

    call: str
    bind: tuple[tuple[str, str], ...] = ()


Step = str | FindStep | CallStep


@dataclass(frozen=True)
class Skill:
    """A parsed SKILL.md. `body` is returned (memory) or documents the procedure (executable)."""

    name: str
    description: str
    kind: Kind
    body: str
    parameters: tuple[Parameter, ...] = ()
    preconditions: tuple[str, ...] = ()
    steps: tuple[Step, ...] = ()
    path: str | None = None

    @property
    def is_executable(self) -> bool:
        return self.kind == "executable"

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters)


class SkillLibrary(Mapping[str, Skill]):
    """Skills by name, always in sorted-name order so that listings are reproducible."""

    def __init__(self, skills: Mapping[str, Skill] | None = None):
        items = dict(skills or {})
        for key, skill in items.items():
            if key != skill.name:
                raise SkillError(f"library key {key!r} does not match skill name {skill.name!r}")
        self._skills: dict[str, Skill] = {name: items[name] for name in sorted(items)}

    @classmethod
    def from_skills(cls, skills: list[Skill]) -> SkillLibrary:
        seen: dict[str, Skill] = {}
        for skill in skills:
            if skill.name in seen:
                raise SkillError(
                    f"duplicate skill name {skill.name!r} in {seen[skill.name].path} and {skill.path}"
                )
            seen[skill.name] = skill
        return cls(seen)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._skills)

    def __getitem__(self, name: str) -> Skill:
        return self._skills[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._skills)

    def __len__(self) -> int:
        return len(self._skills)

    def __repr__(self) -> str:
        return f"SkillLibrary({list(self._skills)})"
