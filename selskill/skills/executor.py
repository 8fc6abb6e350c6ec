"""Runs skill calls against any `selskill.envs.base.Env`.

Everything the executor knows about the game comes from the Env protocol (admissible
commands, the observation, the inventory), never from engine internals, so a skill that
runs here runs the same in every backend. Each expanded command is checked against the
admissible commands *before* it is sent: an inadmissible command still costs a step in
ALFWorld, and a skill must never spend the agent's budget on a command that cannot work.
The record it returns is what Exec. Prec. and the rollout schema are computed from.

Call steps (`CallStep`) serve envs whose commands are function calls (BFCL): the name
must be among the admissible commands, the filled template is sent as one step, and the
env's report of that call (`state.info[CALL_RESULTS]`: output, error) decides whether the
step failed and supplies the fields later steps bind.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from string import Formatter

from selskill.envs.base import Env, natural_key
from selskill.skills.call_templates import parse_one_call
from selskill.skills.model import CallStep, FindStep, Skill, SkillLibrary
from selskill.skills.step_records import NO_EFFECT_FEEDBACK

TYPE_RE = re.compile(r"^[a-z][a-z0-9]*$")
FUNCTION_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# the key under which an env that executes function calls reports each call of a step:
# a list of {"call", "output", "error"} dicts (selskill/benchmarks/bfcl/env.py)
CALL_RESULTS = "call_results"


def template_fields(template: str) -> list[str]:
    """Placeholder names of a step template; raises ValueError on anything but `{name}`."""
    names = []
    for _, field_name, spec, conversion in Formatter().parse(template):
        if field_name is None:
            continue
        if not re.fullmatch(r"[a-z][a-z0-9_]*", field_name) or spec or conversion:
            raise ValueError(f"placeholder {{{field_name}}} must be a plain {{name}}")
        names.append(field_name)
    return names


@dataclass(frozen=True)
class Navigation:
    """The commands a text environment moves and looks around with (`go to X`, `examine X` in
    ALFWorld's households). `find` steps and the receptacle preconditions and defaults read the
    agent's surroundings through them; a benchmark whose skills use none of those declares none
    (`selskill.agent.hooks.EpisodeHooks.navigation`)."""

    go: str  # moves the agent to a receptacle; not admissible for the one it is at
    look: str  # admissible for the receptacle the agent is at

    def target(self, command: str, verb: str) -> str | None:
        """The receptacle `command` names after `verb` (None: another command)."""
        return command[len(verb) + 1 :] if command.startswith(verb + " ") else None


class _View:
    """What the agent can tell about its surroundings from the protocol alone."""

    def __init__(self, env: Env, navigation: Navigation | None = None):
        self.admissible: list[str] = list(env.state.admissible_commands)
        self.inventory: list[str] = [name.strip() for name in env.inventory()]
        self.navigation = navigation

    def _nav(self) -> Navigation:
        if self.navigation is None:
            raise _Failure(
                "no_navigation",
                "this environment declares no commands to move and look around, which find steps and "
                "receptacle checks need",
            )
        return self.navigation

    @property
    def goto_targets(self) -> list[str]:
        nav = self._nav()
        return [t for t in (nav.target(c, nav.go) for c in self.admissible) if t is not None]

    def is_at(self, receptacle: str) -> bool:
        # going to a receptacle is not admissible where the agent already is; looking at it is
        nav = self._nav()
        return (
            f"{nav.look} {receptacle}" in self.admissible
            and f"{nav.go} {receptacle}" not in self.admissible
            and receptacle not in self.inventory
        )

    def instances(self, rtype: str) -> list[str]:
        """Receptacles of `rtype`, the one the agent is at first, then in natural order."""
        nav = self._nav()
        pattern = re.compile(rf"{re.escape(rtype)} \d+")
        here = [t for t in (nav.target(c, nav.look) for c in self.admissible) if t is not None]
        at = sorted((r for r in here if pattern.fullmatch(r) and self.is_at(r)), key=natural_key)
        away = sorted((r for r in self.goto_targets if pattern.fullmatch(r)), key=natural_key)
        return at + [r for r in away if r not in at]

    def reachable_targets(self, target: str) -> list[str]:
        """Instances of object type `target` that some admissible command acts on."""
        pattern = re.compile(rf"(?<![a-z0-9]){re.escape(target)} \d+(?![0-9])")
        found = {m.group(0) for c in self.admissible for m in pattern.finditer(c)}
        return sorted(found - set(self.inventory), key=natural_key)


# --- preconditions -------------------------------------------------------------------


@dataclass(frozen=True)
class Precondition:
    """A named check. `arg` says what follows the colon: nothing, a type word, or a parameter."""

    arg: str | None
    message: str
    check: Callable[[_View, str | None, Mapping[str, str | None]], bool]


def value_has_type(kind: str, value: object) -> bool:
    """Whether `value` is a JSON value of parameter type `kind` (bool is no number)."""
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list)
    return isinstance(value, str)  # "name"


def call_template_problem(template: str, fields: list[str]) -> str | None:
    """Why `template` is not one call whose placeholders are whole argument values (None if it is)."""
    sentinels = {f: 7_000_000_000 + i for i, f in enumerate(dict.fromkeys(fields))}
    try:
        call = parse_one_call(template.format(**{f: repr(v) for f, v in sentinels.items()}))
    except (ValueError, IndexError, KeyError) as exc:
        return f"not one function call with literal arguments: {exc}"
    values = list(call.kwargs.values())
    for name, sentinel in sentinels.items():
        if sentinel not in values:
            return f"placeholder {{{name}}} must be a whole argument value, as in f(x={{{name}}})"
    return None


def _holds(view: _View, param: str | None, values: Mapping[str, str | None]) -> bool:
    value = values.get(param or "")
    return value is not None and value in view.inventory


PRECONDITIONS: dict[str, Precondition] = {
    "holding_object": Precondition(None, "you are not holding anything", lambda v, a, p: bool(v.inventory)),
    "hands_empty": Precondition(None, "your hands are not empty", lambda v, a, p: not v.inventory),
    "receptacle_exists": Precondition(
        "type", "there is no {arg} here", lambda v, a, p: bool(v.instances(a or ""))
    ),
    "holding": Precondition("parameter", "you are not holding the {value}", _holds),
    # a command (a function name, for call-based envs) among the admissible ones
    "available": Precondition("name", "{arg} is not available", lambda v, a, p: (a or "") in v.admissible),
}

DEFAULT_SOURCES = ("held_object", "receptacle:<type>")


def split_check(spec: str) -> tuple[str, str | None]:
    name, sep, arg = spec.partition(":")
    return name, (arg if sep else None)


def precondition_problem(spec: object, parameter_names: tuple[str, ...]) -> str | None:
    """Why `spec` is not a valid precondition for a skill with these parameters (None if it is)."""
    if not isinstance(spec, str):
        return f"precondition must be a string, got {spec!r}"
    name, arg = split_check(spec)
    entry = PRECONDITIONS.get(name)
    if entry is None:
        return f"unknown precondition {spec!r} (known: {', '.join(sorted(PRECONDITIONS))})"
    if entry.arg is None and arg is not None:
        return f"precondition {name!r} takes no argument, got {spec!r}"
    if entry.arg == "type" and not (arg and TYPE_RE.fullmatch(arg)):
        return f"precondition {spec!r} needs a type, as in '{name}:microwave'"
    if entry.arg == "name" and not (arg and FUNCTION_RE.fullmatch(arg)):
        return f"precondition {spec!r} needs a function name, as in '{name}:place_order'"
    if entry.arg == "parameter" and arg not in parameter_names:
        return f"precondition {spec!r} names no parameter of this skill ({', '.join(parameter_names)})"
    return None


def default_from_problem(spec: object) -> str | None:
    """Why `spec` is not a valid `default_from` (None if it is)."""
    if spec == "held_object":
        return None
    if (
        isinstance(spec, str)
        and spec.startswith("receptacle:")
        and TYPE_RE.fullmatch(spec[len("receptacle:") :])
    ):
        return None
    return f"unknown default_from {spec!r} (known: {', '.join(DEFAULT_SOURCES)})"


def _default_value(view: _View, spec: str) -> str | None:
    if spec == "held_object":
        return view.inventory[0] if view.inventory else None
    found = view.instances(spec[len("receptacle:") :])
    return found[0] if found else None


# --- the record ----------------------------------------------------------------------


@dataclass
class SkillCallRecord:
    """One skill call as the rollout records it; `to_dict` is plain JSON."""

    skill: str
    arguments: dict
    kind: str | None
    precise: bool
    error: str | None
    env_steps: int
    actions: list[str]
    observation: str
    won: bool
    done: bool
    resolved: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class _Failure(Exception):
    def __init__(self, error: str, message: str):
        super().__init__(error)
        self.error = error
        self.message = message


# --- the executor --------------------------------------------------------------------


class SkillExecutor:
    """Executes calls of one library; holds no per-episode state, so one can serve many envs."""

    def __init__(self, library: SkillLibrary, navigation: Navigation | None = None):
        self.library = library
        self.navigation = navigation

    def execute(self, env: Env, name: str, arguments: Mapping | None = None) -> SkillCallRecord:
        given = dict(arguments) if isinstance(arguments, Mapping) else {}
        skill = self.library.get(name) if isinstance(name, str) else None
        record = SkillCallRecord(
            skill=name if isinstance(name, str) else repr(name),
            arguments=_jsonable(given),
            kind=skill.kind if skill else None,
            precise=False,
            error=None,
            env_steps=0,
            actions=[],
            observation="",
            won=bool(env.state.won),
            done=bool(env.state.done),
        )
        lines: list[str] = []
        try:
            if skill is None:
                known = ", ".join(self.library.names)
                raise _Failure("unknown_skill", f"There is no skill named {name!r}. Skills: {known}.")
            if arguments is not None and not isinstance(arguments, Mapping):
                raise _Failure("bad_arguments", f"The arguments of {name} must be a JSON object.")
            values = self._check_arguments(skill, given)
            if skill.kind == "memory":
                record.observation = skill.body
                record.precise = True
                return record
            if env.state.done:
                raise _Failure("episode_done", "The episode is over; no action can be taken.")
            self._run(env, skill, values, record, lines)
            record.precise = True
        except _Failure as failure:
            record.error = failure.error
            lines.append(f"{record.skill} failed: {failure.message}")
        record.observation = "\n".join(lines)
        record.won = bool(env.state.won)
        record.done = bool(env.state.done)
        return record

    @staticmethod
    def _check_arguments(skill: Skill, given: dict) -> dict[str, object]:
        values: dict[str, object] = {}
        types = {p.name: p.type for p in skill.parameters}
        for key, value in given.items():
            if key not in skill.parameter_names:
                accepted = ", ".join(skill.parameter_names) or "no arguments"
                raise _Failure(
                    f"bad_argument:{key}", f"{skill.name} has no argument {key!r} (it takes {accepted})."
                )
            kind = types[key]
            if value is None or (kind == "name" and isinstance(value, str) and not value.strip()):
                continue  # an empty value means "use the default", as models often write it
            if kind != "name":
                if not value_has_type(kind, value):
                    raise _Failure(f"bad_argument:{key}", f"argument {key!r} must be a JSON {kind}.")
                values[key] = value
                continue
            if not isinstance(value, str):
                raise _Failure(f"bad_argument:{key}", f"argument {key!r} must be a name such as 'mug 1'.")
            values[key] = " ".join(value.lower().split())
        return values

    def _run(
        self, env: Env, skill: Skill, values: dict[str, object], record: SkillCallRecord, lines: list[str]
    ):
        view = _View(env, self.navigation)
        bound: dict[str, object] = {}
        for param in skill.parameters:
            value = values.get(param.name)
            if value is None and param.default is not None:
                value = param.default
            elif value is None and param.default_from:
                value = _default_value(view, param.default_from)
            elif value is not None and (param.default_from or "").startswith("receptacle:"):
                rtype = param.default_from.split(":", 1)[1]
                if not re.fullmatch(rf"{re.escape(rtype)} \d+", value):
                    raise _Failure(
                        f"bad_argument:{param.name}", f"{param.name} must be a {rtype}, got {value!r}."
                    )
            bound[param.name] = value
        record.resolved = dict(bound)

        # Preconditions run in file order before required arguments are enforced, so that
        # "holding nothing" is reported as such, not as the missing held object it implies.
        for spec in skill.preconditions:
            check_name, arg = split_check(spec)
            entry = PRECONDITIONS[check_name]
            if not entry.check(view, arg, bound):
                value = bound.get(arg or "") or arg
                message = entry.message.format(arg=arg, value=value)
                raise _Failure(f"precondition_failed:{spec}", f"cannot start: {message}.")
        for param in skill.parameters:
            if param.required and bound[param.name] is None:
                raise _Failure(
                    f"bad_argument:{param.name}", f"no value for {param.name}: {param.description}"
                )

        for index, step in enumerate(skill.steps):
            if isinstance(step, FindStep):
                bound[step.bind] = self._find(env, step, record, lines)
                record.resolved[step.bind] = bound[step.bind]
            elif isinstance(step, CallStep):
                for name, value in self._call(env, step, bound, record, lines).items():
                    bound[name] = record.resolved[name] = value
            else:
                missing = [name for name in template_fields(step) if bound.get(name) is None]
                if missing:
                    raise _Failure(f"bad_argument:{missing[0]}", f"no value for {missing[0]}.")
                self._command(env, step.format(**bound), record, lines)
            if env.state.done:
                if env.state.won:
                    return  # the task is complete; the remaining steps have no purpose
                if index < len(skill.steps) - 1:
                    raise _Failure("episode_done", "the episode ended before the skill finished.")

    @staticmethod
    def _step(env: Env, command: str, record: SkillCallRecord, lines: list[str]) -> str:
        state = env.step(command)
        record.env_steps += state.env_steps
        record.actions.append(command)
        lines.append(f"> {command}\n{state.observation.strip()}")
        if state.observation.strip() == NO_EFFECT_FEEDBACK:
            raise _Failure(f"no_effect:{command}", f"{command!r} had no effect.")
        return state.observation

    def _command(self, env: Env, command: str, record: SkillCallRecord, lines: list[str]) -> None:
        view = _View(env, self.navigation)
        going_to = self.navigation.target(command, self.navigation.go) if self.navigation else None
        if going_to is not None and view.is_at(going_to):
            return  # already there: the environment refuses the move, and nothing needs doing
        if command not in view.admissible:
            raise _Failure(f"inadmissible:{command}", f"{command!r} is not possible here.")
        self._step(env, command, record, lines)

    def _call(self, env: Env, step: CallStep, bound: dict, record: SkillCallRecord, lines: list[str]) -> dict:
        """Send one filled call template; returns the values its result binds."""
        fields = template_fields(step.call)
        missing = [name for name in fields if bound.get(name) is None]
        if missing:
            raise _Failure(f"bad_argument:{missing[0]}", f"no value for {missing[0]}.")
        try:
            call = parse_one_call(step.call.format(**{name: repr(bound[name]) for name in fields}))
        except ValueError as exc:
            raise _Failure(
                f"bad_argument:{fields[0] if fields else 'call'}", f"cannot fill {step.call!r}: {exc}"
            ) from None
        if call.name not in _View(env, self.navigation).admissible:
            raise _Failure(f"inadmissible:{call.name}", f"{call.name} is not available now.")
        command = call.render()
        state = env.step(command)
        record.env_steps += state.env_steps
        record.actions.append(command)
        lines.append(f"> {command}\n{state.observation.strip()}")
        reports = state.info.get(CALL_RESULTS) or []
        output = str(reports[0].get("output", "")) if reports else state.observation
        if reports and reports[0].get("error"):
            raise _Failure(f"call_error:{call.name}", f"{call.name} returned an error: {output}")
        if not step.bind:
            return {}
        try:
            result = json.loads(output)
        except ValueError:
            result = None
        values = {}
        for name, key in step.bind:
            if not isinstance(result, dict) or result.get(key) is None:
                raise _Failure(f"bind_failed:{name}", f"{call.name} returned no {key!r} for {name}.")
            values[name] = result[key]
        return values

    def _find(self, env: Env, step: FindStep, record: SkillCallRecord, lines: list[str]) -> str:
        view = _View(env, self.navigation)
        found = view.reachable_targets(step.target)
        if found:
            return found[0]
        plan = [r for rtype in step.visit for r in view.instances(rtype) if not view.is_at(r)]
        for receptacle in plan:
            self._command(env, f"{view.navigation.go} {receptacle}", record, lines)
            found = _View(env, self.navigation).reachable_targets(step.target)
            if found:
                return found[0]
            if env.state.done:
                raise _Failure("episode_done", "the episode ended during the search.")
        visited = ", ".join(plan) or "nowhere to look"
        raise _Failure(f"not_found:{step.target}", f"no {step.target} found (searched: {visited}).")


def _jsonable(arguments: dict) -> dict:
    def plain(value: object) -> object:
        if isinstance(value, (str, int, float, bool, type(None))):
            return value
        try:
            return json.loads(json.dumps(value))
        except (TypeError, ValueError):
            return repr(value)

    return {str(k): plain(v) for k, v in arguments.items()}
