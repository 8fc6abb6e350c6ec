"""The environments the core plays, registered by name (the recipe's `run.benchmark`).

The stages ask a `Benchmark` for everything that differs between environments instead of
branching on the name, so a third environment is one `register` call here (plus its init
builder in `selskill.init.builders` and its `StepMeasure` in `selskill.metrics`) and no
change in `selskill.stages`. A spec lives in `agent` because it ties an env to its skills,
its turn format and its episode host; `envs` knows none of those. The init builders stay
in `selskill.init` because `init` sits above `agent` and trains with torch, which a spec
must not import. The step measure stays in `selskill.metrics` (below `envs`), which the
report reads without importing any environment.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from selskill.agent.alfworld import AlfworldTurnFormat
from selskill.agent.runner import EpisodeRunner
from selskill.agent.turn_format import TurnFormat
from selskill.config.names import BENCHMARKS
from selskill.config.rollout import GamesConfig, RolloutConfig
from selskill.config.run import RunConfig
from selskill.envs.alfworld import AlfworldEnv, GameIndex, find_games
from selskill.envs.bfcl import BfclTaskIndex
from selskill.metrics import StepMeasure, step_measure
from selskill.skills import SkillLibrary, load_alfworld_skills, load_bfcl_skills

DEFAULT_BENCHMARK = "alfworld"  # RunConfig.benchmark's default: rows and summaries that name none


@dataclass(frozen=True)
class Benchmark:
    """What the core needs of one environment.

    A task index has `games` (records with `task_id` `<split>/<id>` and `task_type`),
    `by_id()`, `skipped`, `patched` and `summary()`; `index_type` is its class, which is how
    `make_runner` knows the benchmark of an index it is handed.
    """

    name: str
    index_type: type
    task_index: Callable[[RunConfig, str], Any]  # the tasks of one split of the recipe
    # what the tasks of one split are made of (file hashes, package versions): a stage records it, so
    # regenerated or edited tasks are refused like a changed recipe (selskill.data.manifest)
    identity: Callable[[RunConfig, str], dict]
    env_factory: Callable[[Any], Callable[[], Any]]  # picklable: episodes may run in a child process
    skills: Callable[[], SkillLibrary]
    turn_format: Callable[[RolloutConfig], TurnFormat]
    runner_class: Callable[[], type[EpisodeRunner]] = lambda: EpisodeRunner  # its episode host
    task_noun: str = "tasks"  # what the round summary calls its tasks
    # one-off data the recipe needs before any stage plays (ALFWorld generates its games)
    prepare: Callable[[RunConfig, GamesConfig, Sequence[str]], None] | None = None
    # `selskill eval --games DIR`: an index over a directory of tasks, where the env has them
    index_from_dir: Callable[[RunConfig, str, str], Any] | None = None
    # metrics.json names the benchmark and its step measure; ALFWorld's predates both and keeps its keys
    tags_metrics: bool = True

    @property
    def steps(self) -> StepMeasure:
        return step_measure(self.name)


_REGISTRY: dict[str, Benchmark] = {}


def register(spec: Benchmark) -> Benchmark:
    if spec.name not in BENCHMARKS:
        raise ValueError(f"benchmark {spec.name!r} is not in config.names.BENCHMARKS, which recipes check")
    _REGISTRY[spec.name] = spec
    return spec


def benchmark(name: str = DEFAULT_BENCHMARK) -> Benchmark:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(_REGISTRY)}") from None


def benchmark_of_index(index) -> Benchmark:
    for spec in _REGISTRY.values():
        if isinstance(index, spec.index_type):
            return spec
    raise TypeError(f"no registered benchmark indexes its tasks as {type(index).__name__}")


# --- ALFWorld -------------------------------------------------------------------------------


def _alfworld_index_from_dir(run: RunConfig, root: str | None, split: str):
    return find_games(root, splits=split, grammar=run.alfworld_grammar)


def _alfworld_index(run: RunConfig, split: str):
    """The recipe's games (`root` None: real data from $ALFWORLD_DATA)."""
    return _alfworld_index_from_dir(run, None if run.use_alfworld_data else run.games_dir, split)


def _alfworld_identity(run: RunConfig, split: str) -> dict:
    """The hashes of the split's game files: generated games keep their manifest beside them, real data
    (which selskill does not own) under runs_dir."""
    from selskill.data.manifest import content_identity, file_hashes, manifest_store
    from selskill.envs.alfworld import data_root, game_files

    if run.use_alfworld_data:
        base = data_root(None)
        store = manifest_store(run.runs_dir, f"alfworld-{split}", base / split)
    else:
        base = data_root(run.games_dir)
        store = base / f".manifest-{split}.json"
    return content_identity(file_hashes(game_files(base, split), store))


def _alfworld_env_factory(index):
    return functools.partial(AlfworldEnv, index)


def _alfworld_turn_format(rollout: RolloutConfig) -> TurnFormat:
    return AlfworldTurnFormat(
        style=rollout.turn_style,
        show_admissible_commands=rollout.turn_show_admissible,
        admissible_style=rollout.turn_admissible,
        task_reminder=rollout.turn_task_reminder,
    )


def _alfworld_prepare(run: RunConfig, games: GamesConfig, splits: Sequence[str]) -> None:
    """Generate the recipe's games once (nothing for real data, or when already present)."""
    if run.use_alfworld_data:
        return
    from pathlib import Path

    from selskill.envs.alfworld_gen import check_generator_version, generate_games

    check_generator_version(run.games_dir)
    for split in splits:
        per_type = games.per_type(split)
        marker = Path(run.games_dir) / f".{split}-{games.games_size}-{per_type}-{games.games_seed}.done"
        if per_type <= 0 or marker.exists():
            continue
        generate_games(
            run.games_dir,
            per_type=per_type,
            seed=games.games_seed,
            split=split,
            size=games.games_size,
            progress=True,
        )
        marker.write_text("ok\n")
        _alfworld_identity(run, split)  # hashed now, once, rather than by every rank of the first stage


# --- BFCL multi-turn ------------------------------------------------------------------------


def _bfcl_index(run: RunConfig, split: str):
    """Split `split` ("train" | "test") of the recipe's BFCL categories, by scenario index."""
    from selskill.envs.bfcl import task_index

    if split not in run.splits:
        raise ValueError(f"unknown BFCL split {split!r}; choose from {', '.join(run.splits)}")
    return task_index(split, run.categories, run.bfcl_split(split), run.bfcl_withheld_callable)


def _bfcl_identity(run: RunConfig, split: str) -> dict:
    """bfcl-eval's version (its backends and checker) and the hashes of the data files of the recipe's
    categories (the same for both splits)."""
    from selskill.data.manifest import content_identity, file_hashes, manifest_store
    from selskill.envs.bfcl import data_files, installed_version

    files = data_files(run.categories)
    store = manifest_store(run.runs_dir, "bfcl-eval", next(iter(files.values())).parent)
    return {"bfcl-eval": installed_version(), **content_identity(file_hashes(files, store))}


def _bfcl_turn_format(rollout: RolloutConfig) -> TurnFormat:
    from selskill.agent.bfcl import BfclTurnFormat

    return BfclTurnFormat(
        show_admissible_commands=rollout.turn_show_admissible,
        doc_style=rollout.turn_doc_style,
        examples=rollout.turn_examples,
    )


def _bfcl_runner_class() -> type[EpisodeRunner]:
    from selskill.agent.bfcl import BfclEpisodeRunner

    return BfclEpisodeRunner


register(
    Benchmark(
        name="alfworld",
        index_type=GameIndex,
        task_index=_alfworld_index,
        identity=_alfworld_identity,
        env_factory=_alfworld_env_factory,
        skills=load_alfworld_skills,
        turn_format=_alfworld_turn_format,
        task_noun="games",
        prepare=_alfworld_prepare,
        index_from_dir=_alfworld_index_from_dir,
        tags_metrics=False,
    )
)
register(
    Benchmark(
        name="bfcl",
        index_type=BfclTaskIndex,
        task_index=_bfcl_index,
        identity=_bfcl_identity,
        env_factory=lambda index: index.env_factory(),
        skills=load_bfcl_skills,
        turn_format=_bfcl_turn_format,
        runner_class=_bfcl_runner_class,
    )
)

__all__ = ["DEFAULT_BENCHMARK", "Benchmark", "benchmark", "benchmark_of_index", "register"]
