"""The init builder of each benchmark, by name, as `ensure_init_policy` calls it.

Keyed by the benchmark's name rather than held by its `selskill.agent.benchmarks` spec:
`init` sits above `agent` (it plays and trains), so a spec cannot point at it. A builder
gets what the stage resolved through the spec: the turn format the rounds play with,
`train_tasks(n)`, the first n train task ids in the order the sample stage takes them, and
the library and retriever the rounds' episodes list skills from.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selskill.agent.turn_format import TurnFormat
    from selskill.config import Recipe

Builder = Callable[..., Path]


def _alfworld(
    recipe: Recipe, out: Path, *, fmt: TurnFormat, train_tasks: Callable[[int], list[str]], library, retriever
) -> Path:
    from selskill.init.alfworld import build_init_policy
    from selskill.init.demos import DemoPrompts

    return build_init_policy(
        out,
        games_dir=recipe.run.games_dir,
        seed=recipe.seed,
        demos=recipe.init.alfworld_demos(),
        training=recipe.init.training(),
        dagger=recipe.init.dagger(recipe.rollout.action_choice),
        prompts=DemoPrompts(fmt, recipe.rollout.listing_style, library, retriever),
    )


def _bfcl(
    recipe: Recipe, out: Path, *, fmt: TurnFormat, train_tasks: Callable[[int], list[str]], library, retriever
) -> Path:
    from selskill.init.bfcl import BfclTrainTasks, build_bfcl_init_policy
    from selskill.init.demos import DemoPrompts

    run = recipe.run
    tasks = BfclTrainTasks(
        categories=run.categories,
        scenarios=run.bfcl_split("train"),
        withheld_callable=run.bfcl_withheld_callable,
        task_ids=train_tasks(recipe.init.init_bfcl_tasks),
    )
    return build_bfcl_init_policy(
        out,
        tasks=tasks,
        seed=recipe.seed,
        mix=recipe.init.bfcl_demo_mix(),
        training=recipe.init.training(),
        prompts=DemoPrompts(fmt, recipe.rollout.listing_style, library, retriever),
    )


INIT_BUILDERS: dict[str, Builder] = {"alfworld": _alfworld, "bfcl": _bfcl}


def init_builder(benchmark: str) -> Builder:
    try:
        return INIT_BUILDERS[benchmark]
    except KeyError:
        raise ValueError(
            f"benchmark {benchmark!r} has no init builder; choose from {', '.join(INIT_BUILDERS)}"
        ) from None


__all__ = ["INIT_BUILDERS", "init_builder"]
