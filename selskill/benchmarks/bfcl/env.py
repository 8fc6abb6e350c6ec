"""BFCL multi-turn function calling behind the `Env` protocol, from bfcl-eval's shipped data.

Only three real parts of `bfcl-eval==2026.3.23` are used: its data files (tasks, ground
truth, function docs), its eight executable backends (GorillaFileSystem ... VehicleControlAPI)
and its checker (`multi_turn_checker`). Nothing imports `bfcl_eval.utils` or
`model_handler.*` (they pull provider SDKs), nor the memory and web-search backends.

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

import ast
import copy
import functools
import importlib
import inspect
import itertools
import json
import os
import re
import types
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from selskill.benchmarks.bfcl.config import CATEGORIES, DOC_STYLES, split_scenarios
from selskill.benchmarks.bfcl.decoding import decode
from selskill.benchmarks.bfcl.execution import CallExecutor
from selskill.envs.base import EnvError, EnvState, replay_commands
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
END_OF_TASK = "All user requests of this task have been handled."


def _bfcl():
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
    return _bfcl()[0].MAXIMUM_STEP_LIMIT


# --- tasks ---------------------------------------------------------------------------


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


def _data_dir():
    _bfcl()
    return resources.files("bfcl_eval") / "data"


def data_files(categories: Iterable[str]) -> dict[str, Path]:
    """The data files the tasks of `categories` are read from (tasks, ground truth, every class's
    function docs), by their path below bfcl-eval's data folder."""
    base = Path(str(_data_dir()))
    names = [f"BFCL_v4_multi_turn_{c}.json" for c in check_categories(categories)]
    found = [base / n for n in names] + [base / "possible_answer" / n for n in names]
    found += sorted((base / "multi_turn_func_doc").glob("*.json"))
    return {p.relative_to(base).as_posix(): p for p in found}


def installed_version() -> str:
    """The bfcl-eval version installed: its code (backends, checker) is part of what a stage played."""
    from importlib.metadata import version

    _bfcl()
    return version("bfcl-eval")


def _read_jsonl(path) -> list[dict]:
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
    data = _data_dir()
    entries = _read_jsonl(data / f"BFCL_v4_multi_turn_{category}.json")
    answers = {
        a["id"]: a["ground_truth"]
        for a in _read_jsonl(data / "possible_answer" / f"BFCL_v4_multi_turn_{category}.json")
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
    module = importlib.import_module(_bfcl()[1].CLASS_FILE_PATH_MAPPING[class_name])
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


# --- function docs -------------------------------------------------------------------


@cache
def _class_docs(class_name: str) -> tuple[dict, ...]:
    mapping = _bfcl()[1].MULTI_TURN_FUNC_DOC_FILE_MAPPING
    return tuple(_read_jsonl(_data_dir() / "multi_turn_func_doc" / mapping[class_name]))


def function_docs(class_names: Iterable[str]) -> list[dict]:
    """BFCL's docs of the classes, in BFCL's order (deep copies: callers may edit them)."""
    return [copy.deepcopy(d) for c in class_names for d in _class_docs(c)]


def task_function_docs(task: BfclTask, turn: int = 0) -> list[dict]:
    """The docs BFCL shows at `turn`: every involved class's, minus functions withheld until later.

    Revealed functions are appended in their turn's order, as BFCL extends its list.
    """
    docs = function_docs(task.involved_classes)
    withheld = [(t, n) for t, names in sorted(task.withheld.items()) for n in names]
    by_name = {d["name"]: d for d in docs}
    hidden = {n for _, n in withheld}
    shown = [d for d in docs if d["name"] not in hidden]
    shown += [by_name[n] for t, n in withheld if t <= turn and n in by_name]
    return shown


_PREAMBLE_RE = re.compile(r"^This tool belongs to (?:the )?(.*?)\s*Tool description:\s*", re.S)
_ENUM_RE = re.compile(r"\s*\[Enum\]:\s*(\[[^\]]*\])\.?")
_DEFAULT_RE = re.compile(r"\s*Defaults to [^.]*(?:\.\d+)?[^.]*\.")
_TYPES = {
    "string": "str",
    "integer": "int",
    "float": "float",
    "boolean": "bool",
    "dict": "dict",
    "any": "any",
}


def _type_name(spec: dict) -> str:
    kind = spec.get("type", "any")
    if kind == "array":
        return f"list[{_type_name(spec.get('items') or {})}]"
    if kind == "tuple":
        return "tuple"
    enum = _ENUM_RE.search(spec.get("description", ""))
    if enum and kind == "string":
        try:
            return "|".join(repr(v) for v in json.loads(enum.group(1)))
        except ValueError:
            pass
    return _TYPES.get(kind, kind)


def _param_note(spec: dict) -> str:
    """A parameter's description without what the signature already says (enum, default)."""
    text = " ".join(spec.get("description", "").split())
    if spec.get("type") == "string":
        text = _ENUM_RE.sub("", text)
    if "default" in spec:
        text = _DEFAULT_RE.sub("", text)
    return text.strip().rstrip(".")


def _signature(doc: dict) -> str:
    params = doc.get("parameters") or {}
    required = set(params.get("required") or [])
    parts = []
    for name, spec in (params.get("properties") or {}).items():
        kind = _type_name(spec)
        if name in required:
            parts.append(f"{name}: {kind}")
        elif "default" in spec:
            parts.append(f"{name}: {kind} = {spec['default']!r}")
        else:
            parts.append(f"{name}?: {kind}")
    returns = [r for r in ((doc.get("response") or {}).get("properties") or {}) if not r.startswith("_")]
    tail = f" -> {', '.join(returns)}" if returns else ""
    return f"{doc['name']}({', '.join(parts)}){tail}"


def render_function_docs(docs: Sequence[dict], style: str = "compact") -> str:
    """Function docs as text for a prompt.

    `json` is BFCL's own rendering (`json.dumps(docs, indent=4)`, its default prompt format).
    `compact` writes each class's preamble once, then per function its signature (types,
    string enums as `'a'|'b'`, defaults, `?` for optional parameters, returned fields), its
    description and one line of parameter descriptions; `brief` drops that last line. BFCL's
    docs repeat the class preamble in every description and describe every returned field,
    which is most of their size.
    """
    if style not in DOC_STYLES:
        raise ValueError(f"unknown doc style {style!r} (allowed: {', '.join(DOC_STYLES)})")
    if style == "json":
        return json.dumps(list(docs), indent=4)
    lines: list[str] = []
    preamble = None
    for doc in docs:
        description = " ".join(doc.get("description", "").split())
        match = _PREAMBLE_RE.match(description)
        if match:
            if match.group(1) != preamble:
                preamble = match.group(1)
                lines.append(f"# {preamble.rstrip('. ')}")
            description = description[match.end() :]
        lines.append(f"- {_signature(doc)}: {description}")
        if style == "compact":
            props = ((doc.get("parameters") or {}).get("properties")) or {}
            notes = [f"{n}: {note}" for n, s in props.items() if (note := _param_note(s))]
            if notes:
                lines.append("    " + "; ".join(notes))
    return "\n".join(lines)


# --- the checker ----------------------------------------------------------------------

_ENV_COUNTER = itertools.count()


def _checker_modules():
    _bfcl()
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils

    return multi_turn_checker, multi_turn_utils


def _instance_key(name: str) -> str:
    return re.sub(r"[-./:]", "_", name)  # BFCL's sanitising of its instance names


def free_checker_cache(model_name: str, task_id: str) -> int:
    """Drop the backend instances BFCL's checker cached for (model, task); returns how many.

    `execute_multi_turn_func_call` keeps every instance it builds in its module's globals
    under `{model}[_ground_truth]_eval_{task}_{class}_instance`, forever.
    """
    utils = _checker_modules()[1]
    prefixes = tuple(_instance_key(f"{model_name}{kind}_eval_{task_id}_") for kind in ("", "_ground_truth"))
    stale = [k for k in list(vars(utils)) if k.startswith(prefixes) and k.endswith("_instance")]
    for key in stale:
        del vars(utils)[key]
    return len(stale)


def _answering_checker(answers: dict[int, dict[int, str]]):
    """BFCL's `multi_turn_checker`, its code unchanged, run with an executor that answers the calls in
    `answers` ({id of a step's call list: {index in it: output}}) with their output instead of
    `eval`ing them; every other call runs through BFCL's own `execute_multi_turn_func_call`."""
    checker, utils = _checker_modules()
    function = checker.multi_turn_checker
    if not answers:
        return function
    execute = utils.execute_multi_turn_func_call

    def execute_answering(func_call_list, **kwargs):
        answered = answers.get(id(func_call_list))
        if not answered:
            return execute(func_call_list, **kwargs)
        results, instances = execute([], **kwargs)  # builds (or finds) the checker's instances
        for index, call in enumerate(func_call_list):
            if index in answered:
                results.append(answered[index])
            else:
                outputs, instances = execute([call], **kwargs)
                results.extend(outputs)
        return results, instances

    scope = {**vars(checker), "execute_multi_turn_func_call": execute_answering}
    return types.FunctionType(function.__code__, scope, function.__name__, function.__defaults__)


def check_calls(
    task: BfclTask,
    calls: Sequence[Sequence[Sequence[str]]],
    model_name: str,
    answered: dict[tuple[int, int, int], str] | None = None,
) -> dict:
    """BFCL's verdict on recorded calls (turn -> step -> call strings); frees the checker's cache.

    `answered`: {(turn, step, call): output} of the calls the env refused to run; the checker gets
    them as they are, and that output instead of running them."""
    if len(calls) != len(task.ground_truth):
        return {
            "valid": False,
            "error_type": "multi_turn:force_terminated",
            "error_message": f"{len(calls)} turns played of {len(task.ground_truth)}",
        }
    decoded = [[list(step) for step in turn] for turn in calls]
    answers: dict[int, dict[int, str]] = {}
    for (turn, step, index), output in (answered or {}).items():
        answers.setdefault(id(decoded[turn][step]), {})[index] = output
    try:
        result = _answering_checker(answers)(
            decoded,
            [list(t) for t in task.ground_truth],
            copy.deepcopy(task.entry),
            f"multi_turn_{task.category}",
            model_name,
        )
    except Exception as exc:
        raise EnvError(f"{task.id}: BFCL's checker failed: {exc!r}") from exc
    finally:
        free_checker_cache(model_name, task.id)
    return result


# --- the environment -------------------------------------------------------------------


def build_backends(task: BfclTask) -> dict[str, object]:
    """Fresh backend instances for `task`, loaded from its initial_config as BFCL loads them."""
    _, config = _bfcl()
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
            prompt = _bfcl()[0].DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
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
