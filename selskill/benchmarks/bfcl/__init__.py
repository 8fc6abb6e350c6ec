"""BFCL multi-turn as a selskill benchmark: bfcl-eval's shipped data, backends and checker.

The plugin's recipe section is `config.BfclConfig` (the `bfcl_*` keys and BFCL's turn
format); its episodes play with `episode.BfclHooks`. Only this module and `config.py` load
when a recipe is parsed; bfcl-eval loads when a task index is first built.
"""

from __future__ import annotations

from selskill.benchmarks.bfcl.config import SPLITS, BfclConfig
from selskill.config.checks import bad_value
from selskill.registry import Benchmark, StepMeasure, Wording, register


def _task_index(run, split: str):
    """Split `split` ("train" | "test") of the recipe's BFCL categories, by scenario index."""
    from selskill.benchmarks.bfcl.env import task_index

    bfcl = run.benchmark_settings
    if split not in SPLITS:
        raise ValueError(f"unknown BFCL split {split!r}; choose from {', '.join(SPLITS)}")
    return task_index(split, bfcl.categories, bfcl.split(split), bfcl.bfcl_withheld_callable)


def _identity(run, split: str) -> dict:
    """bfcl-eval's version (its backends and checker) and the hashes of the data files of the recipe's
    categories (the same for both splits)."""
    from selskill.benchmarks.bfcl.env import data_files, installed_version
    from selskill.data.manifest import content_identity, file_hashes, manifest_store

    files = data_files(run.benchmark_settings.categories)
    store = manifest_store(run.runs_dir, "bfcl-eval", next(iter(files.values())).parent)
    return {"bfcl-eval": installed_version(), **content_identity(file_hashes(files, store))}


def _turn_format(rollout, settings: BfclConfig):
    from selskill.benchmarks.bfcl.episode import BfclTurnFormat

    settings = settings if settings is not None else BfclConfig()
    return BfclTurnFormat(
        show_admissible_commands=rollout.turn_show_admissible,
        doc_style=settings.turn_doc_style,
        examples=settings.turn_examples,
    )


def load_bfcl_skills():
    """The skill library shipped with this plugin (bfcl-eval 2026.3.23 backends)."""
    from importlib import resources

    from selskill.skills import load_skills

    return load_skills(resources.files(__name__) / "skills")


def _hooks():
    from selskill.benchmarks.bfcl.episode import BfclHooks

    return BfclHooks()


def _check_recipe(sections: dict) -> None:
    rollout = sections.get("RolloutConfig")
    if rollout is not None and rollout.action_choice != "free":
        raise bad_value(
            "action_choice",
            rollout.action_choice,
            "free with benchmark: bfcl",
            "admissible-action decoding needs a finite list of complete commands; a BFCL action is a call "
            "list whose arguments are open-ended literals, and BFCL's admissible commands are function names only",
        )
    if rollout is not None and rollout.turn_style != "compact":
        raise bad_value(
            "turn_style",
            rollout.turn_style,
            "compact with benchmark: bfcl",
            "BFCL turns are non-thinking (the paper's App. G)",
        )


def _retrieval():
    from selskill.benchmarks.bfcl.retrieval_bench import BfclRetrieval

    return BfclRetrieval


def _bench_commands():
    from selskill.benchmarks.bfcl.commands import BENCH_COMMANDS

    return BENCH_COMMANDS


def _build_init(recipe, out, **resolved):
    from selskill.benchmarks.bfcl.init_policy import build_from_recipe

    return build_from_recipe(recipe, out, **resolved)


def _init_demos(recipe, **resolved):
    from selskill.benchmarks.bfcl.init_policy import demos_from_recipe

    return demos_from_recipe(recipe, **resolved)


BENCHMARK = register(
    Benchmark(
        name="bfcl",
        steps=StepMeasure(
            "env_steps",
            "env_steps_after_branch",
            "function-call steps (call lists; an executable skill's calls)",
        ),
        splits=lambda settings: SPLITS,
        held_out=("test",),
        task_index=_task_index,
        identity=_identity,
        env_factory=lambda index: index.env_factory(),
        skills=load_bfcl_skills,
        turn_format=_turn_format,
        settings=BfclConfig,
        hooks=_hooks,
        build_init=_build_init,
        init_demos=_init_demos,
        retrieval=_retrieval,
        check_recipe=_check_recipe,
        bench_commands=_bench_commands,
        states_thinking=True,
        wording=Wording(
            task_type="BFCL category",
            step_gap="function-call",
            steps="function-call steps: a call list is one step, an executable skill costs the calls it sends, "
            "ending a user turn and memory skills cost none",
            description="Benchmark: BFCL multi-turn (bfcl-eval's shipped data, backends and checker); SR is BFCL's "
            'checker, Exec. Prec. whether a skill call ran (docs/design.md, "Exec. Prec. on BFCL").',
        ),
        data_license="apache-2.0",  # bfcl-eval's data (the Gorilla project)
        # bfcl-eval itself is installed apart, without its dependencies (env.py's `_bfcl` says so when it is missing)
        requires=("mpmath",),
        extra="bfcl",
    )
)
