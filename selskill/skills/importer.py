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
with its reason, since a downloaded collection could otherwise read any file the user can;
a SKILL.md larger than `max_file_bytes` is skipped on its size, before it is read.

Each result is rendered back to SKILL.md text and parsed with `parse_skill`, so what is
written is exactly what `load_skills` accepts. A file without front matter, description or
body is skipped with its reason, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from selskill.skills.loader import NAME_RE, SKILL_FILE, parse_skill, split_front_matter
from selskill.skills.model import Skill, SkillError, SkillLibrary

TRUNCATION_NOTE = "\n\n[... truncated on import]"
MAX_FILE_BYTES = 1_000_000  # a SKILL.md is a page of text; far larger is not one


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


def _walk(root: Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """Every file below `root` that resolves inside it, and each link that leaves it with its reason.

    Links that stay inside are followed (each resolved folder once, so a link loop ends).
    """
    real_root = root.resolve()
    files: list[Path] = []
    left: list[tuple[str, str]] = []
    seen: set[Path] = set()
    stack = [root]
    while stack:
        folder = stack.pop()
        if folder.resolve() in seen:
            continue
        seen.add(folder.resolve())
        try:
            entries = sorted(folder.iterdir(), reverse=True)
        except OSError as exc:
            left.append((str(folder), f"unreadable: {exc}"))
            continue
        for p in entries:
            real = p.resolve()
            if not real.is_relative_to(real_root):
                if p.is_dir() or p.name.lower() == SKILL_FILE.lower():
                    left.append((str(p), f"outside_source: links to {real}, outside {real_root}"))
            elif p.is_dir():
                stack.append(p)
            elif p.is_file():
                files.append(p)
    return sorted(files), sorted(left)


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
    found, report.skipped = _walk(root)
    files = [p for p in found if p.name.lower() == SKILL_FILE.lower()]
    skill_dirs = {f.parent for f in files}
    skill_files = set(files)
    report.other_files = sum(
        1 for p in found if p not in skill_files and any(d in skill_dirs for d in p.parents)
    )
    taken: set[str] = set()
    for path in files:
        shown = str(path)
        try:
            size = path.stat().st_size
            if max_file_bytes is not None and size > max_file_bytes:
                report.skipped.append(
                    (shown, f"too_large: {size} bytes, over max_file_bytes {max_file_bytes}")
                )
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            report.skipped.append((shown, f"unreadable: {exc}"))
            continue
        try:
            meta, body = split_front_matter(text, shown)
        except SkillError as exc:
            report.skipped.append((shown, f"front_matter: {exc}"))
            continue
        description = meta.get("description")
        if not isinstance(description, str) or not description.strip():
            report.skipped.append((shown, "no_description: the front matter has no description"))
            continue
        if not body.strip():
            report.skipped.append((shown, "empty_body: nothing to return when invoked"))
            continue
        raw_name = meta.get("name") if isinstance(meta.get("name"), str) else path.parent.name
        name = snake_name(raw_name, prefix) or snake_name(path.parent.name, prefix)
        if not name or not NAME_RE.fullmatch(name):
            report.skipped.append((shown, f"bad_name: {raw_name!r}"))
            continue
        base, n = name, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        if max_body_chars is not None and len(body) > max_body_chars:
            body = body[:max_body_chars].rstrip() + TRUNCATION_NOTE
        draft = Skill(name=name, description=" ".join(description.split()), kind="memory", body=body)
        try:
            skill = parse_skill(skill_markdown(draft), shown, expected_name=name)
        except SkillError as exc:
            report.skipped.append((shown, f"invalid: {exc}"))
            continue
        taken.add(name)
        report.skills.append(skill)
        report.sources[name] = shown
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
