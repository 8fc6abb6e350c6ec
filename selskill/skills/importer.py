"""Import a folder of public SKILL.md files (Agent Skills format) as selskill memory skills.

Public skills (Anthropic's Agent Skills and the collections built on them) are a folder per
skill holding a SKILL.md whose front matter has `name` (kebab-case) and `description`, often
with extra fields (`license`, `allowed-tools`, `metadata`, ...), and a Markdown body, plus
optional scripts and references. selskill's loader is strict (snake_case names equal to
their directory, only its own fields, a `kind`), so imported skills are rewritten:

- the name becomes snake_case (`pdf-editing` -> `pdf_editing`; a leading digit gets
  `skill_`; `prefix` is prepended; a name taken twice gets `_2`, `_3`, ... in path order);
- the description is kept (whitespace collapsed); the body is kept as is, cut to
  `max_body_chars` when given (the cut is marked);
- `kind: memory` (their procedures are text for the model, not step templates the
  executor could check); extra front-matter fields and the folder's other files are not
  carried over (the report counts those files).

The walk stays inside `source`: a link (file or folder) that resolves outside it is skipped
with its reason, since a downloaded collection could otherwise read any file the user can.
Files are read by the loader's bounded reader (`selskill.skills.loader`, which `load_skills`
uses too): a link loop, a link to nothing, a SKILL.md that is not a regular file (a FIFO), one
larger than `max_file_bytes` (judged before it is read) and front matter whose YAML aliases
expand it too far are each skipped with their reason and counted; the rest is imported.

Each result is rendered back to SKILL.md text and parsed with `parse_skill`, so what is
written is exactly what `load_skills` accepts. A file without front matter, description or
body is skipped with its reason, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from selskill.skills.loader import (
    MAX_FILE_BYTES,
    NAME_RE,
    SKILL_FILE,
    SkillFileSkipped,
    parse_skill,
    read_skill_file,
    shown,
    split_front_matter,
    walk_files,
)
from selskill.skills.model import Skill, SkillError, SkillLibrary

TRUNCATION_NOTE = "\n\n[... truncated on import]"


@dataclass
class ImportReport:
    skills: list[Skill] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # skill name -> source SKILL.md
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (source, reason)
    written: list[str] = field(default_factory=list)
    other_files: int = 0  # files beside the SKILL.md files that were not imported

    @property
    def library(self) -> SkillLibrary:
        return SkillLibrary.from_skills(self.skills)

    def summary(self) -> str:
        reasons: dict[str, int] = {}
        for _, r in self.skipped:
            key = r.split(":", 1)[0]
            reasons[key] = reasons.get(key, 0) + 1
        why = ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())) or "none"
        return (
            f"imported {len(self.skills)} skills, skipped {len(self.skipped)} ({why}); "
            f"{self.other_files} other files not imported"
        )


def snake_name(raw: str, prefix: str = "") -> str:
    """A selskill skill name from a public one ("PDF Editing", "pdf-editing" -> "pdf_editing")."""
    name = re.sub(r"[^a-z0-9]+", "_", f"{prefix}{raw}".lower()).strip("_")
    name = re.sub(r"_+", "_", name)
    if not name:
        return ""
    if not name[0].isalpha():
        name = f"skill_{name}"
    return name


def skill_markdown(skill: Skill) -> str:
    """A memory skill as SKILL.md text that `parse_skill` reads back to the same skill."""
    meta = yaml.safe_dump(
        {"name": skill.name, "description": skill.description, "kind": "memory"},
        sort_keys=False,
        allow_unicode=True,
        width=10_000,
    )
    return f"---\n{meta}---\n{skill.body.strip()}\n"


def import_skill_folder(
    source: str | Path,
    out: str | Path | None = None,
    prefix: str = "",
    max_body_chars: int | None = None,
    overwrite: bool = False,
    max_file_bytes: int | None = MAX_FILE_BYTES,
) -> ImportReport:
    """Every SKILL.md below `source` as a memory skill; with `out`, also written to `out/<name>/SKILL.md`.

    Refuses to write over an existing `out/<name>/SKILL.md` unless `overwrite`; `max_file_bytes=None`
    reads a SKILL.md of any size.
    """
    root = Path(source)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory")
    report = ImportReport()
    found, report.skipped = walk_files(root, confine=True)
    files = [p for p in found if p.name.lower() == SKILL_FILE.lower()]
    skill_dirs = {f.parent for f in files}
    skill_files = set(files)
    report.other_files = sum(
        1 for p in found if p not in skill_files and any(d in skill_dirs for d in p.parents)
    )
    taken: set[str] = set()
    for path in files:
        where = str(path)
        try:
            text = read_skill_file(path, max_file_bytes)
        except SkillFileSkipped as exc:
            report.skipped.append((where, f"{exc.reason}: {exc.detail}"))
            continue
        try:
            meta, body = split_front_matter(text, where)
        except SkillError as exc:
            report.skipped.append((where, f"front_matter: {exc}"))
            continue
        description = meta.get("description")
        if not isinstance(description, str) or not description.strip():
            report.skipped.append((where, "no_description: the front matter has no description"))
            continue
        if not body.strip():
            report.skipped.append((where, "empty_body: nothing to return when invoked"))
            continue
        raw_name = meta.get("name") if isinstance(meta.get("name"), str) else path.parent.name
        name = snake_name(raw_name, prefix) or snake_name(path.parent.name, prefix)
        if not name or not NAME_RE.fullmatch(name):
            report.skipped.append((where, f"bad_name: {shown(raw_name)}"))
            continue
        base, n = name, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        if max_body_chars is not None and len(body) > max_body_chars:
            body = body[:max_body_chars].rstrip() + TRUNCATION_NOTE
        draft = Skill(name=name, description=" ".join(description.split()), kind="memory", body=body)
        try:
            skill = parse_skill(skill_markdown(draft), where, expected_name=name)
        except SkillError as exc:
            report.skipped.append((where, f"invalid: {exc}"))
            continue
        taken.add(name)
        report.skills.append(skill)
        report.sources[name] = where
    if out is not None:
        out_root = Path(out)
        targets = [out_root / s.name / SKILL_FILE for s in report.skills]
        existing = [str(t) for t in targets if t.exists()]
        if existing and not overwrite:
            raise FileExistsError(f"{existing[0]} exists ({len(existing)} in all); pass overwrite to replace")
        for skill, target in zip(report.skills, targets, strict=True):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(skill_markdown(skill), encoding="utf-8")
            report.written.append(str(target))
    return report
