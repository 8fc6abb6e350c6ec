"""The report's document model: a list of blocks (heading, paragraph, list, table, image) rendered
to Markdown and to one self-contained HTML page."""

from __future__ import annotations

import base64
from pathlib import Path

from selskill import templates
from selskill.templates import markdown


def to_markdown(blocks: list[tuple]) -> str:
    out = []
    for b in blocks:
        kind = b[0]
        if kind == "h":
            out.append("#" * b[1] + " " + b[2])
        elif kind == "p":
            out.append(b[1])
        elif kind == "list":
            out.append("\n".join(f"- {x}" for x in b[1]))
        elif kind == "table":
            out.append(markdown.table(b[1], b[2]))
        elif kind == "img":
            out.append(f"![{b[2]}]({b[1]})")
    return "\n\n".join(out) + "\n"


def to_html(blocks: list[tuple], base: Path, title: str) -> str:
    """One self-contained page (selskill/templates/report.html.j2): the plots inlined as data URIs."""

    def inline(b: tuple) -> tuple:
        if b[0] != "img":
            return b
        return (
            "img",
            "data:image/png;base64," + base64.b64encode((base / b[1]).read_bytes()).decode("ascii"),
            b[2],
        )

    return templates.render("report.html.j2", title=title, blocks=[inline(b) for b in blocks])
