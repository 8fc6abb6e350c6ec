"""The HTML selskill writes (the report page, the notebook's pair views) as jinja2 templates, the
`*.html.j2` files beside this module; the Markdown tables it writes are `markdown.table`.

Autoescaping is on for every template, so run and model text (task ids, notes, decoded
tokens) is escaped wherever a template puts it; only what a template itself rendered (a
macro's output, jinja2's `Markup`) goes into another template unescaped. Undefined names
raise instead of rendering as empty text.
"""

from __future__ import annotations

from functools import cache


@cache
def _environment():
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("selskill", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render(name: str, **context) -> str:
    """Template `name` rendered with `context`."""
    return _environment().get_template(name).render(**context)


def macros(name: str):
    """Template `name`'s macros, as functions returning `Markup`."""
    return _environment().get_template(name).module
