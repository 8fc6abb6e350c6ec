"""The checks every recipe section runs on its own keys.

A bad value fails when the recipe is parsed, naming the key, the rule and the fix, rather
than hours later in the stage that reads it.
"""

from __future__ import annotations

from collections.abc import Sequence


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


def check_choice(cfg, key: str, choices: Sequence[str], why: str = "") -> None:
    value = getattr(cfg, key)
    if value not in choices:
        raise bad_value(key, value, f"one of {', '.join(map(str, choices))}", why)


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
