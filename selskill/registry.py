"""The benchmarks selskill plays, registered by name (the recipe's `benchmark`).

A benchmark is a plugin package, `selskill/benchmarks/<name>/` for the built-in ones or any
installed package that declares an entry point in the `selskill.benchmarks` group. Its
`__init__` registers one `Benchmark`, and everything the core needs of it is a field of
that record: the core (config, data, agent, policy, skills, stages, train, report, cli)
imports no benchmark package and branches on no benchmark name, so a new benchmark is one
folder. `make lint` enforces it: nothing outside a benchmark package imports one.

This module sits below every layer that asks for a benchmark (the recipe parser asks for
its sections, the metrics for its step measure, the report for its words) and imports none
of them: a plugin is found by its module name, when first asked for, and the fields that
need the plugin's heavier parts (its environment, episode hooks, init builder) are
callables that import them only when called. A plugin's `__init__` therefore stays light:
its recipe section and this record.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from selskill.errors import declare_extra, require_modules

if TYPE_CHECKING:  # the protocols sit above the registry, with the agent that steps an env; annotations only
    from selskill.envs.base import Env, TaskIndex

# the package whose sub-packages are the benchmarks that ship with selskill (each one a plugin); installed
# plugins add theirs through ENTRY_POINT_GROUP
BUILTIN_PACKAGE = "selskill.benchmarks"
ENTRY_POINT_GROUP = "selskill.benchmarks"


def builtin() -> tuple[str, ...]:
    """The modules of the built-in plugins: every sub-package of BUILTIN_PACKAGE, by name."""
    package = importlib.import_module(BUILTIN_PACKAGE)
    return tuple(f"{BUILTIN_PACKAGE}.{m.name}" for m in pkgutil.iter_modules(package.__path__) if m.ispkg)


# the recipe's default `benchmark`, and that of recorded rows that name none: the built-in plugins' package
# names it (`DEFAULT`), as no code of the core may
DEFAULT_BENCHMARK: str = importlib.import_module(BUILTIN_PACKAGE).DEFAULT


@dataclass(frozen=True)
class StepMeasure:
    """What one step of an episode is: Avg. Steps and the label stage's efficiency rule both use it."""

    episode: str  # rollout / fork column of a whole episode's steps
    after_branch: str  # fork column of the steps from the branch turn on
    what: str  # in words, for reports


@dataclass(frozen=True)
class Wording:
    """How reports and summaries speak of a benchmark."""

    tasks: str = "tasks"  # what the round summary calls its tasks
    task_type: str = "task type"  # what a per-type table groups by
    step_gap: str = "agent"  # "chosen - rejected <step_gap> steps"
    steps: str = "agent steps: actions, skill calls and malformed turns"  # what a step is, in a sentence
    description: str = ""  # one sentence under a report's title ("" : none)


@dataclass(frozen=True)
class Benchmark:
    """What the core needs of one benchmark.

    `run` below is the parsed run section; the benchmark's own recipe section (one of
    `sections`, the one its `settings` names) is `run.benchmark_settings`. Its task index and
    its environment are `selskill.envs.base.TaskIndex` and `Env`.
    """

    name: str
    steps: StepMeasure
    # the task splits its recipe may name (`sample_split`, `eval_splits`), from its settings
    splits: Callable[[Any], tuple[str, ...]]
    held_out: tuple[str, ...]  # what `eval_splits` evaluates when the recipe leaves it empty
    task_index: Callable[[Any, str], TaskIndex]  # (run, split) -> the tasks of one split
    # what the tasks of one split are made of (file hashes, package versions): a stage records it, so
    # regenerated or edited tasks are refused like a changed recipe (selskill.data.manifest)
    identity: Callable[[Any, str], dict]
    # index -> a picklable env factory: episodes may run in a child process
    env_factory: Callable[[TaskIndex], Callable[[], Env]]
    skills: Callable[[], Any]  # its shipped SkillLibrary
    turn_format: Callable[[Any, Any], Any]  # (rollout section, settings) -> its TurnFormat
    settings: type | None = None  # its recipe section (a dataclass, keys prefixed by its name), if any
    # the episode hooks (selskill.agent.hooks.EpisodeHooks) its host plays with; None: the default ones
    hooks: Callable[[], Any] | None = None
    # the init builder (recipe, policy_dir, tokenizer/format...) `selskill init` runs when no model is named
    build_init: Callable[..., Any] | None = None
    # the demonstrations that fine-tune a given model (`init_sft`): the same arguments as `build_init`,
    # returning a `selskill.sft.demos.DemoSource`
    init_demos: Callable[..., Any] | None = None
    # one-off data the recipe needs before any stage plays (ALFWorld generates its games)
    prepare: Callable[[Any, Sequence[str]], None] | None = None
    # `selskill eval --games DIR`: an index over a directory of tasks, where the env has them
    index_from_dir: Callable[[Any, str, str], TaskIndex] | None = None
    # recipe rules that span sections (`{section class name: section}`); raises ValueError
    check_recipe: Callable[[dict], None] | None = None
    # its turns are non-thinking by rule: the chat template is told so (`enable_thinking`) even in compact turns
    states_thinking: bool = False
    # `selskill bench retrieval` on it: the class of its own options there (its flags, and its labelled
    # reference episodes: `selskill.skills.retrieval_bench.RetrievalOptions`), imported when asked for
    retrieval: Callable[[], type] | None = None
    # `selskill` sub-commands of its own (selskill.cli's Command shape), and `selskill bench` ones
    commands: Callable[[], Sequence[Any]] = lambda: ()
    bench_commands: Callable[[], Sequence[Any]] = lambda: ()
    wording: Wording = Wording()
    # what it needs beyond selskill's base install: the top-level modules it plays with, and the selskill extra
    # that installs them (None: `pip install <module>`); checked before it plays, and named by any error that
    # finds one missing
    requires: tuple[str, ...] = ()
    extra: str | None = None
    # the hub license id of its tasks' data: an exported round's dataset card carries it (export-pairs --license
    # overrides)
    data_license: str = "unknown"


_REGISTRY: dict[str, Benchmark] = {}
_SOURCES: dict[str, str] = {}  # benchmark name -> what registered it (`source`)
_ENTRY_POINTS: dict[str, str] = {}  # module -> the installed entry point that names it
_discovered = False


def register(spec: Benchmark) -> Benchmark:
    """Make `spec` a benchmark recipes can name (a plugin's `__init__` calls it on import).

    A name is one benchmark: a second plugin that takes it is refused with both named, since
    the recipe's `benchmark:` would otherwise play whichever was imported last. The module
    that registered it again (a reload) replaces it."""
    caller = inspect.currentframe().f_back
    module = caller.f_globals.get("__name__", "?") if caller is not None else "?"
    where = f"{module} (entry point {_ENTRY_POINTS[module]})" if module in _ENTRY_POINTS else module
    first = _SOURCES.get(spec.name, where)
    if first != where:
        raise ValueError(
            f"two plugins register the benchmark {spec.name!r}: {first} and {where}; uninstall one of them "
            "or rename its benchmark"
        )
    _REGISTRY[spec.name], _SOURCES[spec.name] = spec, where
    if spec.extra is not None:
        declare_extra(spec.extra, spec.requires)
    return spec


def source(name: str) -> str:
    """The module that registered benchmark `name` (and its entry point, for an installed plugin)."""
    benchmark(name)
    return _SOURCES[name]


def _discover() -> None:
    """Import the built-in plugins and those installed under ENTRY_POINT_GROUP, once."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    shipped = builtin()
    for module in shipped:
        importlib.import_module(module)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.value in shipped:
            continue
        _ENTRY_POINTS[ep.value] = ep.name
        try:
            importlib.import_module(ep.value)
        except ImportError as exc:
            raise ImportError(
                f"benchmark plugin {ep.name} ({ep.value}, an installed `{ENTRY_POINT_GROUP}` entry point) does not "
                f"import: {exc}; install what it needs or uninstall it"
            ) from exc


def names() -> tuple[str, ...]:
    """Every registered benchmark, built-in ones first."""
    _discover()
    return tuple(_REGISTRY)


def benchmark(name: str) -> Benchmark:
    _discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(_REGISTRY)}") from None


def playable(name: str) -> Benchmark:
    """Benchmark `name`, the modules it plays with checked: a missing one is said in one line with its install."""
    spec = benchmark(name)
    require_modules(f"benchmark {name}", spec.requires, spec.extra)
    return spec


def benchmark_of_index(index: TaskIndex) -> Benchmark:
    """The benchmark whose task index `index` is."""
    return benchmark(index.benchmark)


def wording_of(name: str) -> Wording:
    """How to speak of benchmark `name`; the plain words where it is not installed here (a report
    may read a run made elsewhere)."""
    try:
        return benchmark(name).wording
    except ValueError:
        return Wording()


def settings_sections() -> tuple[type, ...]:
    """Every registered benchmark's recipe section (each recipe parses them all, and checks its own)."""
    return tuple(b.settings for b in (benchmark(n) for n in names()) if b.settings is not None)


def step_measure(name: str) -> StepMeasure:
    """How benchmark `name` counts steps (its plugin is the only place that decides it)."""
    return benchmark(name).steps


__all__ = [
    "BUILTIN_PACKAGE",
    "DEFAULT_BENCHMARK",
    "ENTRY_POINT_GROUP",
    "Benchmark",
    "StepMeasure",
    "Wording",
    "benchmark",
    "benchmark_of_index",
    "builtin",
    "names",
    "playable",
    "register",
    "settings_sections",
    "source",
    "step_measure",
    "wording_of",
]
