"""Reading a recipe file: a file that is not UTF-8, a syntax error, a top-level value that is not a mapping or a key given
twice is one line naming the file and line, before TrlParser reads the file again.

PyYAML alone raises a long traceback naming `<unicode string>`, and keeps the last of two
values of one key without a word, so a copied line silently overrides the first.
"""

from __future__ import annotations

from pathlib import Path

import yaml

_HINTS = {
    "mapping values are not allowed here": "; check this line's indentation (recipe keys start at column 1)"
}


class _RecipeLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping."""

    def construct_mapping(self, node, deep=False):
        first: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                line = first.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: PyYAML's own error says where
                continue
            if line != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key} is given twice (lines {line} and {key_node.start_mark.line + 1})",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def read_recipe(path: str | Path) -> dict:
    """The recipe at `path` as a mapping; a ValueError of one line `PATH:LINE:COLUMN: problem` otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"recipe {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}): save it "
            "as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
        ) from None
    try:
        data = yaml.load(text, Loader=_RecipeLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = exc.problem or ""
        if exc.context and exc.context_mark and exc.context_mark.line != getattr(mark, "line", None):
            problem += f" ({exc.context} started at line {exc.context_mark.line + 1})"
        problem += _HINTS.get(exc.problem or "", "")
        if "'\\t'" in problem:
            problem += "; indent with spaces, not tabs"
        raise ValueError(f"recipe {where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"recipe {path}: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(
            f"recipe {path}: the file must be a mapping of `key: value` lines, not a {type(data).__name__}"
        )
    return data
