"""Reads SKILL.md files into a `SkillLibrary`, refusing anything the executor could misrun.

Validation happens here, once, at load time: a typo in a step template or a precondition
would otherwise surface as silently failing skill calls in the middle of a rollout (the
paper's library targeted a grammar the engine no longer accepts and nobody noticed).
Every error names the file and the field so that a library author can fix it directly.

Skill files can come from anywhere (`selskill import-skills` reads downloaded collections), so
reading is bounded here, for `load_skills` and the importer alike: a file is read only if it is
a regular file (a FIFO would block forever, a link loop never resolves) of at most
`max_file_bytes`, and its front matter only if YAML aliases do not expand it past
`YAML_EXPANSION` times its own text (nested aliases make a few hundred bytes stand for
billions of values, which any later walk or error message would expand). `load_skills`
refuses such a file with a one-line error naming it and the reason; the importer skips it
and counts the reason.
"""

from __future__ import annotations

import errno
import os
import re
import reprlib
import stat
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
MAX_FILE_BYTES = 1_000_000  # a SKILL.md is a page of text; far larger is not one
YAML_EXPANSION = 10  # front matter may expand through aliases to this many times its text (+ SLACK)
YAML_EXPANSION_SLACK = 10_000
NAME_RE = re.compile(r"[a-z][a-z0-9_]*")
TYPE_RE = re.compile(r"[a-z][a-z0-9]*")
FIELDS = {"name", "description", "kind", "parameters", "preconditions", "steps"}
EXECUTABLE_ONLY = ("parameters", "preconditions", "steps")
PARAMETER_FIELDS = {"name", "description", "required", "default_from", "type", "default"}
FIND_FIELDS = {"target", "visit", "bind"}
CALL_FIELDS = {"call", "bind"}


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 120


def shown(value: object) -> str:
    """`repr(value)` cut short: what an error shows of a value read from a skill file."""
    return _SHORT.repr(value)


class SkillFileSkipped(SkillError):
    """A skill file that is not read; `reason` is the word the importer counts it under."""

    def __init__(self, where: str, reason: str, detail: str):
        super().__init__(f"{where}: {reason}: {detail}")
        self.where, self.reason, self.detail = where, reason, detail


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device"}  # fmt: skip


def _special(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def read_skill_file(path: Path, max_file_bytes: int | None = MAX_FILE_BYTES) -> str:
    """The text of the skill file at `path`; `SkillFileSkipped` when it is not a regular file (a link
    loop, a FIFO), is over `max_file_bytes` (checked before reading, and while reading in case it
    grew) or is not UTF-8. Opened without blocking, so a FIFO is refused instead of waited on."""
    where = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SkillFileSkipped(where, "link_loop", "a symbolic link that leads back to itself") from None
        if exc.errno == errno.ENOENT and path.is_symlink():
            raise SkillFileSkipped(
                where, "broken_link", f"links to {os.readlink(path)}, which is absent"
            ) from None
        raise SkillFileSkipped(where, "unreadable", exc.strerror or str(exc)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SkillFileSkipped(where, "not_a_file", f"{_special(info.st_mode)}, not a regular file")
        over = f"over max_file_bytes {max_file_bytes:,}" if max_file_bytes is not None else ""
        if max_file_bytes is not None and info.st_size > max_file_bytes:
            raise SkillFileSkipped(where, "too_large", f"{info.st_size:,} bytes, {over}")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if max_file_bytes is not None and size > max_file_bytes:
                raise SkillFileSkipped(where, "too_large", f"more than {max_file_bytes:,} bytes, {over}")
    except OSError as exc:
        raise SkillFileSkipped(where, "unreadable", exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SkillFileSkipped(
            where, "unreadable", f"not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None


def _read_resource(file: Traversable, where: str, max_file_bytes: int | None) -> str:
    """A skill file inside a package that is not a folder on disk (a zip), read within the same bound."""
    with file.open("rb") as f:
        data = f.read(-1 if max_file_bytes is None else max_file_bytes + 1)
    if max_file_bytes is not None and len(data) > max_file_bytes:
        raise SkillFileSkipped(where, "too_large", f"more than {max_file_bytes:,} bytes")
    return data.decode("utf-8")


def walk_files(root: Path, confine: bool) -> tuple[list[Path], list[tuple[str, str]]]:
    """Every regular file below `root` and each entry left out with its reason, `(path, "reason: detail")`.

    Links are followed, each resolved folder once (so a folder link back up ends). A link loop or a
    link to nothing is left out (`link_loop`, `broken_link`: it may have been meant as a folder), and
    so is a SKILL.md that is not a regular file (`not_a_file`); other special files are not skill
    files and are passed over. With `confine`, a folder or SKILL.md that resolves outside `root` is
    left out too (`outside_source`): a downloaded collection could otherwise read any file.
    """
    real_root = root.resolve()
    files: list[Path] = []
    left: list[tuple[str, str]] = []
    seen: set[str] = set()
    stack = [root]
    while stack:
        folder = stack.pop()
        real_folder = os.path.realpath(folder)
        if real_folder in seen:
            continue
        seen.add(real_folder)
        try:
            entries = sorted(folder.iterdir(), reverse=True)
        except OSError as exc:
            left.append((str(folder), f"unreadable: {exc.strerror or exc}"))
            continue
        for p in entries:
            named_skill = p.name.lower() == SKILL_FILE.lower()
            try:
                mode = p.stat().st_mode  # follows links
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    left.append((str(p), "link_loop: a symbolic link that leads back to itself"))
                elif p.is_symlink():
                    left.append((str(p), f"broken_link: links to {os.readlink(p)}, which is absent"))
                elif named_skill:
                    left.append((str(p), f"unreadable: {exc.strerror or exc}"))
                continue
            real = Path(os.path.realpath(p))
            if confine and not real.is_relative_to(real_root):
                if stat.S_ISDIR(mode) or named_skill:
                    left.append((str(p), f"outside_source: links to {real}, outside {real_root}"))
            elif stat.S_ISDIR(mode):
                stack.append(p)
            elif stat.S_ISREG(mode):
                files.append(p)
            elif named_skill:
                left.append((str(p), f"not_a_file: {_special(mode)}, not a regular file"))
    return sorted(files), sorted(left)


def _expanded_size(root: yaml.Node, limit: int) -> int | None:
    """Values plus scalar characters of the YAML graph at `root` with every alias expanded; None past
    `limit` or for an alias inside its own anchor. Walked without recursion, each node once."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, closing = stack.pop()
        key = id(node)
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        if closing:
            open_nodes.discard(key)
            total = 1 + (len(node.value) if isinstance(node, yaml.ScalarNode) else 0)
            total += sum(size[id(c)] for c in children)
            if total > limit:
                return None
            size[key] = total
            continue
        if key in size:
            continue
        if key in open_nodes:
            return None
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)
    return size[id(root)]


def _load_front_matter(text: str, where: str) -> object:
    """`yaml.safe_load(text)`, refused when aliases expand it past YAML_EXPANSION times its text."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        limit = YAML_EXPANSION * len(text) + YAML_EXPANSION_SLACK
        if _expanded_size(node, limit) is None:
            raise SkillError(
                f"{where}: front matter is not read: its YAML aliases expand it past {limit:,} values and "
                f"characters ({YAML_EXPANSION} times its text) or into itself; write the values out"
            )
        return loader.construct_document(node)
    except RecursionError:
        raise SkillError(f"{where}: front matter is not read: it is nested too deeply") from None
    finally:
        loader.dispose()


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
        meta = _load_front_matter("\n".join(lines[1:end]), where)
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
        raise fail("name", f"must be snake_case, got {shown(name)}")
    if expected_name is not None and name != expected_name:
        raise fail("name", f"{shown(name)} must equal its directory name {expected_name!r}")
    description = meta["description"]
    if not isinstance(description, str) or not description.strip():
        raise fail("description", "must be a non-empty string saying when to use the skill")
    kind = meta["kind"]
    if kind not in KINDS:
        raise fail("kind", f"unknown kind {shown(kind)} (allowed: {', '.join(KINDS)})")
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
            raise fail(f"{label}.name", f"must be snake_case, got {shown(pname)}")
        if pname in (p.name for p in parameters):
            raise fail(f"{label}.name", f"duplicate parameter {shown(pname)}")
        description = item.get("description")
        if not isinstance(description, str) or not description.strip():
            raise fail(f"{label}.description", "missing")
        required = item.get("required", True)
        if not isinstance(required, bool):
            raise fail(f"{label}.required", f"must be true or false, got {shown(required)}")
        default_from = item.get("default_from")
        if default_from is not None:
            problem = default_from_problem(default_from)
            if problem:
                raise fail(f"{label}.default_from", problem)
        kind = item.get("type", "name")
        if kind not in PARAMETER_TYPES:
            raise fail(f"{label}.type", f"unknown type {shown(kind)} (allowed: {', '.join(PARAMETER_TYPES)})")
        if default_from is not None and kind != "name":
            raise fail(f"{label}.default_from", "only parameters of type name derive a default")
        default = item.get("default")
        if default is not None and not value_has_type(kind, default):
            raise fail(f"{label}.default", f"{shown(default)} is not a {kind}")
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
                raise fail(label, f"a command must be one line with single spaces, got {shown(item)}")
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
            raise fail(f"{label}.bind", f"must bind new snake_case names, got {shown(name)}")
        if not isinstance(key, str) or not key:
            raise fail(f"{label}.bind.{name}", f"must name a field of the result, got {shown(key)}")
        pairs.append((name, key))
    return CallStep(template, tuple(pairs))


def _find_step(raw, label: str, known: set[str], fail) -> FindStep:
    if not isinstance(raw, dict) or set(map(str, raw)) != FIND_FIELDS:
        raise fail(label, f"needs exactly the fields {', '.join(sorted(FIND_FIELDS))}")
    target, visit, bind = raw["target"], raw["visit"], raw["bind"]
    if not isinstance(target, str) or not TYPE_RE.fullmatch(target):
        raise fail(f"{label}.target", f"must be an object type such as 'desklamp', got {shown(target)}")
    if (
        not isinstance(visit, list)
        or not visit
        or not all(isinstance(v, str) and TYPE_RE.fullmatch(v) for v in visit)
    ):
        raise fail(f"{label}.visit", "must be a non-empty list of receptacle types such as 'desk'")
    if not isinstance(bind, str) or not NAME_RE.fullmatch(bind) or bind in known:
        raise fail(f"{label}.bind", f"must be a new snake_case name, got {shown(bind)}")
    return FindStep(target, tuple(visit), bind)


def _resource_skill_files(directory: Traversable, prefix: str) -> list[tuple[Traversable, str]]:
    """(file, display path) of every SKILL.md below a package folder that is not on disk, in name order."""
    found = []
    for child in sorted(directory.iterdir(), key=lambda c: c.name):
        at = f"{prefix}/{child.name}"
        if child.is_dir():
            found.extend(_resource_skill_files(child, at))
        elif child.name == SKILL_FILE:
            found.append((child, at))
    return found


def load_skills(
    *directories: str | Path | Traversable, max_file_bytes: int | None = MAX_FILE_BYTES
) -> SkillLibrary:
    """Load every `<name>/SKILL.md` below the given directories into one library.

    A skill's directory name is its name; the same name twice (in two directories or two
    nested folders) is an error naming both files. A SKILL.md that is not a regular file, a link
    loop or one to nothing, or a file over `max_file_bytes` (None: any size) is an error naming it
    and the reason, as is front matter whose YAML aliases expand it too far.
    """
    skills: list[Skill] = []
    for directory in directories:
        root = Path(directory) if isinstance(directory, (str, os.PathLike)) else directory
        if not root.is_dir():
            raise SkillError(f"{root}: skill directory not found")
        if isinstance(root, Path):
            files, left = walk_files(root, confine=False)
            if left:
                where, why = left[0]
                more = f" ({len(left)} such entries in {root})" if len(left) > 1 else ""
                raise SkillError(f"{where}: {why}{more}")
            for path in (f for f in files if f.name == SKILL_FILE):
                text = read_skill_file(path, max_file_bytes)
                skills.append(parse_skill(text, str(path), expected_name=path.parent.name))
            continue
        for file, shown_at in _resource_skill_files(root, str(root)):
            parent = shown_at.rsplit("/", 2)[-2]
            text = _read_resource(file, shown_at, max_file_bytes)
            skills.append(parse_skill(text, shown_at, expected_name=parent))
    return SkillLibrary.from_skills(skills)
