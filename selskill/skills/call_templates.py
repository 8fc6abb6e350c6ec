"""Call templates: one function call with literal keyword arguments.

A skill's call step (`selskill.skills.model.CallStep`) is a template that becomes one such
call once its fields are filled, and a benchmark whose actions are function calls writes its
demonstrations and rewritten ground truth the same way. Keyword arguments only: BFCL's
decoder (`selskill/benchmarks/bfcl/calls.py`), like any that executes keyword calls, drops
positional ones, so a template that wrote one would teach a call the benchmark cannot read.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

# a call's text is bounded before it is parsed: several times the longest step a benchmark's ground truth
# writes (docs/benchmarks.md, "BFCL"), so parsing costs time and memory in proportion to the bound
MAX_CALL_CHARS = 32_768


@dataclass
class Call:
    """One call with literal keyword arguments, in the order they were written."""

    name: str
    kwargs: dict = field(default_factory=dict)

    def render(self) -> str:
        """`name(key=value, ...)` with every value written by `repr` (a Python literal)."""
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.kwargs.items())})"


def parse_one_call(text: str) -> Call:
    """Exactly one call with a plain name and literal keyword arguments; raises ValueError otherwise.

    Positional arguments are refused: BFCL's decoder drops them, so a template or a
    demonstration that wrote one would teach a call BFCL cannot read."""
    if len(text) > MAX_CALL_CHARS:
        raise ValueError(f"a call of {len(text):,} characters is over the bound of {MAX_CALL_CHARS:,}")
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise ValueError(f"{text!r} is not one function call") from None
    if not isinstance(node, ast.Call):
        raise ValueError(f"{text!r} is not one function call")
    if not isinstance(node.func, ast.Name):
        raise ValueError(f"{text!r}: the function name {ast.unparse(node.func)!r} is not a plain name")
    if node.args:
        raise ValueError(
            f"{text!r}: write every argument as name=value (a function-call decoder drops positional arguments)"
        )
    kwargs = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError(f"{text!r}: **arguments are not allowed")
        try:
            kwargs[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"{text!r}: argument {ast.unparse(kw.value)!r} is not a literal value") from None
    return Call(node.func.id, kwargs)
