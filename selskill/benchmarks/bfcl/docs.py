"""BFCL's function docs: a task's docs at each turn (miss_func withholds some until later), and their
rendering for a prompt (BFCL's own JSON, or the shorter `compact` and `brief` styles)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Sequence
from functools import cache

from selskill.benchmarks.bfcl.config import DOC_STYLES
from selskill.benchmarks.bfcl.tasks import BfclTask, bfcl_constants, data_dir, read_jsonl


@cache
def _class_docs(class_name: str) -> tuple[dict, ...]:
    mapping = bfcl_constants()[1].MULTI_TURN_FUNC_DOC_FILE_MAPPING
    return tuple(read_jsonl(data_dir() / "multi_turn_func_doc" / mapping[class_name]))


def function_docs(class_names: Iterable[str]) -> list[dict]:
    """BFCL's docs of the classes, in BFCL's order (deep copies: callers may edit them)."""
    return [copy.deepcopy(d) for c in class_names for d in _class_docs(c)]


def task_function_docs(task: BfclTask, turn: int = 0) -> list[dict]:
    """The docs BFCL shows at `turn`: every involved class's, minus functions withheld until later.

    Revealed functions are appended in their turn's order, as BFCL extends its list.
    """
    docs = function_docs(task.involved_classes)
    withheld = [(t, n) for t, names in sorted(task.withheld.items()) for n in names]
    by_name = {d["name"]: d for d in docs}
    hidden = {n for _, n in withheld}
    shown = [d for d in docs if d["name"] not in hidden]
    shown += [by_name[n] for t, n in withheld if t <= turn and n in by_name]
    return shown


_PREAMBLE_RE = re.compile(r"^This tool belongs to (?:the )?(.*?)\s*Tool description:\s*", re.S)
_ENUM_RE = re.compile(r"\s*\[Enum\]:\s*(\[[^\]]*\])\.?")
_DEFAULT_RE = re.compile(r"\s*Defaults to [^.]*(?:\.\d+)?[^.]*\.")
_TYPES = {
    "string": "str",
    "integer": "int",
    "float": "float",
    "boolean": "bool",
    "dict": "dict",
    "any": "any",
}


def _type_name(spec: dict) -> str:
    kind = spec.get("type", "any")
    if kind == "array":
        return f"list[{_type_name(spec.get('items') or {})}]"
    if kind == "tuple":
        return "tuple"
    enum = _ENUM_RE.search(spec.get("description", ""))
    if enum and kind == "string":
        try:
            return "|".join(repr(v) for v in json.loads(enum.group(1)))
        except ValueError:
            pass
    return _TYPES.get(kind, kind)


def _param_note(spec: dict) -> str:
    """A parameter's description without what the signature already says (enum, default)."""
    text = " ".join(spec.get("description", "").split())
    if spec.get("type") == "string":
        text = _ENUM_RE.sub("", text)
    if "default" in spec:
        text = _DEFAULT_RE.sub("", text)
    return text.strip().rstrip(".")


def _signature(doc: dict) -> str:
    params = doc.get("parameters") or {}
    required = set(params.get("required") or [])
    parts = []
    for name, spec in (params.get("properties") or {}).items():
        kind = _type_name(spec)
        if name in required:
            parts.append(f"{name}: {kind}")
        elif "default" in spec:
            parts.append(f"{name}: {kind} = {spec['default']!r}")
        else:
            parts.append(f"{name}?: {kind}")
    returns = [r for r in ((doc.get("response") or {}).get("properties") or {}) if not r.startswith("_")]
    tail = f" -> {', '.join(returns)}" if returns else ""
    return f"{doc['name']}({', '.join(parts)}){tail}"


def render_function_docs(docs: Sequence[dict], style: str = "compact") -> str:
    """Function docs as text for a prompt.

    `json` is BFCL's own rendering (`json.dumps(docs, indent=4)`, its default prompt format).
    `compact` writes each class's preamble once, then per function its signature (types,
    string enums as `'a'|'b'`, defaults, `?` for optional parameters, returned fields), its
    description and one line of parameter descriptions; `brief` drops that last line. BFCL's
    docs repeat the class preamble in every description and describe every returned field,
    which is most of their size.
    """
    if style not in DOC_STYLES:
        raise ValueError(f"unknown doc style {style!r} (allowed: {', '.join(DOC_STYLES)})")
    if style == "json":
        return json.dumps(list(docs), indent=4)
    lines: list[str] = []
    preamble = None
    for doc in docs:
        description = " ".join(doc.get("description", "").split())
        match = _PREAMBLE_RE.match(description)
        if match:
            if match.group(1) != preamble:
                preamble = match.group(1)
                lines.append(f"# {preamble.rstrip('. ')}")
            description = description[match.end() :]
        lines.append(f"- {_signature(doc)}: {description}")
        if style == "compact":
            props = ((doc.get("parameters") or {}).get("properties")) or {}
            notes = [f"{n}: {note}" for n, s in props.items() if (note := _param_note(s))]
            if notes:
                lines.append("    " + "; ".join(notes))
    return "\n".join(lines)
