"""BFCL multi-turn function calling behind the `Env` protocol, from bfcl-eval's shipped data.

Only three real parts of `bfcl-eval==2026.3.23` are used: its data files (tasks, ground
truth, function docs), its eight executable backends (GorillaFileSystem ... VehicleControlAPI)
and its checker (`multi_turn_checker`). Nothing imports `bfcl_eval.utils` or
`model_handler.*` (they pull provider SDKs), nor the memory and web-search backends.

The plugin's BFCL code has one module per job: `tasks` (the data files, the tasks and their
ground truth as a model writes it), `docs` (function docs and their rendering), `checker`
(BFCL's verdict on the recorded calls) and this one, the env and the task index the stages
read. A caller of the env imports from here what it uses of the others (`__all__`).

Design choices, and why:

- **A step is one model response**, decoded exactly as BFCL's prompting pipeline decodes it
  (selskill/benchmarks/bfcl/calls.py: keyword arguments only, BFCL's value rules, arithmetic evaluated
  without `eval` over the names BFCL's decoder module defines, selskill/benchmarks/bfcl/decoding.py). A step that decodes to no call (`""`, `[]`, text BFCL cannot decode) ends
  the user turn and shows the next one, with the reason when there was text; it costs no
  env step (the paper's reference counted that canned message as a step). BFCL's limit of
  20 call steps per turn applies as its loop applies it: the 21st step runs, then the task
  stops; on the last turn the checker still judges it, on an earlier one turns are missing
  and it fails (`multi_turn:force_terminated`).
- **Every decoded call is executed and judged**, as in BFCL: unknown names and calls that
  raise included, each answered with BFCL's own text. Execution is BFCL's
  (selskill/benchmarks/bfcl/execution.py): its method-name rewrite, its refused names, then a walk
  of the expression on our backends instead of its `eval`, so outputs are BFCL's byte for
  byte and no model text ever runs anything but a backend method.
- **What is callable is what BFCL's backends run**: by default (`withheld_callable=True`,
  BFCL's rule) a miss_func function withheld until a later turn runs when called before it,
  though its docs are shown only at its turn; one ground truth relies on it
  (multi_turn_miss_func_49 calls `tail` at turn 1, two turns before it is revealed).
  `withheld_callable=False` is the stricter option: a call to a withheld function then gets
  BFCL's own text for an unknown name and runs nothing, so a model that guessed its name is
  not judged on a call it was never offered.
- **`admissible_commands` are the names of the functions callable now**, not complete
  commands: a call's arguments are open-ended literals, so no finite list of commands
  exists; the names are what changes between turns (miss_func) and what a skill's
  preconditions check ("place_order is available"). Admissible-action decoding, which
  forces the output to be one listed command, therefore does not apply to BFCL.
- **Success is BFCL's checker** run once at the end on every decoded step, as BFCL's
  `eval_runner` feeds it: each call's own execution string. A call the walk refused (a
  withheld function under the strict option, an expression the walk does not run) reaches it
  too, but BFCL's checker code runs with its executor answering that call with the output the
  env gave it, so the checker never `eval`s it.
  The checker caches its backend instances in its module's globals under a model name and
  the task id; every env has its own model name and frees exactly its entries after each
  check, so a long run does not grow and two envs in one process never share state.
- **The split is by scenario index**: the four categories are index-aligned variants of
  the same 200 scenarios (same classes, near-identical configs), so splitting task ids would
  put one scenario's variants in both train and test.
- **`EnvState.task` is the latest user request**: a turn's request replaces the previous one;
  a miss_func turn that only reveals functions keeps the request it answers.
  `inventory()` is empty (the agent carries nothing). `info` holds the turn, the per-call
  results (`call_results`: call, output, error) and, at the end, the checker's verdict.
"""

from __future__ import annotations

import copy
import functools
import importlib
import itertools
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from selskill.benchmarks.bfcl.checker import check_calls
from selskill.benchmarks.bfcl.config import CATEGORIES, DOC_STYLES, split_scenarios
from selskill.benchmarks.bfcl.decoding import decode
from selskill.benchmarks.bfcl.docs import function_docs, render_function_docs, task_function_docs
from selskill.benchmarks.bfcl.execution import CallExecutor
from selskill.benchmarks.bfcl.tasks import (
    BACKEND_CLASSES,
    BFCL_VERSION,
    BfclTask,
    bfcl_constants,
    data_files,
    ground_truth_commands,
    installed_version,
    is_positional,
    keyword_ground_truth,
    load_tasks,
    max_steps_per_turn,
    split_tasks,
)
from selskill.envs.base import EnvError, EnvState, replay_commands

END_OF_TASK = "All user requests of this task have been handled."
_ENV_COUNTER = itertools.count()  # each env's own model name in BFCL's checker cache


def build_backends(task: BfclTask) -> dict[str, object]:
    """Fresh backend instances for `task`, loaded from its initial_config as BFCL loads them."""
    _, config = bfcl_constants()
    instances = {}
    for class_name in task.involved_classes:
        module = importlib.import_module(config.CLASS_FILE_PATH_MAPPING[class_name])
        instance = getattr(module, class_name)()
        if class_name not in config.STATELESS_CLASSES:
            scenario = copy.deepcopy(task.entry["initial_config"].get(class_name, {}))
            instance._load_scenario(scenario, long_context=task.long_context)
        instances[class_name] = instance
    return instances


def public_state(instances: dict[str, object]) -> dict[str, dict]:
    """What BFCL's state check compares: each instance's attributes not starting with `_` (copied)."""
    return {
        name: copy.deepcopy({k: v for k, v in vars(inst).items() if not k.startswith("_")})
        for name, inst in instances.items()
    }


class BfclEnv:
    """The `Env` protocol over BFCL's multi-turn tasks; one instance plays many tasks in turn."""

    def __init__(
        self,
        categories: Iterable[str] = CATEGORIES,
        scenarios: Iterable[int] | None = None,
        tasks: Sequence[BfclTask] | None = None,
        withheld_callable: bool = True,
        id_prefix: str = "",
    ):
        """`id_prefix` goes before every task id (`test/multi_turn_base_3`): the stages name a task
        `<split>/<id>`, as they name ALFWorld's games; `task()` and `reset()` take either form."""
        chosen = list(tasks) if tasks is not None else load_tasks(categories, scenarios)
        self.id_prefix = id_prefix
        self._tasks = {id_prefix + t.id: t for t in chosen}
        self._order = [id_prefix + t.id for t in chosen]
        self.withheld_callable = withheld_callable
        self.model_name = f"selskill_{os.getpid()}_{next(_ENV_COUNTER)}"
        self.max_steps_per_turn = max_steps_per_turn()
        self._task: BfclTask | None = None
        self._state: EnvState | None = None

    # -- protocol ---------------------------------------------------------------------

    def task_ids(self) -> list[str]:
        return list(self._order)

    def task(self, task_id: str) -> BfclTask:
        try:
            return self._tasks[task_id if task_id in self._tasks else self.id_prefix + task_id]
        except KeyError:
            raise KeyError(f"unknown task id {task_id!r} ({len(self._tasks)} tasks)") from None

    @property
    def state(self) -> EnvState:
        if self._state is None:
            raise RuntimeError("call reset(task_id) first")
        return self._state

    def reset(self, task_id: str) -> EnvState:
        task = self.task(task_id)
        try:
            self.instances = build_backends(task)
        except Exception as exc:
            raise EnvError(f"{task_id}: could not build the backends: {exc!r}") from exc
        self._task = task
        self.turn = 0
        self.turn_steps = 0
        # what BFCL's checker is given: turn -> step -> one execution string per decoded call
        self.calls: list[list[list[str]]] = [[]]
        # the calls the walk refused to run, (turn, step, call) -> their output: the checker answers
        # them with it rather than running them
        self.refused: dict[tuple[int, int, int], str] = {}
        self.functions = task_function_docs(task, 0)
        self._executor = CallExecutor(task.id, self.instances)
        self.verdict: dict | None = None
        self._request = task.turns[0]
        self._state = self._make_state(task.turns[0], env_steps=0)
        return self._state

    def step(self, command: str) -> EnvState:
        if self._state is None or self._task is None:
            raise RuntimeError("call reset(task_id) first")
        if self._state.done:
            self._state = self._make_state("The task is over.", env_steps=0, done=True, won=self._state.won)
            return self._state
        decoded = decode(command)
        if not decoded.calls:
            return self._end_turn(decoded.error)
        runs = [self._executor.run(call.text, self._callable_now) for call in decoded.calls]
        where = (len(self.calls) - 1, len(self.calls[-1]))
        self.refused.update({(*where, i): run.output for i, run in enumerate(runs) if run.refused})
        self.calls[-1].append([call.text for call in decoded.calls])
        self.turn_steps += 1
        results = [
            {"call": call.text, "output": run.output, "error": run.error}
            for call, run in zip(decoded.calls, runs, strict=True)
        ]
        observation = "\n".join(f"{r['call']} -> {r['output']}" for r in results)
        if self.turn_steps > self.max_steps_per_turn:
            # BFCL's loop stops the task here, keeping this turn: on the last turn the checker
            # still judges everything played; before it, turns are missing (force_terminated)
            self.verdict = check_calls(self._task, self.calls, self.model_name, self.refused)
            observation += f"\nModel has been forced to quit after {self.max_steps_per_turn} steps."
            won = bool(self.verdict.get("valid"))
            return self._set(self._make_state(observation, env_steps=1, done=True, won=won, results=results))
        return self._set(self._make_state(observation, env_steps=1, results=results))

    def replay(self, task_id: str, commands: Sequence[str]) -> EnvState:
        return replay_commands(self, task_id, commands)

    def inventory(self) -> list[str]:
        return []

    # -- helpers ------------------------------------------------------------------------

    @property
    def available(self) -> list[str]:
        """Names of the functions callable now, in BFCL's doc order."""
        return [d["name"] for d in self.functions]

    def _callable_now(self, method: str) -> bool:
        return self.withheld_callable or method in self.available

    def _end_turn(self, problem: str = "") -> EnvState:
        task = self._task
        self.turn += 1
        self.turn_steps = 0
        note = f"(No call was run: {problem}. The user turn has ended.)\n" if problem else ""
        if self.turn >= len(task.turns):
            self.verdict = check_calls(task, self.calls, self.model_name, self.refused)
            won = bool(self.verdict.get("valid"))
            return self._set(self._make_state(note + END_OF_TASK, env_steps=0, done=True, won=won))
        self.calls.append([])
        if self.turn in task.withheld:
            self.functions = task_function_docs(task, self.turn)
            shown = {d["name"]: d for d in self.functions}
            new = [shown[n] for n in task.withheld[self.turn] if n in shown]
            prompt = bfcl_constants()[0].DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
            observation = f"{render_function_docs(new, 'compact')}\n{prompt}"
            if task.turns[self.turn]:
                observation += "\n" + task.turns[self.turn]
        else:
            observation = task.turns[self.turn]
        if task.turns[self.turn]:
            self._request = task.turns[self.turn]
        return self._set(self._make_state(note + observation, env_steps=0))

    def _set(self, state: EnvState) -> EnvState:
        self._state = state
        return state

    def _make_state(self, observation: str, env_steps: int, done=False, won=False, results=None) -> EnvState:
        task = self._task
        info = {
            "task_id": task.id,
            "category": task.category,
            "scenario": task.scenario,
            "turn": self.turn,
            "n_turns": len(task.turns),
            "turn_steps": self.turn_steps,
            "call_results": [{k: r[k] for k in ("call", "output", "error")} for r in (results or [])],
        }
        if self.verdict is not None:
            info["verdict"] = {k: self.verdict.get(k) for k in ("valid", "error_type", "error_message")}
        return EnvState(
            observation=observation,
            admissible_commands=self.available,
            task=self._request,
            won=won,
            done=done,
            env_steps=env_steps,
            info=info,
        )


@dataclass(frozen=True)
class TaskRecord:
    task_id: str  # <split>/<BFCL id>
    task_type: str  # the BFCL category: metrics per task type are metrics per category


@dataclass
class BfclTaskIndex:
    """The BFCL tasks of one split, in the shape the stages read from ALFWorld's `GameIndex`."""

    split: str
    categories: tuple[str, ...]
    scenarios: tuple[int, ...]
    withheld_callable: bool = True
    games: list[TaskRecord] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)  # nothing is skipped: every task plays
    benchmark = "bfcl"  # its registry name (selskill.registry.benchmark_of_index)

    def by_id(self) -> dict[str, TaskRecord]:
        return {g.task_id: g for g in self.games}

    def stats(self) -> dict[str, int]:
        return {}

    def summary(self) -> str:
        return f"{len(self.games)} BFCL tasks ({', '.join(self.categories)}) in split {self.split}"

    def env_factory(self):
        """A picklable factory (episodes may run in a child process, which loads the tasks itself)."""
        return functools.partial(
            BfclEnv,
            categories=self.categories,
            scenarios=self.scenarios,
            withheld_callable=self.withheld_callable,
            id_prefix=f"{self.split}/",
        )


def task_index(
    split: str, categories: Sequence[str], scenarios: Sequence[int], withheld_callable: bool = True
) -> BfclTaskIndex:
    """The tasks of `scenarios` in `categories`, with ids `<split>/<BFCL id>`."""
    tasks = load_tasks(categories, scenarios)
    return BfclTaskIndex(
        split,
        tuple(categories),
        tuple(scenarios),
        withheld_callable,
        [TaskRecord(f"{split}/{t.id}", t.category) for t in tasks],
    )


__all__ = [
    "BACKEND_CLASSES",
    "BFCL_VERSION",
    "CATEGORIES",
    "DOC_STYLES",
    "END_OF_TASK",
    "BfclEnv",
    "BfclTask",
    "BfclTaskIndex",
    "TaskRecord",
    "build_backends",
    "check_calls",
    "data_files",
    "function_docs",
    "ground_truth_commands",
    "installed_version",
    "is_positional",
    "keyword_ground_truth",
    "load_tasks",
    "max_steps_per_turn",
    "public_state",
    "render_function_docs",
    "split_scenarios",
    "split_tasks",
    "task_function_docs",
    "task_index",
]
