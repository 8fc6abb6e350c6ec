"""The stage contract's two guarantees to a reader and a writer: one writer at a time, verified reads.

A writer holds a lock file (flock, released by the kernel when its process dies, so a
dead holder never blocks a rerun) that names it; a second writer is refused naming the
holder. A reader gets a stage's shards only when every rank is complete: each shard is
the one its completion marker describes (bytes and sha256), every rank of the recorded
world size is there, no shard lies outside it, and all ranks recorded the same inputs.
Every stage that reads another one, train included, reads it here, and so do the API and
the report (docs/design.md, "The stage contract"); the writer's half is `rank_writer.py`.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from selskill.data.inputs import changed_settings
from selskill.data.layout import StageDir
from selskill.data.shards import ShardError, read_shards
from selskill.errors import ExplainedError, error_message

logger = logging.getLogger(__name__)


class StageRefused(ExplainedError):
    """A stage cannot run as asked: another process holds it, or what it recorded differs from this run."""


@contextmanager
def hold_lock(path: Path, what: str, log: Callable[[str], None] = logger.info) -> Iterator[None]:
    """Hold `path` (flock) while computing `what`; a second holder is refused naming the first.

    The lock file says who holds it (pid, host, since when); the lock itself is the kernel's,
    so the file of a holder that died is simply taken over.
    """
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = path.read_text().strip() or "another process"
            raise StageRefused(
                f"{what} is being computed by another process ({holder}; lock {path}). Two writers are "
                "refused: wait for that one to finish (a rerun then skips what it completed) or stop it, then rerun"
            ) from None
        except OSError as exc:  # a filesystem without locks: say so, do not refuse to work
            log(f"cannot lock {path} ({exc}): concurrent writers of {what} are not detected")
        os.ftruncate(fd, 0)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode())
        yield
    finally:
        os.close(fd)


def changed_inputs(what: str, changes: list[str], recorded_in: Path, fix: str) -> StageRefused:
    """The refusal of an output computed from other inputs than this run's: the keys, where, and `fix`."""
    return StageRefused(
        f"{what} was computed with other inputs than this run: {'; '.join(changes)} (recorded in {recorded_in}). "
        f"{fix}, or restore the recorded values"
    )


def check_stage(stage: StageDir, world_size: int | None = None, kind: str = "") -> list[Path]:
    """The shard files of a completed stage, in rank order; fails naming what is missing or wrong and the fix.

    Every rank of the stage must be complete: 0 .. n-1 for the world size its markers
    record (else `world_size`), each shard matching its marker, no other shard file, all
    ranks with the same recorded inputs.
    """
    name, files = stage.path.name, stage.shard_files()
    done = stage.completed_ranks()
    if not files and not done:
        raise FileNotFoundError(
            f"no {kind + ' ' if kind else ''}shards in {stage.shards}: run the {name} stage for this round first"
        )
    markers = {r: stage.read_marker(r) or {} for r in done}
    recorded_sizes = {r: m["inputs"].get("world_size") for r, m in markers.items() if "inputs" in m}
    sizes = sorted(set(recorded_sizes.values()) - {None})
    if len(sizes) > 1:
        by_size = {s: [r for r, v in recorded_sizes.items() if v == s] for s in sizes}
        raise FileNotFoundError(
            f"{name}: its ranks were computed with different world sizes ({by_size}, world size: ranks): rerun "
            f"the stage with --redo at one world size, or delete the ranks of the other one from {stage.path}"
        )
    expected = sizes[0] if sizes else world_size
    stray = [
        f
        for f in files
        if not f.stem.isdigit()
        or (expected is not None and int(f.stem) >= expected and int(f.stem) not in markers)
    ]
    if stray:
        raise FileNotFoundError(
            f"{name}: {', '.join(str(f) for f in stray)} {'is not a shard' if len(stray) == 1 else 'are not shards'} "
            f"of its world size {expected} (no completion marker; left from another run or copied in): delete "
            f"{'it' if len(stray) == 1 else 'them'}, or rerun the {name} stage with --redo at the world size you want"
        )
    unmarked = [f for f in files if int(f.stem) not in markers]
    if unmarked:
        raise FileNotFoundError(
            f"{name} shards {', '.join(str(f) for f in unmarked)} have no completion marker: the stage was "
            f"interrupted; rerun it (completed ranks are skipped)"
        )
    if expected is not None:
        missing = sorted(set(range(expected)) - set(markers))
        if missing:
            raise FileNotFoundError(
                f"{name}: rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of world size "
                f"{expected} {'have' if len(missing) > 1 else 'has'} not finished (no completion marker in "
                f"{stage.completions}): run the {name} stage with --rank R --world_size {expected} for "
                f"{'them' if len(missing) > 1 else 'it'} first (complete ranks are skipped)"
            )
        extra = sorted(r for r in markers if r >= expected) if sizes else []
        if extra:
            raise FileNotFoundError(
                f"{name}: ranks {extra} lie outside the world size {expected} the other ranks recorded (left from "
                f"an earlier run): delete their shards and markers ({stage.shards}, {stage.completions}) or rerun "
                f"the stage with --redo"
            )
    for r in sorted(markers):
        problem = stage.problem(r)
        if problem:
            raise ShardError(
                f"{name} rank {r}: {problem}. Rerun the {name} stage: a rank whose shard does not match its "
                f"marker is recomputed (complete ranks are skipped)"
            )
    recorded = {r: m["inputs"] for r, m in markers.items() if "inputs" in m}
    if recorded:
        first = min(recorded)
        for r, rec in recorded.items():
            changes = changed_settings(recorded[first], rec)
            if changes:
                raise StageRefused(
                    f"{name}: ranks {first} and {r} were computed with different inputs ({'; '.join(changes)}): "
                    f"rerun the {name} stage with --redo so that every rank is computed with this recipe"
                )
    return [stage.shard(r) for r in sorted(markers)]


def read_stage(
    stage: StageDir, kind: str, world_size: int | None = None, columns: Sequence[str] | None = None
):
    """All shards of a completed upstream stage as one table, once `check_stage` has verified them
    (`columns`: only these)."""
    return read_shards(check_stage(stage, world_size, kind), kind, stage.path.name, columns)


def read_stage_as_is(stage: StageDir, kind: str, columns: Sequence[str] | None = None) -> tuple:
    """(the shards of `stage` as one table, why the contract does not verify them or None).

    A report of an unfinished run is the point of running it early, so it reads what is
    there and says why it is unverified; every stage reads `read_stage`. A shard that
    cannot be read at all still fails (`ShardError`).
    """
    try:
        return read_stage(stage, kind, columns=columns), None
    except (OSError, ExplainedError) as exc:
        return read_shards(stage.shard_files(), kind, stage.path.name, columns), error_message(exc)
