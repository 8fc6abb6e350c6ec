"""Markdown tables: the one way selskill writes them (the report, the replication summary, the
retrieval benchmark). A cell's `|` is escaped and its newlines become spaces, so no value
can break a row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(headers: Sequence, rows: Iterable[Sequence]) -> str:
    """A GitHub-flavoured Markdown table (no trailing newline)."""
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
