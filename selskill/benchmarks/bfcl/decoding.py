"""A model step decoded as BFCL decodes it, with the names BFCL's decoder module defines.

BFCL's decoder (`default_decode_execute_prompting`, bfcl_eval/model_handler/utils.py) `eval`s
a keyword value's arithmetic in its own module, so `x=MAXIMUM_STEP_LIMIT - 20 + 1` is 1 there,
not a NameError. That module cannot be imported here (it pulls provider SDKs and tree-sitter
parsers, and through `bfcl_eval.utils` a config module that creates folders when imported), so
its names are read from bfcl-eval's installed source instead, following its imports:

- every name its top level binds (imports, star imports of bfcl-eval modules, functions,
  assignments), the module's dunder names and the parameter in scope at BFCL's `eval`
  (`value`) is *defined*: arithmetic over one is never "undefined";
- one whose value is plain data (numbers, text, None, lists and dicts of them) evaluates to
  that value. The value is the literal it is assigned, or else the attribute of the module
  that assigns it, imported only when that module and every bfcl-eval module it imports does
  nothing at its top level but bind names (so `bfcl_eval.constants.eval_config`, which creates
  folders, is never imported: its paths and computed text are not evaluated);
- the rest (functions, modules, classes, paths, enums, dunder names) are refused, where BFCL
  would have evaluated them.

`decode(text)` is `selskill.benchmarks.bfcl.calls.decode_step` with that scope: every BFCL decode in
selskill goes through it.
"""

from __future__ import annotations

import ast
import importlib
from functools import cache
from importlib import resources

from selskill.benchmarks.bfcl.calls import Decoded, decode_step

DECODER_MODULE = "bfcl_eval.model_handler.utils"
EVAL_FUNCTION = "resolve_ast_by_type"  # the function whose `eval` runs the arithmetic


class NotEvaluated:
    """Stands for a name BFCL's module defines whose value is not evaluated here."""

    def __init__(self, where: str):
        self.where = where

    def __repr__(self) -> str:
        return f"<defined in {self.where}>"


def _source(module: str) -> ast.Module | None:
    """The parsed source of a bfcl-eval module (None when it is not a file of the package)."""
    parts = module.split(".")
    if parts[0] != "bfcl_eval":
        return None
    root = resources.files("bfcl_eval")
    for path in (root.joinpath(*parts[1:-1], parts[-1] + ".py"), root.joinpath(*parts[1:], "__init__.py")):
        if path.is_file():
            return ast.parse(path.read_text(encoding="utf-8"))
    return None


def _binds_only(tree: ast.Module) -> bool:
    """Whether a module's top level only binds names (imports, definitions, assignments, a docstring)."""
    binding = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign)
    for node in tree.body:
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        annotated = isinstance(node, ast.AnnAssign)
        type_checking = isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        if not (isinstance(node, binding) or docstring or annotated or type_checking):
            return False
    return True


@cache
def _imports_cleanly(module: str) -> bool:
    """Whether importing bfcl-eval module `module` only binds names, in it and in every bfcl-eval module it imports."""
    tree = _source(module)
    if tree is None or not _binds_only(tree):
        return False
    imported = [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module]
    imported += [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
    return all(_imports_cleanly(m) for m in imported if m.split(".")[0] == "bfcl_eval")


@cache
def _bindings(module: str) -> dict[str, tuple[str, ast.expr | None]]:
    """name -> (the module that binds it, the expression it is assigned; None when it is not assigned
    there: a function, a class, a module, a name from outside bfcl-eval)."""
    tree = _source(module)
    out: dict[str, tuple[str, ast.expr | None]] = {}
    for node in tree.body if tree is not None else []:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            inner = _bindings(node.module) if _source(node.module) is not None else {}
            for alias in node.names:
                if alias.name == "*":
                    out.update({k: v for k, v in inner.items() if not k.startswith("_")})
                else:
                    out[alias.asname or alias.name] = inner.get(alias.name, (node.module, None))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                out[alias.asname or alias.name.split(".")[0]] = (alias.name, None)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = (module, None)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    out[target.id] = (module, node.value)
    return out


def _value(name: str, module: str, expression: ast.expr | None) -> object:
    if expression is not None:
        try:
            return ast.literal_eval(expression)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
        if _imports_cleanly(module):
            return getattr(importlib.import_module(module), name)
    return NotEvaluated(module)


@cache
def decoder_scope() -> dict[str, object]:
    """Every name BFCL's decoder module defines at its `eval`, with its value where it is evaluated here."""
    scope: dict[str, object] = {
        name: _value(name, module, expression)
        for name, (module, expression) in _bindings(DECODER_MODULE).items()
    }
    for dunder in ("__name__", "__doc__", "__package__", "__loader__", "__spec__", "__file__", "__cached__",
                   "__builtins__"):  # fmt: skip
        scope[dunder] = NotEvaluated(DECODER_MODULE)
    tree = _source(DECODER_MODULE)
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == EVAL_FUNCTION)
    for arg in function.args.args:
        scope[arg.arg] = NotEvaluated(f"{DECODER_MODULE}.{EVAL_FUNCTION}")
    return scope


def decode(text: str) -> Decoded:
    """One model step's calls, as BFCL's decoder gives them (calls.py), its module's names in scope."""
    return decode_step(text, decoder_scope())
