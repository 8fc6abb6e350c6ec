"""Removing a stage's outputs so that a process killed at any point leaves a state the next run recognises.

Deleting a folder takes one call per file, and a process killed midway leaves a folder that
looks like an output and is not one (a `dataset/` without its `state.json`, which every later
run then fails to load). So every removal of an output goes through here: what is removed is
first renamed aside, into one `.trash-<what>-<pid>-<random>` folder beside it (a rename is
atomic), and only then deleted. A kill leaves each output either in place or in a trash
folder, never half there. The trash folder lists everything it was to receive before the
first rename, so `finish_removals`, which the next run of the stage calls under the stage's
lock, moves in what a kill left behind, deletes it and says so in one line.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from selskill.data.shards import write_json_atomic

TRASH_PREFIX = ".trash-"
_LIST = "removing.json"  # in a trash folder: the names it receives (they are moved into its `items/`)


def _delete(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _set_aside(paths: Sequence[Path], what: str) -> Path | None:
    """`paths` moved into a new trash folder (None: none exists), which lists them first."""
    present = [Path(p) for p in paths if os.path.lexists(p)]
    if not present:
        return None
    folder = present[0].parent
    if any(p.parent != folder for p in present):
        raise ValueError(f"remove_outputs: {', '.join(map(str, present))} are not in one folder")
    trash = folder / f"{TRASH_PREFIX}{what}-{os.getpid()}-{secrets.token_hex(3)}"
    (trash / "items").mkdir(parents=True)
    write_json_atomic({"names": [p.name for p in present]}, trash / _LIST)
    for p in present:
        os.replace(p, trash / "items" / p.name)
    return trash


def remove_outputs(paths: Sequence[Path], what: str) -> None:
    """Remove `paths` (files or folders of one folder; missing ones are skipped): renamed aside, then deleted.

    `what` names the trash folder (`.trash-<what>-<pid>-<random>`) and says whose outputs it held.
    """
    trash = _set_aside(paths, what)
    if trash is not None:
        _delete(trash)


def replace_output(new: Path, final: Path, what: str) -> None:
    """`new` renamed onto `final` (a folder or a file); the old `final` is set aside first and deleted last.

    A kill leaves the old `final` or the new one, or (between the two renames) none and the new one
    still under its own name; never half of either.
    """
    trash = _set_aside([final], what)
    os.replace(new, final)
    if trash is not None:
        _delete(trash)


def finish_removals(folder: Path, log: Callable[[str], None]) -> list[str]:
    """Finish every removal a killed process left in `folder`: what it was removing (in its trash folder or
    still in place) is deleted, with one line each. Call it holding the lock of whoever removes there."""
    done = []
    for trash in sorted(folder.glob(TRASH_PREFIX + "*")) if folder.is_dir() else ():
        if not trash.is_dir():
            continue
        try:
            names = json.loads((trash / _LIST).read_text()).get("names") or []
        except (OSError, ValueError, AttributeError):  # killed before its list was written: nothing moved yet
            names = []
        (trash / "items").mkdir(exist_ok=True)
        for name in names:  # not yet moved when the process was killed (one it moved may have been replaced)
            if os.path.lexists(folder / name) and not os.path.lexists(trash / "items" / name):
                os.replace(folder / name, trash / "items" / name)
        _delete(trash)
        shown = ", ".join(names) if names else "nothing yet"
        log(f"{folder}: finished removing {shown} (a process removing them was killed; {trash.name} deleted)")
        done.append(trash.name)
    return done
