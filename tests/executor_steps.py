"""A toy stage for the local executor's worker processes (each spawned worker imports this module again).

Each rank reads what to do from `<runs_dir>/mode-<rank>`: `done` (at once), `die` (SIGKILL
itself, as the out-of-memory killer would), `after-0` (finish a second after rank 0 has
started), `wait` (until `<runs_dir>/release` exists). It writes `started-<rank>` first,
`unwound-<rank>` however it ends, and `done-<rank>` when it finishes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from selskill.executors.base import Step


class ToyStep(Step):
    name = "toy"
    doc = "a toy stage"

    def __init__(self, root: Path):
        self.root = root

    @classmethod
    def of(cls, recipe) -> ToyStep:
        return cls(Path(recipe.run.runs_dir))

    def _wait_for(self, path: Path, seconds: float = 120) -> None:
        deadline = time.time() + seconds
        while not path.exists() and time.time() < deadline:
            time.sleep(0.05)

    def run(self, rank: int = 0, world_size: int = 1) -> None:
        mode_file = self.root / f"mode-{rank}"
        mode = mode_file.read_text() if mode_file.exists() else "done"
        (self.root / f"started-{rank}").write_text(str(os.getpid()))
        try:
            if mode == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            elif mode == "after-0":
                self._wait_for(self.root / "started-0")
                time.sleep(1)
            elif mode == "wait":
                self._wait_for(self.root / "release")
            (self.root / f"done-{rank}").write_text("x")
        finally:
            (self.root / f"unwound-{rank}").write_text("x")
