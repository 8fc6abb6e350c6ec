"""The train stage's checkpoints: which one a rerun resumes, and what it does with the others.

A rerun resumes from the newest *complete* `checkpoint-N` whose recorded inputs equal its own.
A newer one that a crash left half-written (a truncated weights or optimizer file, no
trainer_state.json or inputs file) is moved aside to `incomplete-checkpoint-N` with a message
naming it and the file; one that recorded other inputs is refused, never resumed
(docs/design.md, "Training resumes from the last complete checkpoint").
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import NamedTuple

from selskill.data.shards import write_json_atomic
from selskill.train.inputs import refuse_changed

logger = logging.getLogger(__name__)

INPUTS_FILE = "selskill_inputs.json"  # in each checkpoint: the inputs of the run that wrote it

INCOMPLETE_PREFIX = "incomplete-"  # not `checkpoint-*`: the Trainer neither resumes from nor rotates it


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{path.name} is truncated ({size} bytes)"
        n = int.from_bytes(head, "little")
        if 8 + n > size:
            return f"{path.name} is truncated ({size} bytes, its header alone needs {8 + n})"
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return f"{path.name} has an unreadable header"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        return f"{path.name} is truncated ({size} of {8 + n + end} bytes)"
    return None


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why `ckpt` cannot be resumed from (None: it can): a file the save never finished.

    trainer_state.json is the last file the Trainer writes, and the inputs file is written
    after it (`record_inputs`); every weights, optimizer and state file must also be whole
    (safetensors by its header, torch pickles by their zip directory, JSON by parsing).
    """
    import zipfile

    if not (ckpt / "trainer_state.json").is_file():
        return "it has no trainer_state.json (the save did not finish)"
    if not (ckpt / INPUTS_FILE).is_file():
        return f"it has no {INPUTS_FILE} (the save did not finish, or a selskill that did not record inputs wrote it)"
    for f in sorted(p for p in ckpt.rglob("*") if p.is_file()):
        rel = f.relative_to(ckpt)
        if f.suffix == ".safetensors":
            problem = _safetensors_problem(f)
            if problem:
                return problem.replace(f.name, str(rel), 1)
        elif f.suffix in (".pt", ".pth", ".bin"):
            try:
                zipfile.ZipFile(f).close()
            except (zipfile.BadZipFile, OSError) as exc:
                return f"{rel} is truncated or corrupt ({exc})"
        elif f.suffix == ".json":
            try:
                json.loads(f.read_text())
            except (ValueError, OSError) as exc:
                return f"{rel} is unreadable ({exc})"
    return None


def resumable_checkpoint(stage_path: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the newest complete checkpoint-N, the newer incomplete ones with why)."""
    import re

    found = [
        (int(m.group(1)), p)
        for p in (stage_path.iterdir() if stage_path.is_dir() else ())
        if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name))
    ]
    broken = []
    for _, ckpt in sorted(found, reverse=True):
        problem = checkpoint_problem(ckpt)
        if problem is None:
            return ckpt, broken
        broken.append((ckpt, problem))
    return None, broken


def record_inputs(recorded: dict):
    """A Trainer callback writing `recorded` into every checkpoint once it is saved: a rerun resumes only a
    checkpoint of its own run (same inputs), and one without the file counts as unfinished."""
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    class RecordInputs(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                ckpt = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
                write_json_atomic(recorded, ckpt / INPUTS_FILE)

    return RecordInputs()


def set_aside(ckpt: Path) -> Path:
    dest = ckpt.with_name(INCOMPLETE_PREFIX + ckpt.name)
    n = 1
    while dest.exists():
        n += 1
        dest = ckpt.with_name(f"{INCOMPLETE_PREFIX}{ckpt.name}.{n}")
    ckpt.rename(dest)
    return dest


def checkpoint_dirs(stage_path: Path) -> list[Path]:
    """Every checkpoint of the stage, complete or set aside (what `--redo` removes)."""
    return [*stage_path.glob("checkpoint-*"), *stage_path.glob(INCOMPLETE_PREFIX + "checkpoint-*")]


class Resume(NamedTuple):
    """Where training starts: the checkpoint resumed (None: from the start) and its step."""

    checkpoint: Path | None
    step: int


def resume_point(stage_path: Path, inputs, record: dict, state) -> Resume:
    """The checkpoint this run resumes (refused when it recorded other inputs), once every process chose it;
    the main process then moves the newer incomplete ones aside."""
    last, broken = resumable_checkpoint(stage_path)
    if last is not None:
        own = json.loads((last / INPUTS_FILE).read_text()).get("inputs") or {}
        refuse_changed(
            f"{last}",
            inputs.changes(own, record),
            last / INPUTS_FILE,
            "It is not resumed: rerun with --redo to train from the start (the round's checkpoints are deleted)",
        )
    state.wait_for_everyone()  # every process has chosen before the main one moves anything
    if state.is_main_process:
        for ckpt, problem in broken:
            logger.warning(f"train: skipping {ckpt}: {problem}; moved it to {set_aside(ckpt)}")
        if last:
            logger.info(f"train: resuming from {last}")
        elif broken:
            logger.info("train: no complete checkpoint left: training from the start")
    step = json.loads((last / "trainer_state.json").read_text())["global_step"] if last else 0
    return Resume(last, step)
