"""Which fields of a recipe section are recipe keys, and the settings objects keys derive.

Every recipe key is one dataclass field of one section. A section may hold fields that are
not its keys: the train section is TRL's `DPOConfig`, whose `seed`, `report_to`, ... are keys
of other sections and whose model-loading fields are no keys at all. Such a section names
them in its class attribute `_not_recipe_keys`; the parser, the type checks and `--help` read
a section's keys through `recipe_fields` only, so the fields stay on the class, where TRL
reads them.
"""

from __future__ import annotations

import dataclasses


def recipe_fields(dtype) -> tuple[dataclasses.Field, ...]:
    """The fields of section `dtype` (a class or an instance) that are recipe keys."""
    not_keys = getattr(dtype, "_not_recipe_keys", ())
    return tuple(f for f in dataclasses.fields(dtype) if f.init and f.name not in not_keys)


def recipe_keys(dtype) -> tuple[str, ...]:
    """The names of `recipe_fields(dtype)`."""
    return tuple(f.name for f in recipe_fields(dtype))


def prefixed_values(section, prefix: str) -> dict:
    """`section`'s keys that start with `prefix`, by the rest of their name: the fields of the settings
    object those keys configure (`init_demo_useful` -> `useful`, `slurm_partition` -> `partition`)."""
    return {f.name[len(prefix) :]: getattr(section, f.name) for f in recipe_fields(section)
            if f.name.startswith(prefix)}  # fmt: skip
