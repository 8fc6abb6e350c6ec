"""pyarrow schemas of every stage's rows, checked on write and on read.

Each schema is derived from its record (`selskill.data.records`), where every column is
defined: its name, order and type are the record's fields.

Token-in/token-out: rows carry the exact token ids the policy saw and produced, with one
entry per token in every per-token list. Nothing downstream re-tokenizes text (chat
templates are not prefix-stable; Qwen3 drops earlier <think> blocks).
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from types import UnionType
from typing import Annotated, Union, get_args, get_origin, get_type_hints

import pyarrow as pa

from selskill.data import records

# Per-token role codes (docs/design.md, "Per-token roles").
ROLE_PROMPT = 0  # system / template scaffolding / the task's first user message
ROLE_ASSISTANT = 1
ROLE_OBSERVATION = 2
ROLE_SKILL_RETURN = 3

PAIR_KINDS = ("episode", "local")


def arrow_type(annotation) -> pa.DataType:
    """The Arrow type of a record field's annotation: `int` is int32, `float` float32, a record a
    struct of its fields; `Annotated` says another width (`records.Int64`)."""
    if get_origin(annotation) is Annotated:
        return get_args(annotation)[1]
    if get_origin(annotation) in (Union, UnionType):  # `X | None`: every column is nullable
        (inner,) = [a for a in get_args(annotation) if a is not type(None)]
        return arrow_type(inner)
    if get_origin(annotation) is list:
        return pa.list_(arrow_type(get_args(annotation)[0]))
    if is_dataclass(annotation):
        return pa.struct(_arrow_fields(annotation))
    return _SCALARS[annotation]


_SCALARS = {int: pa.int32(), float: pa.float32(), str: pa.string(), bool: pa.bool_()}


def _arrow_fields(record: type) -> list[tuple[str, pa.DataType]]:
    hints = get_type_hints(record, vars(records), include_extras=True)
    return [(f.name, arrow_type(hints[f.name])) for f in fields(record)]


def arrow_schema(record: type) -> pa.Schema:
    """The schema of `record`'s rows: its fields, in order, each nullable."""
    return pa.schema(_arrow_fields(record))


_TURN = arrow_type(records.Turn)
ROLLOUT_SCHEMA = arrow_schema(records.Rollout)
BRANCH_SCHEMA = arrow_schema(records.BranchPoint)
FORK_SCHEMA = arrow_schema(records.Fork)
PAIR_SCHEMA = arrow_schema(records.Pair)

SCHEMAS: dict[str, pa.Schema] = {
    "rollout": ROLLOUT_SCHEMA,
    "branch": BRANCH_SCHEMA,
    "fork": FORK_SCHEMA,
    "pair": PAIR_SCHEMA,
}

_PER_TOKEN_GROUPS = {
    "rollout": [("token_ids", "logprob", "entropy", "role", "turn")],
    "fork": [("token_ids", "logprob", "entropy", "role", "turn")],
    "pair": [
        ("chosen_ids", "chosen_role", "chosen_turn"),
        ("rejected_ids", "rejected_role", "rejected_turn"),
    ],
}


class SchemaError(ValueError):
    """Rows that do not satisfy a stage's contract."""


def validate_table(table: pa.Table, kind: str) -> None:
    """Schema equality plus the invariant no schema can state: per-token lists align."""
    schema = SCHEMAS[kind]
    if not table.schema.equals(schema, check_metadata=False):
        missing = set(schema.names) - set(table.schema.names)
        extra = set(table.schema.names) - set(schema.names)
        # a struct that gained a field (e.g. the turn records) shows up here, not as a missing column
        retyped = [
            n
            for n in schema.names
            if n in table.schema.names and table.schema.field(n).type != schema.field(n).type
        ]
        raise SchemaError(
            f"{kind} rows do not match the {kind} schema (missing: {sorted(missing)}, extra: {sorted(extra)}, "
            f"of another type: {retyped}, or the column order differs)"
        )
    import pyarrow.compute as pc

    for group in _PER_TOKEN_GROUPS.get(kind, []):
        lengths = [pc.list_value_length(table.column(c)) for c in group]
        for name, length in zip(group[1:], lengths[1:], strict=True):
            if pc.all(pc.equal(lengths[0], length)).as_py() not in (True, None):
                raise SchemaError(f"{kind} rows: {name} does not have one entry per token of {group[0]}")


def validate_columns(table: pa.Table, kind: str) -> None:
    """A projection of `kind` rows (a reader that needs a few columns): each column there, of its schema's type."""
    schema = SCHEMAS[kind]
    wrong = [
        n
        for n in table.schema.names
        if n not in schema.names or table.schema.field(n).type != schema.field(n).type
    ]
    if wrong:
        raise SchemaError(
            f"{kind} rows: columns {wrong} are not the {kind} schema's (missing or of another type)"
        )
