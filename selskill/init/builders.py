"""The init builder of each built-in benchmark, as its plugin's `build_init` calls it. A builder
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


def build_alfworld_init(
    recipe: Recipe, out: Path, *, fmt: TurnFormat, train_tasks: Callable[[int], list[str]], library, retriever
) -> Path:
    from selskill.init.alfworld import build_init_policy
    from selskill.init.demos import DemoPrompts

    return build_init_policy(
        out,
        games_dir=recipe.settings.games_dir,
        seed=recipe.seed,
        demos=recipe.init.alfworld_demos(),
        training=recipe.init.training(),
        dagger=recipe.init.dagger(recipe.rollout.action_choice),
        prompts=DemoPrompts(fmt, recipe.rollout.listing_style, library, retriever),
    )


def build_bfcl_init(
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
