"""BFCL's execution of a decoded call, reproduced on our backends without `eval`.

BFCL's inference loop and its checker both run a decoded call with
`execute_multi_turn_func_call` (bfcl_eval/eval_checker/multi_turn_eval/multi_turn_utils.py):
the execution string's method names are prefixed with their instance's global name by a
regex (`_process_method_calls`, which also rewrites `name(` inside string arguments), a few
names (`kill`, `exit`, ...) are refused, and the rest is `eval`ed in that module, any
exception becoming `Error during execution: <message>`. `CallExecutor.run` takes the same
steps with BFCL's own rewrite and refusal list, then walks the rewritten expression instead
of `eval`ing it: a method of an involved instance is called with the evaluated arguments, an
undefined name raises BFCL's `NameError` text, a syntax error gives `compile`'s own message,
and a literal is itself. The outputs are therefore BFCL's, byte for byte.

What the walk does not do is run anything else: a builtin, a module global, an attribute of
something other than an instance method, a subscript, a comprehension, arithmetic beyond the
`+`/`-` a complex literal's `repr` needs. Such a call is *refused* before anything of it
runs: its output says so and it changes nothing. A call BFCL itself never `eval`s is not
refused: a refused name (`exit()`, `kill(...)`) gets BFCL's "is not allowed" text, and text
that does not compile (`ls(None={'a': True})`, from `ls(**{'a': True})`) `compile`'s own
message, exactly as BFCL answers them. BFCL would have `eval`ed a refused call; outputs and
verdicts can differ only there. The checker still receives every decoded call as BFCL's
execution string (selskill/benchmarks/bfcl/env.py, `check_calls`), a refused one answered
with its recorded output instead of being run. Instance names follow BFCL's inference loop for
a model called `MODEL_NAME`, so a string argument the rewrite touches reads the same on every run.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import json
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from selskill.benchmarks.bfcl.calls import MAX_NESTING

ERROR_PREFIX = "Error during execution: "  # BFCL's text for a call that raised
MODEL_NAME = "selskill"  # the model name in the instance names of the env's own backends
# the rewrite adds one attribute per call to the decoded step's depth
_MAX_DEPTH = 2 * MAX_NESTING + 2
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_, ast.Invert: operator.invert}
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub}


def unknown_function_text(name: str) -> str:
    """What BFCL answers a call to a name no backend defines (its `eval` raises NameError)."""
    return f"{ERROR_PREFIX}name {name!r} is not defined"


def format_output(result: object) -> str:
    """A backend's return value as BFCL's `execute_multi_turn_func_call` turns it into text."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def is_error_output(output: str) -> bool:
    """Whether a call's output reports a failure.

    BFCL's backends signal one with an `error` field (in a dict, or in the one dict of a
    list, which BFCL stringifies with `str`); a call that raised gets ERROR_PREFIX.
    """
    if output.startswith(ERROR_PREFIX):
        return True
    if not output.startswith(("{", "[{")):
        return False
    try:
        value = json.loads(output)
    except ValueError:
        try:
            value = ast.literal_eval(output)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return False
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return isinstance(value, dict) and "error" in value


def _utils():
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    return multi_turn_utils


@cache
def blocked_names() -> frozenset[str]:
    """The names BFCL refuses before its `eval`, read from the list literal in its source."""
    source = inspect.getsource(_utils().execute_multi_turn_func_call)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In):
            value = node.comparators[0]
            if isinstance(value, ast.List) and all(isinstance(e, ast.Constant) for e in value.elts):
                return frozenset(e.value for e in value.elts)
    raise RuntimeError("bfcl-eval's execute_multi_turn_func_call no longer lists the names it refuses")


@cache
def _bfcl_scope() -> frozenset[str]:
    """Every name BFCL's `eval` resolves: builtins, its module's globals, the function's locals."""
    utils = _utils()
    local = utils.execute_multi_turn_func_call.__code__.co_varnames
    return frozenset(dir(builtins)) | frozenset(vars(utils)) | frozenset(local)


def instance_name(task_id: str, class_name: str, model_name: str = MODEL_NAME) -> str:
    """The global name BFCL gives an instance in its inference loop."""
    return re.sub(r"[-./:]", "_", f"{model_name}_{task_id}_{class_name}_instance")


class _Refused(Exception):
    """A call the walk will not run (`withheld`: a method the env's rule hides)."""

    def __init__(self, reason: str, withheld: str = ""):
        super().__init__(reason)
        self.withheld = withheld


@dataclass(frozen=True)
class Execution:
    """One call's outcome: BFCL's output text, whether it reports an error, and whether the walk refused
    to run it (then the checker must answer it with `output` rather than run it)."""

    output: str
    error: bool
    refused: bool = False


class CallExecutor:
    """Runs decoded calls on one task's backend instances as BFCL's `eval` would."""

    def __init__(self, task_id: str, instances: dict[str, object]):
        self.instances = {instance_name(task_id, c): inst for c, inst in instances.items()}
        # BFCL maps each public method name to the last involved class that has it
        self.mapping: dict[str, str] = {}
        for class_name, inst in instances.items():
            for name, _ in inspect.getmembers(inst, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self.mapping[name] = instance_name(task_id, class_name)

    def run(self, text: str, callable_now: Callable[[str], bool]) -> Execution:
        """BFCL's outcome for execution string `text`; `callable_now(method)` is the env's rule
        for a method it may hide (a withheld function): a hidden one is answered as an unknown name."""
        rewritten = _utils()._process_method_calls(text, self.mapping)
        head = rewritten.split("(")[0] if "(" in rewritten else rewritten
        if "." in head:
            head = head.split(".")[1]
        if head in blocked_names():  # BFCL refuses these before its `eval`: nothing runs
            return Execution(f"{ERROR_PREFIX}Function call {head} is not allowed.", True)  # BFCL's words
        try:
            compile(rewritten, "<string>", "eval", dont_inherit=True)  # compiles, runs nothing
        except Exception as exc:  # noqa: BLE001 - BFCL's `eval` fails here too, before running anything
            return Execution(f"{ERROR_PREFIX}{exc}", True)
        try:
            tree = ast.parse(rewritten, mode="eval")
            self._check(tree.body, callable_now, 0)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return Execution(f"{ERROR_PREFIX}not run here: the call is nested too deeply", True, refused=True)
        except _Refused as refusal:
            if refusal.withheld:
                return Execution(unknown_function_text(refusal.withheld), True, refused=True)
            return Execution(f"{ERROR_PREFIX}not run here: {refusal}", True, refused=True)
        try:
            output = format_output(self._evaluate(tree.body))
        except Exception as exc:  # noqa: BLE001 - BFCL turns every exception of a call into its text
            output = f"{ERROR_PREFIX}{exc}"
        return Execution(output, is_error_output(output))

    # -- what the walk accepts, decided before anything runs ---------------------------------

    def _check(self, node: ast.AST, callable_now: Callable[[str], bool], depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise _Refused("the call is nested too deeply")
        if isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id in self.instances
            ):
                if self.mapping.get(func.attr) != func.value.id:
                    raise _Refused(f"{func.attr} is not a function of this task")
                if not callable_now(func.attr):
                    raise _Refused("withheld", withheld=func.attr)
            else:
                self._check_undefined(func)
            if any(isinstance(a, ast.Starred) for a in node.args) or any(
                k.arg is None for k in node.keywords
            ):
                raise _Refused("* and ** arguments are not run")
            children = [*node.args, *(k.value for k in node.keywords)]
        elif isinstance(node, (ast.Name, ast.Attribute)):
            self._check_undefined(node)
            children = []
        elif isinstance(node, ast.Constant):
            children = []
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            if any(isinstance(e, ast.Starred) for e in node.elts):
                raise _Refused("*unpacking is not run")
            children = node.elts
        elif isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise _Refused("**unpacking is not run")
            children = [*node.keys, *node.values]
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            children = [node.operand]
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            children = [node.left, node.right]
        else:
            raise _Refused(f"{type(node).__name__} expressions are not run")
        for child in children:
            self._check(child, callable_now, depth + 1)

    def _check_undefined(self, node: ast.AST) -> None:
        """A name or attribute chain is accepted only if evaluating it stops at an undefined name."""
        base = node
        while isinstance(base, ast.Attribute):
            base = base.value
        if not (isinstance(base, ast.Name) and self._undefined(base.id)):
            raise _Refused(f"{ast.unparse(node)[:80]!r} is not a function of this task")

    def _undefined(self, name: str) -> bool:
        """Whether BFCL's `eval` raises NameError for `name`. The instances its checker caches are
        module globals named `..._instance`: none of those is ever undefined here."""
        if name in self.instances or name.endswith("_instance"):
            return False
        return name not in _bfcl_scope() and name not in vars(_utils())

    # -- the walk: Python's evaluation of an accepted expression, in Python's order -----------

    def _evaluate(self, node: ast.AST) -> object:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            raise NameError(f"name {node.id!r} is not defined")
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id in self.instances:
                return getattr(self.instances[node.value.id], node.attr)
            return getattr(self._evaluate(node.value), node.attr)  # raises at the undefined name
        if isinstance(node, ast.Call):
            func = self._evaluate(node.func)
            args = [self._evaluate(a) for a in node.args]
            kwargs = {k.arg: self._evaluate(k.value) for k in node.keywords}
            return func(*args, **kwargs)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = [self._evaluate(e) for e in node.elts]
            return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
        if isinstance(node, ast.Dict):
            return dict(
                [(self._evaluate(k), self._evaluate(v)) for k, v in zip(node.keys, node.values, strict=True)]
            )
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](self._evaluate(node.operand))
        if isinstance(node, ast.BinOp):
            return _BINARY[type(node.op)](self._evaluate(node.left), self._evaluate(node.right))
        raise AssertionError(f"unchecked node {type(node).__name__}")  # pragma: no cover
