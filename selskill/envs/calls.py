"""Python-syntax function calls (`f(a=1, b='x')`), parsed with `ast` and never evaluated.

BFCL's multi-turn tasks are answered in this syntax, and the skill executor fills call
templates in it; both parse through here so that the env and a skill agree on what a call
is. Arguments must be Python literals (`ast.literal_eval`): a call is data, and a model's
text must never reach `eval`. A parsed call renders back (`Call.render`) to a canonical
string of literals, which is what a checker that does evaluate strings is given.

What counts as "no call" follows BFCL's own decoder (bfcl_eval.model_handler.utils,
`default_decode_execute_prompting`): the text is stripped of backticks and blanks, wrapped
in `[...]` when it is not already, and must then parse as a list of calls; anything that
does not (plain prose, a syntax error, a list holding something other than calls) is a
step with no call. Within a list, a call whose name is not a plain identifier or whose
arguments are not literals is malformed on its own, so that its neighbours still run.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field


@dataclass
class Call:
    """One call with literal arguments, in the order they were written."""

    name: str
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)

    def render(self) -> str:
        """`name(arg, key=value)` with every value written by `repr` (a Python literal)."""
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.name}({', '.join(parts)})"


@dataclass(frozen=True)
class Malformed:
    """A call the parser refused; `source` is its text, `reason` says why."""

    source: str
    reason: str


def _literal(node: ast.AST) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(f"argument {ast.unparse(node)!r} is not a literal value") from None


def parse_call_node(node: ast.Call) -> Call | Malformed:
    """A `Call` from an `ast.Call`, or `Malformed` naming the first problem."""
    source = ast.unparse(node)
    if not isinstance(node.func, ast.Name):
        return Malformed(source, f"the function name {ast.unparse(node.func)!r} is not a plain name")
    try:
        args = []
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                raise ValueError("*arguments are not allowed")
            args.append(_literal(arg))
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise ValueError("**arguments are not allowed")
            kwargs[kw.arg] = _literal(kw.value)
    except ValueError as exc:
        return Malformed(source, str(exc))
    return Call(node.func.id, args, kwargs)


def parse_calls(text: str) -> list[Call | Malformed] | None:
    """The calls of one model step, or None when the step holds no call (see the module doc)."""
    body = text.strip("`\n ")
    if not body:
        return None
    if not body.startswith("["):
        body = "[" + body
    if not body.endswith("]"):
        body = body + "]"
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    nodes = [tree] if isinstance(tree, ast.Call) else getattr(tree, "elts", None)
    if not nodes or not all(isinstance(n, ast.Call) for n in nodes):
        return None
    return [parse_call_node(n) for n in nodes]


def parse_one_call(text: str) -> Call:
    """Exactly one well-formed call; raises ValueError otherwise (for templates and tests)."""
    items = parse_calls(text)
    if not items or len(items) != 1:
        raise ValueError(f"{text!r} is not one function call")
    if isinstance(items[0], Malformed):
        raise ValueError(f"{text!r}: {items[0].reason}")
    return items[0]
