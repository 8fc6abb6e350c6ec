"""Reads SKILL.md files into a `SkillLibrary`, refusing anything the executor could misrun.

Validation happens here, once, at load time: a typo in a step template or a precondition
would otherwise surface as silently failing skill calls in the middle of a rollout (the
paper's library targeted a grammar the engine no longer accepts and nobody noticed).
Every error names the file and the field so that a library author can fix it directly.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from selskill.skills.executor import (
    call_template_problem,
    default_from_problem,
    precondition_problem,
    template_fields,
    value_has_type,
)
from selskill.skills.model import (
    KINDS,
    PARAMETER_TYPES,
    CallStep,
    FindStep,
    Parameter,
    Skill,
    SkillError,
    SkillLibrary,
    Step,
)

if TYPE_CHECKING:  # importlib.resources.abc is 3.11+; only the annotation needs it
    from importlib.resources.abc import Traversable

SKILL_FILE = "SKILL.md"
NAME_RE = re.compile(r"[a-z][a-z0-9_]*")
TYPE_RE = re.compile(r"[a-z][a-z0-9]*")
FIELDS = {"name", "description", "kind", "parameters", "preconditions", "steps"}
EXECUTABLE_ONLY = ("parameters", "preconditions", "steps")
PARAMETER_FIELDS = {"name", "description", "required", "default_from", "type", "default"}
FIND_FIELDS = {"target", "visit", "bind"}
CALL_FIELDS = {"call", "bind"}


def split_front_matter(text: str, where: str) -> tuple[dict, str]:
    """Return (front matter mapping, body) of a SKILL.md text."""
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        raise SkillError(f"{where}: missing front matter (the file must start with a '---' line)")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise SkillError(f"{where}: front matter is not closed by a '---' line") from None
    try:
        meta = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as exc:
        raise SkillError(f"{where}: front matter is not valid YAML: {exc}") from None
    if not isinstance(meta, dict):
        raise SkillError(f"{where}: front matter must be a mapping of fields")
    return meta, "\n".join(lines[end + 1 :]).strip()


def parse_skill(text: str, where: str, expected_name: str | None = None) -> Skill:
    """Parse one SKILL.md text; `where` names it in errors, `expected_name` is its directory."""
    meta, body = split_front_matter(text, where)

    def fail(field: str, problem: str) -> SkillError:
        return SkillError(f"{where}: field '{field}': {problem}")

    unknown = sorted(set(map(str, meta)) - FIELDS)
    if unknown:
        raise fail(unknown[0], f"unknown field (allowed: {', '.join(sorted(FIELDS))})")
    for required in ("name", "description", "kind"):
        if required not in meta:
            raise fail(required, "missing")

    name = meta["name"]
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise fail("name", f"must be snake_case, got {name!r}")
    if expected_name is not None and name != expected_name:
        raise fail("name", f"{name!r} must equal its directory name {expected_name!r}")
    description = meta["description"]
    if not isinstance(description, str) or not description.strip():
        raise fail("description", "must be a non-empty string saying when to use the skill")
    kind = meta["kind"]
    if kind not in KINDS:
        raise fail("kind", f"unknown kind {kind!r} (allowed: {', '.join(KINDS)})")
    if not body:
        raise fail("body", "empty: a memory skill returns its body, an executable one documents it")

    common = dict(name=name, description=" ".join(description.split()), kind=kind, body=body, path=where)
    if kind == "memory":
        for field in EXECUTABLE_ONLY:
            if field in meta:
                raise fail(field, "only executable skills have it")
        return Skill(**common)

    parameters = _parameters(meta.get("parameters") or [], fail)
    names = tuple(p.name for p in parameters)
    preconditions = meta.get("preconditions") or []
    if not isinstance(preconditions, list):
        raise fail("preconditions", "must be a list of check names")
    for spec in preconditions:
        problem = precondition_problem(spec, names)
        if problem:
            raise fail("preconditions", problem)
    steps = _steps(meta.get("steps"), names, fail)
    return Skill(**common, parameters=parameters, preconditions=tuple(preconditions), steps=steps)


def _parameters(raw, fail) -> tuple[Parameter, ...]:
    if not isinstance(raw, list):
        raise fail("parameters", "must be a list of {name, description, required, default_from}")
    parameters: list[Parameter] = []
    for i, item in enumerate(raw):
        label = f"parameters[{i}]"
        if not isinstance(item, dict):
            raise fail(label, "must be a mapping")
        extra = sorted(set(map(str, item)) - PARAMETER_FIELDS)
        if extra:
            raise fail(
                f"{label}.{extra[0]}", f"unknown field (allowed: {', '.join(sorted(PARAMETER_FIELDS))})"
            )
        pname = item.get("name")
        if not isinstance(pname, str) or not NAME_RE.fullmatch(pname):
            raise fail(f"{label}.name", f"must be snake_case, got {pname!r}")
        if pname in (p.name for p in parameters):
            raise fail(f"{label}.name", f"duplicate parameter {pname!r}")
        description = item.get("description")
        if not isinstance(description, str) or not description.strip():
            raise fail(f"{label}.description", "missing")
        required = item.get("required", True)
        if not isinstance(required, bool):
            raise fail(f"{label}.required", f"must be true or false, got {required!r}")
        default_from = item.get("default_from")
        if default_from is not None:
            problem = default_from_problem(default_from)
            if problem:
                raise fail(f"{label}.default_from", problem)
        kind = item.get("type", "name")
        if kind not in PARAMETER_TYPES:
            raise fail(f"{label}.type", f"unknown type {kind!r} (allowed: {', '.join(PARAMETER_TYPES)})")
        if default_from is not None and kind != "name":
            raise fail(f"{label}.default_from", "only parameters of type name derive a default")
        default = item.get("default")
        if default is not None and not value_has_type(kind, default):
            raise fail(f"{label}.default", f"{default!r} is not a {kind}")
        parameters.append(
            Parameter(pname, " ".join(description.split()), required, default_from, kind, default)
        )
    return tuple(parameters)


def _steps(raw, parameter_names: tuple[str, ...], fail) -> tuple[Step, ...]:
    if not isinstance(raw, list) or not raw:
        raise fail("steps", "an executable skill needs a non-empty list of steps")
    known = set(parameter_names)
    steps: list[Step] = []
    for i, item in enumerate(raw):
        label = f"steps[{i}]"
        if isinstance(item, str):
            try:
                fields = template_fields(item)
            except ValueError as exc:
                raise fail(label, str(exc)) from None
            missing = [f for f in fields if f not in known]
            if missing:
                raise fail(
                    label, f"placeholder {{{missing[0]}}} is not a parameter ({', '.join(sorted(known))})"
                )
            if not item.strip() or item != " ".join(item.split()):
                raise fail(label, f"a command must be one line with single spaces, got {item!r}")
            steps.append(item)
        elif isinstance(item, dict) and set(item) == {"find"}:
            steps.append(_find_step(item["find"], f"{label}.find", known, fail))
            known.add(steps[-1].bind)
        elif isinstance(item, dict) and "call" in item and set(map(str, item)) <= CALL_FIELDS:
            steps.append(_call_step(item, label, known, fail))
            known.update(name for name, _ in steps[-1].bind)
        else:
            raise fail(
                label,
                "must be a command template string, a mapping {find: {target, visit, bind}} "
                "or a mapping {call, bind}",
            )
    return tuple(steps)


def _call_step(raw: dict, label: str, known: set[str], fail) -> CallStep:
    template = raw["call"]
    if not isinstance(template, str) or not template.strip():
        raise fail(f"{label}.call", 'must be a call template such as "get_stock_info(symbol={symbol})"')
    try:
        fields = template_fields(template)
    except ValueError as exc:
        raise fail(f"{label}.call", str(exc)) from None
    missing = [f for f in fields if f not in known]
    if missing:
        raise fail(
            f"{label}.call",
            f"placeholder {{{missing[0]}}} is neither a parameter nor bound earlier ({', '.join(sorted(known))})",
        )
    problem = call_template_problem(template, fields)
    if problem:
        raise fail(f"{label}.call", problem)
    bind = raw.get("bind") or {}
    if not isinstance(bind, dict):
        raise fail(f"{label}.bind", "must be a mapping {new name: field of the call's result}")
    pairs = []
    for name, key in bind.items():
        if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in known:
            raise fail(f"{label}.bind", f"must bind new snake_case names, got {name!r}")
        if not isinstance(key, str) or not key:
            raise fail(f"{label}.bind.{name}", f"must name a field of the result, got {key!r}")
        pairs.append((name, key))
    return CallStep(template, tuple(pairs))


def _find_step(raw, label: str, known: set[str], fail) -> FindStep:
    if not isinstance(raw, dict) or set(map(str, raw)) != FIND_FIELDS:
        raise fail(label, f"needs exactly the fields {', '.join(sorted(FIND_FIELDS))}")
    target, visit, bind = raw["target"], raw["visit"], raw["bind"]
    if not isinstance(target, str) or not TYPE_RE.fullmatch(target):
        raise fail(f"{label}.target", f"must be an object type such as 'desklamp', got {target!r}")
    if (
        not isinstance(visit, list)
        or not visit
        or not all(isinstance(v, str) and TYPE_RE.fullmatch(v) for v in visit)
    ):
        raise fail(f"{label}.visit", "must be a non-empty list of receptacle types such as 'desk'")
    if not isinstance(bind, str) or not NAME_RE.fullmatch(bind) or bind in known:
        raise fail(f"{label}.bind", f"must be a new snake_case name, got {bind!r}")
    return FindStep(target, tuple(visit), bind)


def _skill_files(directory: Traversable, prefix: str) -> list[tuple[Traversable, str]]:
    """(file, display path) of every SKILL.md below `directory`, in a stable order."""
    found = []
    for child in sorted(directory.iterdir(), key=lambda c: c.name):
        shown = f"{prefix}/{child.name}"
        if child.is_dir():
            found.extend(_skill_files(child, shown))
        elif child.name == SKILL_FILE:
            found.append((child, shown))
    return found


def load_skills(*directories: str | Path | Traversable) -> SkillLibrary:
    """Load every `<name>/SKILL.md` below the given directories into one library.

    A skill's directory name is its name; the same name twice (in two directories or two
    nested folders) is an error naming both files.
    """
    skills: list[Skill] = []
    for directory in directories:
        root = Path(directory) if isinstance(directory, str) else directory
        if not root.is_dir():
            raise SkillError(f"{root}: skill directory not found")
        for file, shown in _skill_files(root, str(root)):
            parent = shown.rsplit("/", 2)[-2]
            skills.append(parse_skill(file.read_text(encoding="utf-8"), shown, expected_name=parent))
    return SkillLibrary.from_skills(skills)
