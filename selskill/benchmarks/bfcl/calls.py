"""Python-syntax function calls: a model step decoded exactly as BFCL decodes it, and call templates.

BFCL's multi-turn prompting pipeline turns a model's text into calls with
`default_decode_execute_prompting` (bfcl_eval/model_handler/utils.py): the text is stripped
of backticks and blanks, wrapped in `[...]` when it is not already, parsed with `ast`, and
every element of the list must be a call. Each call becomes an *execution string*, the text
BFCL later `eval`s: the function name (dotted as written), then its **keyword** arguments
only, each value rewritten by BFCL's own rules. `decode_step` reproduces that decoder
decision for decision, so a step here holds exactly the calls BFCL's would:

- positional arguments are dropped (`touch('a')` decodes to `touch()`, which then fails);
- a name stays a string (`x=a` gives `x='a'`), a call without keywords becomes its source
  text (`x=g(1)` gives `x='g(1)'`), one with keywords a nested call that will run, and a
  dict whose values are all dicts is written as a call (`{'g': {'y': 1}}` gives `g(y=1)`;
  an empty dict makes the whole step undecodable);
- `-` in front of any constant negates it whatever the operator was (`+5` gives `-5`);
- a lambda, a set, an f-string, `**kwargs` in a value or any other expression BFCL has no
  rule for makes the step undecodable, as does anything that is not a list of calls.

The one place BFCL's decoder runs model text is arithmetic (`x=1+2`: it `eval`s
`ast.unparse` of the expression in its own module). Here the same result comes from a small
evaluator that never calls `eval`: numbers, strings, containers and the operators on them.
Names resolve as in BFCL's module: `decode_step(text, scope)` takes the names that module
defines (`scope`, built by the benchmark from BFCL's source); one bound to plain data
(`MAXIMUM_STEP_LIMIT - 20 + 1` is 1) evaluates to its value, any other (a function, a
module, a path) is refused, and a name neither there nor a builtin fails the decode as BFCL's
`NameError` does (`x=a+b`). A builtin, a call, an attribute, repeating a sequence and `%`
formatting are refused: the step is then treated as undecodable, where BFCL would have
evaluated it.

Ints are exact: an int with more digits than Python converts to text (4,300) fails the decode
where BFCL's does, when it is written out (its `repr`, or `ast.unparse` of a literal); the
arithmetic in between is computed exactly up to twice that size. Only an intermediate int past
`MAX_INT_WORK_DIGITS`, a step whose ints add up past `MAX_INT_WORK_BITS` or whose named
values' text adds up past `MAX_NAME_CHARS` is refused, so a step's arithmetic costs
milliseconds and its calls stay near the size of its text, whatever it asks.

Model text is bounded before any parsing: characters, nesting depth and calls per step. A
step over a bound is refused with a reason, in time and memory proportional to the bound,
not to the text.

Call templates (skills' call steps, ground truth rewritten by us) are parsed more strictly,
by `selskill.skills.call_templates.parse_one_call`: one call, a plain name, keyword arguments
that are Python literals.
"""

from __future__ import annotations

import ast
import builtins
import copy
import operator
from collections.abc import Mapping
from dataclasses import dataclass

from selskill.skills.call_templates import MAX_CALL_CHARS as MAX_STEP_CHARS  # a step is bounded as a call is

MAX_CALLS_PER_STEP = 256  # several times the most calls a ground-truth turn sends
MAX_NESTING = 32  # depth of the parsed expression, several times what ground truth reaches
MAX_INT_DIGITS = 4_300  # Python's default int <-> str limit (sys.get_int_max_str_digits)
MAX_INT_WORK_DIGITS = 2 * MAX_INT_DIGITS  # an intermediate int this large is still computed
_WORK_BITS = (10**MAX_INT_WORK_DIGITS).bit_length()
MAX_INT_WORK_BITS = 1_000_000  # all ints one step's arithmetic computes, added up (about 35 at the bound)
MAX_NAME_CHARS = 8 * MAX_STEP_CHARS  # the text of the module values one step's arithmetic reads, added up


class Refused(ValueError):
    """Text this decoder will not process: over a bound, or arithmetic it does not evaluate."""


@dataclass(frozen=True)
class DecodedCall:
    """One call as BFCL's decoder yields it: its name (dotted as written; "" when the callee is
    not a name) and its execution string (`name(k=v, ...)`, the text BFCL executes)."""

    name: str
    text: str


@dataclass(frozen=True)
class Decoded:
    """A decoded step. No `calls` ends the user turn: a clean empty step (`[]`, no `error`) or
    text BFCL cannot decode (`error` says why; `refused` when a bound of ours said no)."""

    calls: tuple[DecodedCall, ...] = ()
    error: str = ""
    refused: bool = False


def decode_step(text: str, scope: Mapping[str, object] | None = None) -> Decoded:
    """The calls of one model step, as BFCL's `default_decode_execute_prompting` decodes them.

    `scope`: the names BFCL's decoder module defines, with their values (arithmetic reads them);
    a value that is not plain data stands for a name that is defined but not evaluated here."""
    if len(text) > MAX_STEP_CHARS:
        return Decoded(
            error=f"the reply has {len(text):,} characters, over the bound of {MAX_STEP_CHARS:,}",
            refused=True,
        )
    body = text.strip("`\n ")
    if not body.startswith("["):
        body = "[" + body
    if not body.endswith("]"):
        body = body + "]"
    body = body.strip().strip("'")
    try:
        tree = ast.parse(body, mode="eval").body
    except Exception as exc:  # noqa: BLE001 - BFCL treats every parser failure as "no call"
        if isinstance(exc, (MemoryError, RecursionError)):
            return Decoded(error=f"the reply is nested deeper than the bound of {MAX_NESTING}", refused=True)
        return Decoded(error=f"not a list of Python calls ({type(exc).__name__}: {exc})")
    try:
        _check_bounds(tree)
        nodes = [tree] if isinstance(tree, ast.Call) else tree.elts
        if not all(isinstance(n, ast.Call) for n in nodes):
            return Decoded(error="the reply is not a list of function calls")
        if len(nodes) > MAX_CALLS_PER_STEP:
            raise Refused(f"the reply has {len(nodes)} calls, over the bound of {MAX_CALLS_PER_STEP}")
        decoder = _Decoder(scope or {})
        calls = []
        for node in nodes:
            ((name, args),) = decoder.resolve_call(node).items()
            calls.append(DecodedCall(name, f"{name}({_render_args(args)})"))
    except Refused as exc:
        return Decoded(error=str(exc), refused=True)
    except Exception as exc:  # noqa: BLE001 - any failure of BFCL's decoder means "no call"
        return Decoded(error=f"the calls cannot be decoded ({type(exc).__name__}: {exc})")
    return Decoded(tuple(calls))


def _check_bounds(tree: ast.AST) -> None:
    """Nesting depth of a parsed step, walked without recursion."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            raise Refused(f"the reply is nested deeper than the bound of {MAX_NESTING}")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


# --- BFCL's decoder, rule for rule (resolve_ast_call, resolve_ast_by_type, parse_nested_value) ---


class _Decoder:
    """One step's decoding: the names BFCL's module defines, and what its arithmetic has spent."""

    def __init__(self, scope: Mapping[str, object]):
        self.scope = scope
        self.int_bits = 0
        self.name_chars = 0

    def resolve_call(self, node: ast.Call) -> dict:
        """{name: {keyword: value}}: the callee's dotted name, keyword arguments only."""
        parts = []
        func = node.func
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if isinstance(func, ast.Name):
            parts.append(func.id)
        return {".".join(reversed(parts)): {kw.arg: self.resolve_value(kw.value) for kw in node.keywords}}

    def resolve_value(self, node: ast.AST) -> object:
        if isinstance(node, ast.Constant):
            return "..." if node.value is Ellipsis else node.value
        if isinstance(node, ast.UnaryOp):
            # BFCL negates the operand's `.value` whatever the operator: `+5` and `~5` give -5, and
            # an operand without a constant `.value` (a name, a nested operator) fails
            if not isinstance(node.operand, ast.Constant):
                raise TypeError(f"bad operand type for unary -: {type(node.operand).__name__!r}")
            return -node.operand.value
        if isinstance(node, ast.List):
            return [self.resolve_value(v) for v in node.elts]
        if isinstance(node, ast.Dict):
            return {
                self.resolve_value(k): self.resolve_value(v)
                for k, v in zip(node.keys, node.values, strict=True)
            }
        if isinstance(node, ast.BinOp):
            ast.unparse(node)  # BFCL evals this text: an int literal past 4,300 digits fails here
            return self.evaluate(node)
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Call):
            return ast.unparse(node) if not node.keywords else self.resolve_call(node)
        if isinstance(node, ast.Tuple):
            return tuple(self.resolve_value(v) for v in node.elts)
        if isinstance(node, ast.Lambda):
            # BFCL reads `node.body[0]`, which a lambda's body (one expression) does not support
            raise TypeError(f"{type(node.body).__name__!r} object is not subscriptable")
        if isinstance(node, ast.Subscript):
            return ast.unparse(node.value) + "[" + ast.unparse(node.slice) + "]"
        # `None` is what a dict display's `**mapping` key is
        raise ValueError(f"Unsupported AST type: {type(node)}")

    # -- the arithmetic BFCL evaluates, without eval ----------------------------------------

    def evaluate(self, node: ast.AST) -> object:
        """What `eval` gives for the expression in BFCL's module, left to right as Python evaluates it."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name) and node.id in self.scope:
            value = self.scope[node.id]
            if not _plain(value):
                raise Refused(f"arithmetic over {node.id!r} ({type(value).__name__}) is not evaluated")
            self.name_chars += len(repr(value))
            if self.name_chars > MAX_NAME_CHARS:
                raise Refused(
                    f"the reply's arithmetic reads over {MAX_NAME_CHARS:,} characters of named values"
                )
            return copy.deepcopy(value)
        if isinstance(node, ast.UnaryOp):
            return self._int_checked(_UNARY[type(node.op)](self.evaluate(node.operand)))
        if isinstance(node, ast.BinOp):
            left, right = self.evaluate(node.left), self.evaluate(node.right)
            _check_operation(type(node.op), left, right)
            return self._int_checked(_BINARY[type(node.op)](left, right))
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            if any(isinstance(e, ast.Starred) for e in node.elts):
                raise Refused("arithmetic with *unpacking is not evaluated")
            items = [self.evaluate(e) for e in node.elts]
            return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise Refused("arithmetic with **unpacking is not evaluated")
            out = {}
            for k, v in zip(node.keys, node.values, strict=True):
                key = self.evaluate(k)
                out[key] = self.evaluate(v)
            return out
        first = node
        while isinstance(first, (ast.Call, ast.Attribute, ast.Subscript)):
            first = first.func if isinstance(first, ast.Call) else first.value  # what Python evaluates first
        if isinstance(first, ast.Name) and first.id not in self.scope and not hasattr(builtins, first.id):
            raise NameError(f"name {first.id!r} is not defined")
        raise Refused(f"arithmetic over {ast.unparse(node)[:80]!r} is not evaluated (only literals are)")

    def _int_checked(self, value: object) -> object:
        """`value`, refused when it is an int past MAX_INT_WORK_DIGITS or the step's ints pass their budget."""
        if isinstance(value, int):
            bits = value.bit_length()
            if bits > _WORK_BITS:
                raise Refused(f"an int in an argument would have more than {MAX_INT_WORK_DIGITS} digits")
            self.int_bits += bits
            if self.int_bits > MAX_INT_WORK_BITS:
                raise Refused(
                    f"the reply's arithmetic computes ints of over {MAX_INT_WORK_BITS:,} bits in all"
                )
        return value


def _plain(value: object) -> bool:
    """Whether `value` is data BFCL's arithmetic could use here: numbers, text, None, containers of them."""
    if value is None or type(value) in (bool, int, float, complex, str, bytes):
        return True
    if type(value) in (list, tuple):
        return all(_plain(v) for v in value)
    if type(value) is dict:
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def _render(value: object) -> str:
    """BFCL's `parse_nested_value`: a value as text inside the execution string."""
    if isinstance(value, dict):
        if all(isinstance(v, dict) for v in value.values()):
            name = list(value.keys())[0]  # IndexError for {}: BFCL's decoder fails there too
            return f"{name}({_render_args(value[name])})"
        return "{" + ", ".join(f"'{k}': {_render(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _render_args(args: dict) -> str:
    return ", ".join(f"{k}={_render(v)}" for k, v in args.items())


_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_, ast.Invert: operator.invert}
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.BitAnd: operator.and_,
    ast.MatMult: operator.matmul,
}
_SEQUENCES = (str, bytes, list, tuple)


def _check_operation(op: type, left: object, right: object) -> None:
    """Refuse, before computing it, an operation whose result could be unbounded: repeating a sequence,
    `%` formatting, a concatenation longer than a step, an int surely past MAX_INT_WORK_DIGITS. An int
    operation that passes is computed exactly (at most twice the bound) and its result checked."""
    if op is ast.Mult and (isinstance(left, _SEQUENCES) or isinstance(right, _SEQUENCES)):
        raise Refused("repeating a sequence in an argument is not evaluated")
    if op is ast.Mod and isinstance(left, (str, bytes)):
        raise Refused("%-formatting in an argument is not evaluated")
    if op is ast.Add and isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES):
        if len(left) + len(right) > MAX_STEP_CHARS:  # only names of BFCL's module can make one this long
            raise Refused(f"a value in an argument would be longer than {MAX_STEP_CHARS:,}")
    if not (isinstance(left, int) and isinstance(right, int)):
        return
    # the fewest bits the result can have: past the bound, it is surely too large
    least = {
        ast.Pow: lambda: (abs(left).bit_length() - 1) * right + 1 if abs(left) > 1 and right > 0 else 0,
        ast.LShift: lambda: left.bit_length() + right if left and right > 0 else 0,
    }.get(op)
    if least is not None and least() > _WORK_BITS:
        raise Refused(f"an int in an argument would have more than {MAX_INT_WORK_DIGITS} digits")
