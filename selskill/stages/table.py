"""The stage table: a round's stages in order, each a step (`selskill.executors.base.Step`).

Every way of running a round reads this table: `selskill round` / `make round` /
`pipelines/round.py` hand it to the recipe's executor, and `pipelines/<stage>.py` /
`python -m selskill.stages <stage>` run one rank of one entry (what each Slurm array task
runs). The sharded stages' steps live with their stage (`selskill/stages/<stage>.py`); the
two one-job stages are here: init (the games, and in round 1 the starting policy and its
round-0 eval) and train (`selskill.train`, which knows nothing of the stages). A row is the
same whichever executor or entry point computed it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from selskill.config import Recipe, load_recipe
from selskill.config.run import PolicyConfig, RunConfig
from selskill.data.gguf_source import is_gguf_source
from selskill.data.layout import check_model_source, policy_dir, resolve_round_policy, round_dir
from selskill.errors import ExplainedError, run_main
from selskill.executors.base import StageFailed, Step
from selskill.stages.branch import BranchStep
from selskill.stages.evaluate import EvalStep
from selskill.stages.fork import ForkStep
from selskill.stages.label import LabelStep
from selskill.stages.sample import SampleStep

if TYPE_CHECKING:  # the train section imports TRL
    from selskill.config.train import TrainConfig


def ensure_init_policy(recipe: Recipe) -> Path | None:
    """Round 1 without a given model starts from the run's own offline init policy; a given GGUF
    model (a `.gguf` file, or `wheel:<distribution>`) starts from the folder it is converted into;
    with `init_sft` a given model is first fine-tuned on the benchmark's demonstrations into the
    init policy's place (`selskill.stages.init_sft`)."""
    given = recipe.policy.model_name_or_path
    base = None
    if given and is_gguf_source(given):
        from selskill.policy.gguf import ensure_gguf_model

        base = str(ensure_gguf_model(given, recipe.run.runs_dir))
        if not recipe.policy.init_sft:
            return Path(base)
    elif given:
        if not recipe.policy.init_sft:
            return None
        base = check_model_source(given, "model_name_or_path")
    out = policy_dir(recipe.run.runs_dir, recipe.run.exp, 1)
    from selskill.registry import benchmark
    from selskill.stages.runner_setup import retriever, runner_library
    from selskill.stages.task_source import balanced_tasks

    spec = benchmark(recipe.run.benchmark)

    def train_tasks(n: int) -> list[str]:
        # the first n train tasks in the order the sample stage takes them
        return balanced_tasks(spec.task_index(recipe.run, "train").games, n)

    library = runner_library(recipe.rollout, spec.name)
    resolved = dict(
        fmt=spec.turn_format(recipe.rollout, recipe.settings),
        train_tasks=train_tasks,
        library=library,
        retriever=retriever(recipe.rollout, library),
    )
    if base:
        if spec.init_demos is None:
            raise ExplainedError(
                f"benchmark {spec.name} has no demonstrations to fine-tune a model on: drop init_sft and start "
                "from model_name_or_path as it is"
            )
        from selskill.stages.init_sft import sft_from_recipe

        return sft_from_recipe(recipe, out, base, spec.init_demos(recipe, **resolved))
    if spec.build_init is None:
        raise ExplainedError(
            f"benchmark {spec.name} has no init builder: set model_name_or_path to the policy round 1 starts from"
        )
    return spec.build_init(recipe, out, **resolved)


@dataclass
class InitStep(Step):
    """The games (generated once), and in round 1 the starting policy and its round-0 eval.

    The starting policy (built or given) is Table 1's first row and the paired baseline;
    an experiment whose round 0 links another's (the replication's variants) leaves that
    eval to it. Round 0's eval is one rank, whatever the round's world size. It holds the
    whole recipe: the benchmark's init builder reads its init, policy and rollout sections.
    """

    name = "init"
    doc = "games; round 1: the starting policy and its round-0 eval"
    sharded = False

    recipe: Recipe

    @classmethod
    def of(cls, recipe: Recipe) -> InitStep:
        return cls(recipe)

    def run(self, rank: int = 0, world_size: int = 1) -> Path | None:
        from selskill.stages.task_source import ensure_games

        self.one_job(rank, world_size)
        recipe, run = self.recipe, self.recipe.run
        ensure_games(run)
        if run.round != 1:
            return None
        built = ensure_init_policy(recipe)
        start = resolve_round_policy(run, recipe.policy)[0]
        if not round_dir(run.runs_dir, run.exp, 0).is_symlink():
            # an SFT init trained again under --redo is evaluated again; any other is evaluated once
            run0 = run.replace(round=0, rank=0, world_size=1, redo=run.redo and recipe.policy.init_sft)
            step = EvalStep.of(recipe)
            dataclasses.replace(step, run_config=run0, model_path=start).run()
        return built


@dataclass
class TrainStep(Step):
    """In this process, or relaunched under the recipe's `train_accelerate_config` from its command line
    (`argv`: how the processes `accelerate launch` starts receive the recipe)."""

    name = "train"
    doc = "DPO on the round's pairs, or SFT on its wins (train_objective); accelerate parallelises it"
    sharded = False

    run_config: RunConfig
    policy: PolicyConfig
    train: TrainConfig
    argv: tuple[str, ...] | None = None

    @classmethod
    def of(cls, recipe: Recipe) -> TrainStep:
        return cls(recipe.run, recipe.policy, recipe.train, recipe.argv)

    def run(self, rank: int = 0, world_size: int = 1) -> None:
        from selskill.train.run import launch_parsed

        self.one_job(rank, world_size)
        status = launch_parsed(self.run_config, self.policy, self.train, self.argv)
        if status:  # the relaunched trainer said why in its own one line; its status says whose fault
            raise StageFailed(
                f"the train stage exited with status {status} (its error is above)", status=status
            )

    def complete(self) -> bool:
        from selskill.train.stage import COMPLETED

        run = self.run_config
        return (round_dir(run.runs_dir, run.exp, run.round) / "train" / COMPLETED).exists()


STAGES: tuple[type[Step], ...] = (InitStep, SampleStep, BranchStep, ForkStep, LabelStep, TrainStep, EvalStep)
BY_NAME = {s.name: s for s in STAGES}
# the stages that only make pairs: a round whose train reads none (train_objective sft_wins) runs without them
PAIR_STAGES = ("branch", "fork", "label")


def round_stages(names: Sequence[str] | None = None) -> list[type[Step]]:
    """The round's stages in table order (`names`: only these)."""
    if names is None:
        return list(STAGES)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown stage {', '.join(unknown)}; the stages are {', '.join(BY_NAME)}")
    return [s for s in STAGES if s.name in names]


def recipe_stages(recipe: Recipe) -> list[type[Step]]:
    """The stages a round of `recipe` runs, in table order: every one, but the pair-making ones when its train
    stage fits the sample stage's wins (they would cost the forks and train nothing)."""
    if recipe.train.train_objective == "sft_wins":
        return [s for s in STAGES if s.name not in PAIR_STAGES]
    return list(STAGES)


def describe_only(recipe: Recipe, name: str, rank: int | None = None) -> None:
    """A dry run of stage `name` (`rank`: that rank only) in this process: what it would run, and nothing
    computed or written (train has its own dry run, which also counts the pairs and steps)."""
    from selskill.executors.base import DRY_RUN_DONE
    from selskill.executors.local import LocalExecutor

    executor = LocalExecutor(workers=1, dry_run=True)
    executor.describe(recipe, BY_NAME[name], rank=rank)
    executor.out(DRY_RUN_DONE)


def run_entry(job: Callable[[Recipe], object], argv: Sequence[str] | None = None) -> int:
    """Parse the recipe and run `job(recipe)`, ending on an error with its one line (`selskill.errors`)."""

    def main() -> int:
        job(load_recipe(argv))
        return 0

    return run_main(main)


def stage_main(name: str, argv: Sequence[str] | None = None) -> int:
    """One rank of one stage in this process: the recipe's `rank` of its `world_size`."""
    stage = BY_NAME[name]
    if stage is TrainStep:  # under `accelerate launch` with DeepSpeed on CPUs, before any config is built
        from selskill.train.launch import init_cpu_deepspeed

        init_cpu_deepspeed()

    def job(r: Recipe):
        if r.run.dry_run and stage is not TrainStep:
            return describe_only(r, stage.name, r.run.rank)
        return stage.of(r).run(r.run.rank, r.run.world_size) if stage.sharded else stage.of(r).run()

    return run_entry(job, argv)
