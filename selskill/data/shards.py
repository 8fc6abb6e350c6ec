"""Parquet shards: atomic writes checked against the schema, reads that name the bad file.

Every file here is written to a temporary name unique to its writer (process id + random),
fsynced, then renamed over its final name: a reader sees the old file or the new one, never
a partial one, and two writers of one path never write into the same temporary file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from selskill.data.schema import SCHEMAS, validate_columns, validate_table
from selskill.errors import ExplainedError


class ShardError(ExplainedError):
    """A shard is missing, truncated or does not match its schema."""


def tmp_path(path: str | Path) -> Path:
    """`.<name>.<pid>-<random>.tmp` next to `path`: unique per writer, hidden from `*.parquet` globs."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")


def stale_tmp_files(path: str | Path) -> list[Path]:
    """Temporary files of `path` left by writers that died before their rename."""
    path = Path(path)
    return sorted(path.parent.glob(f".{path.name}.*.tmp")) if path.parent.is_dir() else []


def _fsync_replace(tmp: Path, final: Path) -> None:
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    tmp.replace(final)
    try:  # the rename itself survives a power cut only once the directory is synced
        fd = os.open(final.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _naming(exc: OSError, path: Path) -> OSError:
    """`exc` as an OSError naming `path`: pyarrow's carry no file, and the temporary name is not the one to
    look for."""
    code = exc.errno
    if code is None:  # pyarrow's: "... Detail: [errno 28] No space left on device"
        found = re.search(r"\[errno (\d+)\]", str(exc), re.IGNORECASE)
        code = int(found.group(1)) if found else None
    reason = exc.strerror or (os.strerror(code) if code else str(exc))
    return OSError(code, f"cannot write: {reason}", str(path))


def _write_atomic(path: str | Path, write) -> Path:
    """`write(tmp)` then fsync + rename onto `path`; the temporary file never outlives a failure, and a
    failure names `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    try:
        write(tmp)
        _fsync_replace(tmp, path)
    except OSError as exc:
        raise _naming(exc, path) from exc
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text_atomic(text: str, path: str | Path) -> Path:
    return _write_atomic(path, lambda tmp: tmp.write_text(text))


def write_json_atomic(obj, path: str | Path) -> None:
    write_text_atomic(json.dumps(obj, indent=1, sort_keys=True) + "\n", path)


def _write_parquet(table: pa.Table, path: Path) -> None:
    if table.num_rows:
        pq.write_table(table, path, compression="zstd")
        return
    # pyarrow writes a 0-row table as one empty row group, on which `datasets`' parquet reader
    # fails ("BatchSize must be greater than 0"); a file with the schema and no row group at all
    # reads back as the same empty table everywhere and adds nothing to a `load_dataset`
    with pq.ParquetWriter(path, table.schema, compression="zstd"):
        pass


def write_parquet_atomic(table: pa.Table, path: str | Path) -> Path:
    """`table` to `path` via a unique temporary file + rename; a 0-row table keeps its schema and stays
    readable by `datasets.load_dataset("parquet", ...)`."""
    return _write_atomic(path, lambda tmp: _write_parquet(table, tmp))


def write_shard(rows: pa.Table | Sequence[dict], path: str | Path, kind: str) -> pa.Table:
    """Validate then write `path` via a unique temporary file + rename: readers never see a partial file."""
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows), schema=SCHEMAS[kind])
    validate_table(table, kind)
    write_parquet_atomic(table, path)
    return table


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def shard_digest(path: str | Path) -> dict:
    """What a completion marker records of its shard: rows, bytes and sha256."""
    path = Path(path)
    return {
        "rows": pq.ParquetFile(path).metadata.num_rows,
        "bytes": path.stat().st_size,
        "sha256": file_sha256(path),
    }


def read_shard(
    path: str | Path, kind: str, stage: str | None = None, columns: Sequence[str] | None = None
) -> pa.Table:
    """`stage`: the name of the stage that wrote the shard, for the fix an error names (a reader is often
    another stage, so "rerun the stage" alone would point at the wrong one); `columns`: only these (a
    small read of a large shard), each checked against the schema."""
    path = Path(path)
    writer = f"the {stage} stage" if stage else "the stage that wrote it"
    try:
        table = pq.read_table(path, columns=None if columns is None else list(columns))
    except (OSError, pa.ArrowException) as exc:
        raise ShardError(
            f"cannot read shard {path}: {exc}. The file is truncated or corrupt: delete it and its completion "
            f"marker ({path.parent.parent / 'completions' / path.stem}), then rerun {writer} to recompute it "
            f"(or rerun it with --redo)."
        ) from exc
    try:
        if columns is None:
            validate_table(table, kind)
        else:
            validate_columns(table, kind)
    except ValueError as exc:
        raise ShardError(
            f"shard {path} does not match the {kind} schema: {exc}. Shards written by an older selskill lack "
            f"the columns this one reads: rerun {writer} ({path.parent.parent}) with --redo."
        ) from exc
    return table


def read_shards(
    paths: Sequence[str | Path], kind: str, stage: str | None = None, columns: Sequence[str] | None = None
) -> pa.Table:
    """All shards of a stage as one table, in rank order (`columns`: only these)."""
    tables = [read_shard(p, kind, stage, columns) for p in sorted(paths)]
    if not tables:
        empty = SCHEMAS[kind].empty_table()
        return empty if columns is None else empty.select(list(columns))
    return pa.concat_tables(tables)
