"""ALFWorld as a selskill benchmark: text households on alfworld's real TextWorld/PDDL engine.

Generated games (`generate.py`, the offline default) or real data from `$ALFWORLD_DATA`; the
plugin's recipe section is `config.AlfworldConfig`. Only this module and `config.py` load when
a recipe is parsed; the engine, turn format, init builder and commands load when first used.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

from selskill.benchmarks.alfworld.config import HELD_OUT, KNOWN_SPLITS, SPLITS, AlfworldConfig
from selskill.registry import Benchmark, StepMeasure, Wording, register


def _index_from_dir(run, root: str | None, split: str):
    from selskill.benchmarks.alfworld.env import find_games

    return find_games(root, splits=split, grammar=run.benchmark_settings.alfworld_grammar)


def _task_index(run, split: str):
    """The recipe's games (`root` None: real data from $ALFWORLD_DATA)."""
    games = run.benchmark_settings
    return _index_from_dir(run, None if games.use_alfworld_data else games.games_dir, split)


def _identity(run, split: str) -> dict:
    """The hashes of the split's game files: generated games keep their manifest beside them, real data
    (which selskill does not own) under runs_dir."""
    from selskill.benchmarks.alfworld.env import data_root, game_files
    from selskill.data.manifest import content_identity, file_hashes, manifest_store

    if run.benchmark_settings.use_alfworld_data:
        base = data_root(None)
        store = manifest_store(run.runs_dir, f"alfworld-{split}", base / split)
    else:
        base = data_root(run.benchmark_settings.games_dir)
        store = base / f".manifest-{split}.json"
    return content_identity(file_hashes(game_files(base, split), store))


def _env_factory(index):
    from selskill.benchmarks.alfworld.env import AlfworldEnv

    return functools.partial(AlfworldEnv, index)


def _turn_format(rollout, settings):
    from selskill.benchmarks.alfworld.turn_format import AlfworldTurnFormat

    return AlfworldTurnFormat(
        style=rollout.turn_style,
        show_admissible_commands=rollout.turn_show_admissible,
        admissible_style=rollout.turn_admissible,
        task_reminder=rollout.turn_task_reminder,
    )


def load_alfworld_skills():
    """The skill library shipped with this plugin (alfworld 0.4.2 command grammar)."""
    from importlib import resources

    from selskill.skills import load_skills

    return load_skills(resources.files(__name__) / "skills")


def _prepare(run, splits: Sequence[str]) -> None:
    """Generate the recipe's games once (nothing for real data, or when already present)."""
    games = run.benchmark_settings
    if games.use_alfworld_data:
        return
    from pathlib import Path

    from selskill.benchmarks.alfworld.generate import check_generator_version, generate_games

    check_generator_version(games.games_dir)
    for split in (s for s in splits if s in SPLITS):  # real data's own splits are never generated
        per_type = games.per_type(split)
        marker = Path(games.games_dir) / f".{split}-{games.games_size}-{per_type}-{games.games_seed}.done"
        if per_type <= 0 or marker.exists():
            continue
        generate_games(
            games.games_dir,
            per_type=per_type,
            seed=games.games_seed,
            split=split,
            size=games.games_size,
            progress=True,
        )
        marker.write_text("ok\n")
        _identity(run, split)  # hashed now, once, rather than by every rank of the first stage


def _check_recipe(sections: dict) -> None:
    if os.environ.get("ALFWORLD_DATA", None) == "":
        # alfworld itself would stop on `mkdir('')` with "No such file or directory: ''"
        raise ValueError(
            "ALFWORLD_DATA is set but empty: unset it (`unset ALFWORLD_DATA`; generated games need none) or set "
            "it to a copy of the ALFWorld data"
        )


def _hooks():
    from selskill.benchmarks.alfworld.episode import AlfworldHooks

    return AlfworldHooks()


def _commands():
    from selskill.benchmarks.alfworld.commands import COMMANDS

    return COMMANDS


def _bench_commands():
    from selskill.benchmarks.alfworld.commands import BENCH_COMMANDS

    return BENCH_COMMANDS


def _retrieval():
    from selskill.benchmarks.alfworld.retrieval_bench import AlfworldRetrieval

    return AlfworldRetrieval


def _build_init(recipe, out, **resolved):
    from selskill.benchmarks.alfworld.init_policy import build_from_recipe

    return build_from_recipe(recipe, out, **resolved)


def _init_demos(recipe, **resolved):
    from selskill.benchmarks.alfworld.init_policy import demos_from_recipe

    return demos_from_recipe(recipe, **resolved)


BENCHMARK = register(
    Benchmark(
        name="alfworld",
        steps=StepMeasure(
            "n_turns", "steps_after_branch", "agent steps (actions, skill calls, malformed turns)"
        ),
        splits=lambda settings: KNOWN_SPLITS,
        held_out=HELD_OUT,
        task_index=_task_index,
        identity=_identity,
        env_factory=_env_factory,
        skills=load_alfworld_skills,
        turn_format=_turn_format,
        settings=AlfworldConfig,
        hooks=_hooks,
        build_init=_build_init,
        init_demos=_init_demos,
        retrieval=_retrieval,
        prepare=_prepare,
        index_from_dir=_index_from_dir,
        check_recipe=_check_recipe,
        commands=_commands,
        bench_commands=_bench_commands,
        wording=Wording(tasks="games"),
        data_license="mit",  # ALFWorld's and TextWorld's games
        requires=("alfworld", "textworld"),
        extra="alfworld",
    )
)
