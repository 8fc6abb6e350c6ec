"""Which tasks a stage plays: the recipe's benchmark's task index of a split, what its tasks are made of, and
the balanced cut a stage takes of them.

The recipe's `benchmark` picks the environment, and everything a stage needs of its tasks
comes from its spec (`selskill.registry`) through here: `game_index(run, split)` (the env's
task index, `selskill.envs.base.TaskIndex`) and `games_identity(run, splits)` (what those
tasks are made of, recorded as a stage's input). Task ids are `<split>/<id>` in every env.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from selskill.config.run import RunConfig
from selskill.data.stage_stats import StageStats
from selskill.registry import benchmark, benchmark_of_index, playable

logger = logging.getLogger(__name__)


def game_index(run: RunConfig, split: str):
    """The tasks of split `split` of the recipe's benchmark."""
    return playable(run.benchmark).task_index(run, split)


def split_index(run: RunConfig, split: str, games_root: str | None = None):
    """The tasks of `split`: the recipe's, or those of a directory of the env's tasks (`selskill eval --games`)."""
    if games_root is None:
        return game_index(run, split)
    from_dir = playable(run.benchmark).index_from_dir
    if from_dir is None:
        raise ValueError(f"--games names a games directory; benchmark {run.benchmark} has its own tasks")
    return from_dir(run, games_root, split)


def games_identity(run: RunConfig, splits: Sequence[str]) -> dict:
    """What the tasks of each of `splits` are made of, as a stage records it (`StageInputs.games`)."""
    identity = benchmark(run.benchmark).identity
    return {split: identity(run, split) for split in splits}


def ensure_games(run: RunConfig, splits: Sequence[str] | None = None) -> None:
    """The one-off data the recipe's benchmark needs (e.g. generated games) for `splits` (None: every
    split it has), once."""
    spec = playable(run.benchmark)
    if spec.prepare is not None:
        spec.prepare(run, spec.splits(run.benchmark_settings) if splits is None else splits)


def task_texts(index, task_ids: Sequence[str]) -> dict[str, str]:
    """The task each of `task_ids` states at its start (the env's `EnvState.task`, what task
    retrieval reads), from one environment of the index's benchmark reset to each task."""
    env = benchmark_of_index(index).env_factory(index)()
    return {t: env.reset(t).task for t in task_ids}


def balanced_tasks(records, max_tasks: int) -> list[str]:
    """Task ids interleaved across task types (sorted within each), cut at `max_tasks` (0 = all).

    A prefix of a sorted id list would be all one task type; interleaving keeps any cut balanced.
    """
    by_type: dict[str, list[str]] = {}
    for g in sorted(records, key=lambda g: g.task_id):
        by_type.setdefault(g.task_type, []).append(g.task_id)
    out = []
    queues = [by_type[t] for t in sorted(by_type)]
    for i in range(max((len(q) for q in queues), default=0)):
        out += [q[i] for q in queues if i < len(q)]
    return out[:max_tasks] if max_tasks > 0 else out


def record_skipped_games(stats: StageStats | None, index, log: Callable[[str], None] = logger.info) -> None:
    """Games the index skipped (unreadable, unsupported, ...): counted in the stage's stats and said."""
    if not index.skipped:
        return
    if stats is not None:
        stats.count_skipped_games(index.skipped)
    log(f"games: {index.summary()}")


def task_list(
    run: RunConfig, split: str, max_tasks: int, stats: StageStats | None = None
) -> tuple[list[str], object]:
    """(the balanced cut of `max_tasks` tasks of `split`, its task index), the skipped games counted in `stats`."""
    index = game_index(run, split)
    record_skipped_games(stats, index)
    return balanced_tasks(index.games, max_tasks), index
