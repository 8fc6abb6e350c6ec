"""Which fields of a recipe section are recipe keys, and the settings objects keys configure.

Every recipe key is one dataclass field of one section. A section may hold fields that are
not its keys: the train section is TRL's `DPOConfig`, whose `seed`, `report_to`, ... are keys
of other sections and whose model-loading fields are no keys at all. Such a section names
them in its class attribute `_not_recipe_keys`; the parser, the type checks and `--help` read
a section's keys through `recipe_fields` only, so the fields stay on the class, where TRL
reads them.

A group of keys that configures one settings object (the init's model shape, the Slurm
executor's options) is declared as `KeysOf(Settings, prefix, {key: help})` in its section,
which `recipe_section` makes into the keys' fields, each with the type and default of the
settings field it sets: the default is written once, in the settings class, and
`settings_of(section, Settings)` builds the object from the keys, with no field copied by hand.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass


def key(default, help: str, **metadata) -> dataclasses.Field:
    """A recipe key's field: its default, its `--help` text and any other argparse metadata (`choices`)."""
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


def recipe_fields(dtype) -> tuple[dataclasses.Field, ...]:
    """The fields of section `dtype` (a class or an instance) that are recipe keys."""
    not_keys = getattr(dtype, "_not_recipe_keys", ())
    return tuple(f for f in dataclasses.fields(dtype) if f.init and f.name not in not_keys)


def recipe_keys(dtype) -> tuple[str, ...]:
    """The names of `recipe_fields(dtype)`."""
    return tuple(f.name for f in recipe_fields(dtype))


@dataclass(frozen=True)
class KeysOf:
    """Recipe keys that set fields of the settings class `settings`: `help` maps each key, in `--help`'s
    order, to its help text; the field a key sets is its name without `prefix`, or the one `renamed`
    gives. The fields a group leaves out keep their defaults, or are given to `settings_of`."""

    settings: type
    prefix: str
    help: Mapping[str, str]
    renamed: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def fields(self) -> dict[str, str]:
        """Recipe key -> the settings field it sets."""
        return {key: self.renamed.get(key, key.removeprefix(self.prefix)) for key in self.help}

    def setting(self, name: str) -> tuple[object, object]:
        """(type, default) of the settings field `name`."""
        default = {f.name: f.default for f in dataclasses.fields(self.settings)}[name]
        if default is dataclasses.MISSING:
            raise TypeError(f"{self.settings.__name__}.{name} has no plain default for a recipe key to take")
        return typing.get_type_hints(self.settings)[name], default


def recipe_section(cls: type) -> type:
    """`dataclass(cls)`, each `KeysOf` attribute first made into the fields of its keys, in its place
    among the section's other keys (their order is `--help`'s)."""
    own = cls.__dict__.get("__annotations__", {})
    annotations, groups = {}, []
    for name, value in list(cls.__dict__.items()):
        if isinstance(value, KeysOf):  # stays a class attribute (no field): the group, by its name
            groups.append(value)
            for name_of_key, setting in value.fields().items():
                annotations[name_of_key], default = value.setting(setting)
                setattr(cls, name_of_key, key(default, value.help[name_of_key]))
        elif name in own:
            annotations[name] = own[name]
    cls.__annotations__ = {**{n: own[n] for n in own if n not in annotations}, **annotations}
    cls._keys_of = (*getattr(cls, "_keys_of", ()), *groups)
    return dataclass(cls)


def settings_of(section, settings: type, **given):
    """The `settings` object that `section`'s `KeysOf(settings, ...)` keys configure; `given`: its fields
    that are no keys of this group (another group's object, another section's value)."""
    (group,) = (g for g in type(section)._keys_of if g.settings is settings)
    return settings(**{name: getattr(section, k) for k, name in group.fields().items()}, **given)
