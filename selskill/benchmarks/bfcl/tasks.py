"""BFCL's tasks from bfcl-eval's shipped data files, and their ground truth as a model writes it.

`keyword_ground_truth` names every positional argument of a ground-truth call (BFCL's decoder
drops positional arguments, so the data's own text would fail), binding it as Python does when
BFCL's checker `eval`s the ground truth; `ground_truth_commands` turns it into env commands.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from selskill.benchmarks.bfcl.config import CATEGORIES, split_scenarios
from selskill.envs.base import EnvError
from selskill.errors import MissingPackage

BFCL_VERSION = "2026.3.23"
# the eight executable backends of the multi-turn categories; the memory and web-search
# classes share BFCL's mapping tables and are never instantiated here
BACKEND_CLASSES: tuple[str, ...] = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)


def bfcl_constants():
    """bfcl-eval's constants, imported on first use so that `import selskill` never needs it."""
    try:
        from bfcl_eval.constants import default_prompts, executable_backend_config
    except ImportError as exc:
        raise MissingPackage(
            f"BFCL needs bfcl-eval=={BFCL_VERSION}, which is not installed: pip install --no-deps "
            f"bfcl-eval=={BFCL_VERSION} mpmath"
        ) from exc
    return default_prompts, executable_backend_config


def max_steps_per_turn() -> int:
    """BFCL's MAXIMUM_STEP_LIMIT (20): call steps allowed in one user turn."""
    return bfcl_constants()[0].MAXIMUM_STEP_LIMIT


@dataclass(frozen=True)
class BfclTask:
    id: str  # BFCL's own id, e.g. "multi_turn_base_17"
    category: str
    scenario: int  # index shared by the four categories' variants of one scenario
    turns: tuple[str, ...]  # the user message of each turn ("" on a miss_func reveal turn)
    involved_classes: tuple[str, ...]
    withheld: dict  # turn index -> names of the functions revealed at that turn (miss_func)
    ground_truth: tuple[tuple[str, ...], ...]
    entry: dict = field(repr=False, compare=False)  # the raw test entry, for the checker

    @property
    def long_context(self) -> bool:
        # BFCL's rule (multi_turn_utils callers): "long_context" in the category name
        return "long_context" in self.category


def data_dir():
    bfcl_constants()
    return resources.files("bfcl_eval") / "data"


def data_files(categories: Iterable[str]) -> dict[str, Path]:
    """The data files the tasks of `categories` are read from (tasks, ground truth, every class's
    function docs), by their path below bfcl-eval's data folder."""
    base = Path(str(data_dir()))
    names = [f"BFCL_v4_multi_turn_{c}.json" for c in check_categories(categories)]
    found = [base / n for n in names] + [base / "possible_answer" / n for n in names]
    found += sorted((base / "multi_turn_func_doc").glob("*.json"))
    return {p.relative_to(base).as_posix(): p for p in found}


def installed_version() -> str:
    """The bfcl-eval version installed: its code (backends, checker) is part of what a stage played."""
    from importlib.metadata import version

    bfcl_constants()
    return version("bfcl-eval")


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def check_categories(categories: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(categories)
    unknown = [c for c in chosen if c not in CATEGORIES]
    if unknown or not chosen:
        raise ValueError(
            f"unknown BFCL categories {unknown or chosen!r}; choose from {', '.join(CATEGORIES)}"
        )
    return chosen


@cache
def _category_tasks(category: str) -> tuple[BfclTask, ...]:
    data = data_dir()
    entries = read_jsonl(data / f"BFCL_v4_multi_turn_{category}.json")
    answers = {
        a["id"]: a["ground_truth"]
        for a in read_jsonl(data / "possible_answer" / f"BFCL_v4_multi_turn_{category}.json")
    }
    tasks = []
    for entry in entries:
        turns = []
        for messages in entry["question"]:
            if any(m.get("role") != "user" for m in messages):
                raise EnvError(f"{entry['id']}: a turn holds a non-user message")
            turns.append("\n".join(m["content"] for m in messages))
        unknown = set(entry["involved_classes"]) - set(BACKEND_CLASSES)
        if unknown:
            raise EnvError(f"{entry['id']}: unsupported classes {sorted(unknown)}")
        tasks.append(
            BfclTask(
                id=entry["id"],
                category=category,
                scenario=int(entry["id"].rsplit("_", 1)[1]),
                turns=tuple(turns),
                involved_classes=tuple(entry["involved_classes"]),
                withheld={int(k): tuple(v) for k, v in entry.get("missed_function", {}).items()},
                ground_truth=tuple(tuple(t) for t in answers[entry["id"]]),
                entry=entry,
            )
        )
    return tuple(tasks)


def load_tasks(
    categories: Iterable[str] = CATEGORIES, scenarios: Iterable[int] | None = None
) -> list[BfclTask]:
    """The tasks of `categories` (in that order, by scenario), restricted to `scenarios` if given."""
    keep = None if scenarios is None else set(scenarios)
    return [
        t
        for c in check_categories(categories)
        for t in _category_tasks(c)
        if keep is None or t.scenario in keep
    ]


@cache
def _method_parameters(class_name: str) -> dict[str, tuple[str, ...]]:
    """Each public method's parameter names, in signature order (what a positional argument binds to)."""
    module = importlib.import_module(bfcl_constants()[1].CLASS_FILE_PATH_MAPPING[class_name])
    cls = getattr(module, class_name)
    return {
        name: tuple(p for p in inspect.signature(method).parameters if p != "self")
        for name, method in inspect.getmembers(cls, predicate=inspect.isfunction)
        if not name.startswith("_")
    }


def is_positional(call: str) -> bool:
    """Whether a ground-truth call passes an argument by position (BFCL's decoder drops it)."""
    node = ast.parse(call, mode="eval").body
    return isinstance(node, ast.Call) and bool(node.args)


def keyword_call(call: str, involved_classes: Sequence[str]) -> str:
    """A ground-truth call with every positional argument named.

    A positional argument is bound as Python binds it when BFCL's checker `eval`s the ground
    truth: to the backend method's parameters in signature order (the docs' order differs for
    one method), on the last involved class that has the method, as BFCL maps names."""
    node = ast.parse(call, mode="eval").body
    if not node.args:
        return call
    params = {}
    for class_name in involved_classes:
        params.update(_method_parameters(class_name))
    names = params[node.func.id]
    parts = [f"{name}={ast.unparse(arg)}" for name, arg in zip(names, node.args, strict=False)]
    parts += [f"{kw.arg}={ast.unparse(kw.value)}" for kw in node.keywords]
    return f"{node.func.id}({', '.join(parts)})"


def keyword_ground_truth(task: BfclTask) -> tuple[tuple[str, ...], ...]:
    """The ground truth in the form BFCL's decoder reads: keyword arguments only (`keyword_call`)."""
    return tuple(tuple(keyword_call(c, task.involved_classes) for c in turn) for turn in task.ground_truth)


def ground_truth_commands(
    task: BfclTask, max_steps: int | None = None, drop_last_call: bool = False, verbatim: bool = False
) -> list[str]:
    """The ground truth as env commands: one call per step, "" to end each turn.

    The calls are written with keyword arguments (`keyword_ground_truth`), as a model must
    write them; `verbatim` keeps the data's own text, whose positional arguments BFCL's
    decoder drops (those tasks then fail, as they would in BFCL's pipeline).
    A turn of more than `max_steps` calls (BFCL's 20 by default; two long_context tasks
    have 34) is packed into at most that many steps, a call list per step, as a model would
    batch them.
    `drop_last_call` leaves out the task's last call (a near miss the checker must fail).
    """
    limit = max_steps or max_steps_per_turn()
    truth = task.ground_truth if verbatim else keyword_ground_truth(task)
    turns = [list(calls) for calls in truth]
    if drop_last_call:
        last = max((i for i, calls in enumerate(turns) if calls), default=None)
        if last is not None:
            turns[last].pop()
    commands: list[str] = []
    for calls in turns:
        per_step = max(1, -(-len(calls) // limit))
        for i in range(0, len(calls), per_step):
            chunk = calls[i : i + per_step]
            commands.append(chunk[0] if len(chunk) == 1 else "[" + ", ".join(chunk) + "]")
        commands.append("")
    return commands


def split_tasks(
    split: str, categories: Iterable[str] = CATEGORIES, test_fraction: float = 0.5, seed: int = 0
) -> list[BfclTask]:
    """The tasks of `categories` whose scenario falls in `split` ("train" or "test")."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    train, test = split_scenarios(test_fraction, seed)
    return load_tasks(categories, train if split == "train" else test)
