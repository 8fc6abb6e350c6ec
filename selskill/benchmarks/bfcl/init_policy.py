"""The offline BFCL init policy: train-split ground truth -> demonstrations -> tokenizer -> tiny Qwen3 -> SFT.

What `make round RECIPE=recipes/bfcl_tiny.yaml` builds at `runs/<exp>/round_0/train/model` when
the recipe has no model. It is the ALFWorld init (`selskill.benchmarks.alfworld.init_policy`) with BFCL's
demonstration source (`selskill.benchmarks.bfcl.demos`): the same tokenizer, model and TRL SFT
(`train_tokenizer`, `build_model`, `sft_train`), the same `init_manifest.json` + `COMPLETED`
contract (a second call with the same settings returns at once; other settings are refused
unless `redo`), and the same two phases. One difference: phase 1 keeps the system prompt,
since on BFCL it holds the task's function docs, the names and arguments the calls copy.
Demonstrations come only from the train split's scenarios (the split is by scenario index,
so no test scenario's variant is ever demonstrated). No DAgger.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from selskill.benchmarks.bfcl import load_bfcl_skills
from selskill.benchmarks.bfcl.demos import BFCL_PROMPTS, bfcl_tokenizer_corpus, build_bfcl_demos
from selskill.benchmarks.bfcl.init_config import BfclDemoMix
from selskill.config.init import InitTraining
from selskill.policy.bootstrap import train_tokenizer
from selskill.sft.build import (
    TrainedDemos,
    build_listings,
    reuse_or_start,
    save_init_policy,
    settings_record,
    timed,
    train_init_model,
    training_record,
)
from selskill.sft.demos import DemoPrompts, DemoSource

MANIFEST_VERSION = 2


@dataclass(frozen=True)
class BfclTrainTasks:
    """The train tasks a BFCL init demonstrates: the train split's `scenarios` (`RunConfig.bfcl_split
    ("train")`) in `categories`, or only `task_ids` (`train/<BFCL id>`) of them."""

    categories: tuple[str, ...]
    scenarios: Sequence[int]
    withheld_callable: bool = True
    task_ids: Sequence[str] | None = None

    def record(self) -> dict:
        """The manifest's keys of these tasks."""
        return {
            "categories": list(self.categories),
            "scenarios": list(self.scenarios),
            "withheld_callable": self.withheld_callable,
            "task_ids": list(self.task_ids) if self.task_ids is not None else None,
        }

    def env(self):
        from selskill.benchmarks.bfcl.env import BfclEnv

        return BfclEnv(
            self.categories,
            scenarios=self.scenarios,
            withheld_callable=self.withheld_callable,
            id_prefix="train/",
        )


def _demo_settings(tasks: BfclTrainTasks, seed: int, mix: BfclDemoMix, prompts: DemoPrompts) -> dict:
    """The settings that decide the demonstrations: the tasks, the mix, the prompts."""
    return settings_record(version=MANIFEST_VERSION, env="bfcl", **tasks.record(), seed=seed, mix=mix,
                           fmt=prompts.fmt, listing_style=prompts.listing_style)  # fmt: skip


def _play_demos(tasks: BfclTrainTasks, seed: int, mix: BfclDemoMix, prompts: DemoPrompts, timings: dict):
    """The ground truth's winning demonstrations of `tasks`; no winning one is an error."""
    with timed(timings, "demos_seconds"):
        env = tasks.env()
        ids = list(tasks.task_ids) if tasks.task_ids is not None else env.task_ids()
        report = build_bfcl_demos(env, prompts=prompts, mix=mix, seed=seed, task_ids=ids)
    if not report.demos:
        raise RuntimeError(f"no winning demonstration from {len(ids)} BFCL tasks: {dict(report.dropped)}")
    return report


def build_bfcl_init_policy(
    out_dir: str | Path,
    *,
    tasks: BfclTrainTasks,
    seed: int = 42,
    mix: BfclDemoMix | None = None,
    training: InitTraining | None = None,
    prompts: DemoPrompts = BFCL_PROMPTS,
    progress: bool = True,
    redo: bool = False,
) -> Path:
    """Build (or reuse) the BFCL init policy at `out_dir`; returns `out_dir`.

    Demonstrates `tasks` with `mix`, then trains as `training` says. `prompts` are the rounds'
    (`build_from_recipe`; default: every one of the 18 BFCL skills listed): the
    demonstrations list as they will.
    """
    out_dir = Path(out_dir)
    stage_dir = out_dir.parent
    mix, training = mix or BfclDemoMix(), training or InitTraining()
    settings = {**_demo_settings(tasks, seed, mix, prompts), **settings_record(**training_record(training))}
    listings = build_listings(settings, load_bfcl_skills(), prompts)
    if reuse_or_start(out_dir, stage_dir, settings, redo):
        return out_dir
    timings: dict[str, float] = {}
    t_all = time.perf_counter()
    report = _play_demos(tasks, seed, mix, prompts, timings)
    with timed(timings, "tokenizer_seconds"):
        tokenizer = train_tokenizer(
            bfcl_tokenizer_corpus(report.demos, listings.library), vocab_size=training.vocab_size
        )
    trained = TrainedDemos.of(report, tokenizer, training.sft.max_length)
    if not trained.kept:
        raise RuntimeError(
            f"every demonstration is longer than init_max_length={training.sft.max_length} tokens"
        )
    work = stage_dir / "sft"
    with timed(timings, "train_seconds"):
        # phase 1 keeps the system prompt: it holds the task's function docs, which the calls copy
        model, train_stats = train_init_model(
            tokenizer, trained.kept, training, work, seed=seed, progress=progress, drop_system=False
        )
    return save_init_policy(out_dir, model, tokenizer, work=work, demos=trained, settings=settings,
                            train=train_stats, timings=timings, t_all=t_all)  # fmt: skip


def _recipe_tasks(recipe, train_tasks: Callable[[int], list[str]]) -> BfclTrainTasks:
    """The first `init_bfcl_tasks` train tasks in the sample stage's order."""
    bfcl = recipe.settings
    return BfclTrainTasks(
        categories=bfcl.categories,
        scenarios=bfcl.split("train"),
        withheld_callable=bfcl.bfcl_withheld_callable,
        task_ids=train_tasks(bfcl.init_bfcl_tasks),
    )


def build_from_recipe(
    recipe, out: Path, *, fmt, train_tasks: Callable[[int], list[str]], library, retriever
) -> Path:
    """The init policy the recipe asks for (what the plugin's `build_init` runs): the first
    `init_bfcl_tasks` train tasks in the sample stage's order, with the rounds' `fmt`, `library`, `retriever`."""
    tasks = _recipe_tasks(recipe, train_tasks)
    return build_bfcl_init_policy(
        out,
        tasks=tasks,
        seed=recipe.seed,
        mix=recipe.settings.bfcl_demo_mix(),
        training=recipe.init.training(),
        prompts=DemoPrompts(fmt, recipe.rollout.listing_style, library, retriever),
    )


def demos_from_recipe(
    recipe, *, fmt, train_tasks: Callable[[int], list[str]], library, retriever
) -> DemoSource:
    """The demonstrations `init_sft` fine-tunes a given model on (what the plugin's `init_demos` runs):
    those `build_from_recipe` trains its own model on."""
    tasks, seed, mix = _recipe_tasks(recipe, train_tasks), recipe.seed, recipe.settings.bfcl_demo_mix()
    prompts = DemoPrompts(fmt, recipe.rollout.listing_style, library, retriever)
    settings = _demo_settings(tasks, seed, mix, prompts)
    build_listings(settings, load_bfcl_skills(), prompts)
    return DemoSource(settings, lambda progress, timings: _play_demos(tasks, seed, mix, prompts, timings))


__all__ = ["BfclTrainTasks", "build_bfcl_init_policy", "build_from_recipe", "demos_from_recipe"]
