"""The checks every recipe section runs on its own keys.

A bad value fails when the recipe is parsed, naming the key, the rule and the fix, rather
than hours later in the stage that reads it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Sequence

from selskill.config.keys import recipe_fields


def bad_value(key: str, value: object, rule: str, why: str = "") -> ValueError:
    """The error of a recipe key with a bad value: the key, the rule, the value, and where to fix it."""
    return ValueError(
        f"{key} must be {rule}; got {value!r}{f' ({why})' if why else ''}. Fix `{key}:` in the recipe or "
        f"pass --{key} VALUE"
    )


def check_at_least(cfg, minimum: float, *keys: str, why: str = "") -> None:
    for key in keys:
        value = getattr(cfg, key)
        if value < minimum:
            raise bad_value(key, value, f">= {minimum}", why)


def check_above(cfg, bound: float, *keys: str, why: str = "") -> None:
    """Keys that must exceed `bound` (a learning rate, DPO's beta: 0 would train nothing)."""
    for key in keys:
        value = getattr(cfg, key)
        if not value > bound:
            raise bad_value(key, value, f"> {bound}", why)


def check_choice(cfg, key: str, choices: Sequence[str], why: str = "") -> None:
    value = getattr(cfg, key)
    if value not in choices:
        raise bad_value(key, value, f"one of {', '.join(map(str, choices))}", why)


def check_declared_choices(cfg) -> None:
    """Each key that section `cfg` declares with `choices` in its field's metadata takes one of them: argparse
    holds a command-line value to them, not a recipe file's. Keys the section inherits (TRL's) are left to
    the code that declares them."""
    own = vars(type(cfg)).get("__annotations__", {})
    for f in recipe_fields(cfg):
        if f.name in own and "choices" in f.metadata:
            check_choice(cfg, f.name, f.metadata["choices"])


def check_share(cfg, *keys: str, why: str = "a probability") -> None:
    """Rates and shares: 0 <= value <= 1."""
    for key in keys:
        value = getattr(cfg, key)
        if not 0 <= value <= 1:
            raise bad_value(key, value, "in [0, 1]", why)


def check_unit(cfg, *keys: str) -> None:
    """Nucleus-sampling keys: 0 < value <= 1."""
    for key in keys:
        value = getattr(cfg, key)
        if not 0 < value <= 1:
            raise bad_value(key, value, "in (0, 1]", "nucleus sampling mass; 1 = off")


# --- the type of every recipe value, from its dataclass field ----------------------------------------------
#
# argparse converts a command-line string, and a YAML string, with the field's type; a YAML value
# that is not a string (a list, a bool, 2.7) reaches the dataclass as it is, and so does a float
# that parses but is no number (nan, inf). `check_types` checks every value of every section
# against its field's annotation before any section is built, so that a wrong value fails here,
# naming the key, rather than inside the stage that reads it. An integer key takes an integer
# only: not a bool (YAML's `true`) and not a float, 2.0 included (as `--key 2.0` is refused on
# the command line); a float key takes a finite number, an integer included.

_PLURAL = {int: "integers", float: "finite numbers", str: "strings", bool: "true or false values"}


def _members(hint) -> tuple:
    """The alternatives of a union annotation (`int | None` -> int, NoneType), else the hint itself."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _describe(hint, plural: bool = False) -> str:
    """How the error names what a key takes: "an integer", "a list of strings", "null"..."""
    if hint is type(None):
        return "null"
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin in (list, tuple):
        (item, *_) = typing.get_args(hint) or (str,)
        return f"a list of {_describe(item, plural=True)}"
    if origin is dict or hint is dict:
        return "a mapping"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in hint)
    if plural and hint in _PLURAL:
        return _PLURAL[hint]
    return {int: "an integer", float: "a finite number", str: "a string", bool: "true or false"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


_NO_MATCH = object()


def _match(value, hint):
    """`value` as a value of `hint` (a number for a string key becomes its text), or _NO_MATCH."""
    if hint is typing.Any:
        return value
    if hint is type(None):
        return value if value is None else _NO_MATCH
    if hint is bool:
        return value if isinstance(value, bool) else _NO_MATCH
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _NO_MATCH
    if hint is float:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return value if number and math.isfinite(value) else _NO_MATCH
    if hint is str:
        if isinstance(value, str):
            return value
        # YAML reads `train_window_n: 3` as a number; the command line would have given the text
        return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else _NO_MATCH
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return (
            value if any(type(value) is type(a) and value == a for a in typing.get_args(hint)) else _NO_MATCH
        )
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return _NO_MATCH
        (item, *_) = typing.get_args(hint) or (typing.Any,)
        items = [_match(v, item) for v in value]
        return _NO_MATCH if any(v is _NO_MATCH for v in items) else type(value)(items)
    if origin is dict or hint is dict:
        return value if isinstance(value, dict) else _NO_MATCH
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return value if isinstance(value, hint) or value in {m.value for m in hint} else _NO_MATCH
    return value  # a type of TRL's that no recipe spells (a config object): its own code checks it


def checked_value(key: str, value, hint, default=None):
    """`value` of recipe key `key` checked against its annotation `hint` (see above); a `bad_value`
    error naming the key, the value and what it takes otherwise."""
    members = _members(hint)
    if value is None and default is None:
        return None  # a key whose default is null may be set to null, whatever its annotation says
    # the exact type first, so that a string key's number is converted only where no number is allowed
    ordered = sorted(members, key=lambda m: m is str)
    for member in ordered:
        matched = _match(value, member)
        if matched is not _NO_MATCH:
            return matched
    # a list key given one item (TRL's own keys accept `loss_type: sigmoid` for [sigmoid])
    for member in members:
        if typing.get_origin(member) is list and not isinstance(value, (list, tuple, dict)):
            (item, *_) = typing.get_args(member) or (typing.Any,)
            matched = _match(value, item)
            if matched is not _NO_MATCH:
                return matched
    rule = " or ".join(dict.fromkeys(_describe(m) for m in members))
    why = ""
    if isinstance(value, float) and not math.isfinite(value):
        why = "nan and inf are not numbers a run can use"
    elif isinstance(value, float) and value.is_integer() and int in members:
        why = f"write {int(value)}: an integer key takes no decimal point"
    elif isinstance(value, bool):
        why = "YAML reads yes/no/true/false as a boolean"
    raise bad_value(key, value, rule, why)


def check_types(dataclass_types: Sequence[type], values: dict, unset: dict | None = None) -> None:
    """Check (and, for a number given to a string key, convert) every value in `values` (parsed keys ->
    values) against its field's annotation in `dataclass_types`: the one type check of every section.
    A value that is `unset`'s own object for its key is the code's default, not the user's: left as it is."""
    unset = unset or {}
    for dtype in dataclass_types:
        hints = typing.get_type_hints(dtype)
        for f in recipe_fields(dtype):
            if f.name not in values or f.name not in hints:
                continue
            if f.name in unset and values[f.name] is unset[f.name]:
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            values[f.name] = checked_value(f.name, values[f.name], hints[f.name], default)
