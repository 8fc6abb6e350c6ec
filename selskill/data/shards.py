"""Parquet shards: atomic writes checked against the schema, reads that name the bad file."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from selskill.data.schema import SCHEMAS, validate_table


class ShardError(RuntimeError):
    """A shard is missing, truncated or does not match its schema."""


def _fsync_replace(tmp: Path, final: Path) -> None:
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    tmp.replace(final)


def write_shard(rows: pa.Table | Sequence[dict], path: str | Path, kind: str) -> pa.Table:
    """Validate then write `path` via `<path>.tmp` + rename: readers never see a partial file."""
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows), schema=SCHEMAS[kind])
    validate_table(table, kind)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    _fsync_replace(tmp, path)
    return table


def read_shard(path: str | Path, kind: str) -> pa.Table:
    path = Path(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ShardError(
            f"cannot read shard {path}: {exc}. The file is truncated or corrupt: delete it and its completion "
            f"marker ({path.parent.parent / 'completions' / path.stem}), then rerun the stage to recompute it "
            f"(or rerun with --redo)."
        ) from exc
    try:
        validate_table(table, kind)
    except ValueError as exc:
        raise ShardError(
            f"shard {path} does not match the {kind} schema: {exc}. Rerun the stage with --redo."
        ) from exc
    return table


def read_shards(paths: Sequence[str | Path], kind: str) -> pa.Table:
    """All shards of a stage as one table, in rank order."""
    tables = [read_shard(p, kind) for p in sorted(paths)]
    if not tables:
        return SCHEMAS[kind].empty_table()
    return pa.concat_tables(tables)


def write_json_atomic(obj, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
    _fsync_replace(tmp, path)
