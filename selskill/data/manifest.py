"""Content manifests: what a set of input files holds, by sha256, hashed once.

A stage records what the games it played are made of, not where they lie, so that
regenerated or edited games are refused like a changed recipe (docs/design.md, "The stage
contract"). Hashing every game file on every rerun would cost seconds to minutes on real
data, so a manifest keeps each file's sha256 with the size, mtime and ctime it had when
hashed (the way git's index does): a rerun stats the files and hashes only those whose stat
changed. ctime cannot be set by hand, so a file replaced by one with an old mtime (a copy
or an archive that preserves times) is hashed again too.
"""

from __future__ import annotations

import errno
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from selskill.data.shards import file_sha256, write_json_atomic

MANIFESTS_DIR = ".manifests"  # under runs_dir: the manifests of inputs selskill does not own


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _read(store: Path) -> dict:
    try:
        data = json.loads(store.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: everything is hashed again
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return files if isinstance(files, dict) else {}


def file_hashes(files: Mapping[str, Path], store: Path) -> dict[str, str]:
    """The sha256 of each of `files` (name -> path), from the manifest at `store` where a file's stat
    is the one recorded there; the manifest is rewritten when anything was hashed.

    A store that cannot be written (a read-only folder) only makes the next run hash again.
    """
    old = _read(store)
    entries, hashed = {}, False
    for name in sorted(files):
        path = files[name]
        stamp = _stamp(path)
        known = old.get(name)
        if isinstance(known, dict) and known.get("stat") == stamp and isinstance(known.get("sha256"), str):
            entries[name] = known
            continue
        entries[name] = {"sha256": file_sha256(path), "stat": stamp}
        hashed = True
    if hashed or set(old) != set(entries):
        try:
            write_json_atomic({"files": entries}, store)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
    return {name: e["sha256"] for name, e in entries.items()}


def content_identity(hashes: Mapping[str, str]) -> dict:
    """What a stage records of a set of files: how many, and one sha256 over their names and hashes."""
    h = hashlib.sha256()
    for name in sorted(hashes):
        h.update(f"{name}\0{hashes[name]}\n".encode())
    return {"files": len(hashes), "sha256": h.hexdigest()[:16]}


def manifest_store(runs_dir: str | Path, name: str, source: str | Path) -> Path:
    """Where the manifest of files under `source` that selskill does not own (real data, an installed
    package's data) is kept: under `runs_dir`, one per source folder."""
    key = hashlib.sha256(str(Path(source).resolve()).encode()).hexdigest()[:12]
    return Path(runs_dir) / MANIFESTS_DIR / f"{name}-{key}.json"
