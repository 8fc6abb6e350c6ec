"""The stage table: a round's stages in order, each with one entry `run(recipe, rank, world_size)`.

Every way of running a round reads this table: `selskill round` / `make round` /
`pipelines/round.py` hand it to the recipe's executor, and `pipelines/<stage>.py` /
`python -m selskill.stages <stage>` run one rank of one entry (what each Slurm array task
runs). The adapters below only pick a stage's recipe sections, and log the stage to wandb
once its ranks are complete (`selskill.stages.wandb_log`); the stages themselves
(`selskill/stages/<stage>.py`) are unchanged, so a row is the same whichever executor or
entry point computed it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

from selskill.config import Recipe, load_recipe
from selskill.data.gguf_source import is_gguf_source
from selskill.data.layout import policy_dir, resolve_round_policy, round_dir
from selskill.errors import ExplainedError, run_main
from selskill.executors.base import Stage, StageFailed
from selskill.stages.wandb_log import log_stage


def ensure_init_policy(recipe: Recipe) -> Path | None:
    """Round 1 without a given model starts from the run's own offline init policy; a given GGUF
    model (a `.gguf` file, or `wheel:<distribution>`) starts from the folder it is converted into."""
    given = recipe.policy.model_name_or_path
    if given and is_gguf_source(given):
        from selskill.policy.gguf import ensure_gguf_model

        return ensure_gguf_model(given, recipe.run.runs_dir)
    if given:
        return None
    out = policy_dir(recipe.run.runs_dir, recipe.run.exp, 1)
    from selskill.registry import benchmark
    from selskill.stages.common import balanced_tasks
    from selskill.stages.context import retriever, runner_library

    spec = benchmark(recipe.run.benchmark)

    def train_tasks(n: int) -> list[str]:
        # the first n train tasks in the order the sample stage takes them
        return balanced_tasks(spec.task_index(recipe.run, "train").games, n)

    if spec.build_init is None:
        raise ExplainedError(
            f"benchmark {spec.name} has no init builder: set model_name_or_path to the policy round 1 starts from"
        )
    library = runner_library(recipe.rollout, spec.name)
    return spec.build_init(
        recipe,
        out,
        fmt=spec.turn_format(recipe.rollout, recipe.settings),
        train_tasks=train_tasks,
        library=library,
        retriever=retriever(recipe.rollout, library),
    )


def init_stage(recipe: Recipe) -> Path | None:
    """The games (generated once), and in round 1 the starting policy and its round-0 eval.

    The starting policy (built or given) is Table 1's first row and the paired baseline;
    an experiment whose round 0 links another's (the replication's variants) leaves that
    eval to it. Round 0's eval is one rank, whatever the round's world size.
    """
    from selskill.stages.context import ensure_games
    from selskill.stages.evaluate import run_eval

    run = recipe.run
    ensure_games(run)
    if run.round != 1:
        return None
    built = ensure_init_policy(recipe)
    start = resolve_round_policy(run, recipe.policy)[0]
    if not round_dir(run.runs_dir, run.exp, 0).is_symlink():
        run0 = run.replace(round=0, rank=0, world_size=1, redo=False)
        if run_eval(run0, recipe.policy, recipe.rollout, recipe.eval, recipe.seed, model_path=start):
            log_stage(recipe, "eval", run0)
    return built


def sample_stage(recipe: Recipe):
    from selskill.stages.sample import run_sample

    computed = run_sample(recipe.run, recipe.policy, recipe.rollout, recipe.sample, recipe.seed)
    log_stage(recipe, "sample")
    return computed


def branch_stage(recipe: Recipe):
    from selskill.stages.branch import run_branch

    computed = run_branch(recipe.run, recipe.policy, recipe.rollout, recipe.branch, recipe.seed)
    log_stage(recipe, "branch")
    return computed


def fork_stage(recipe: Recipe):
    from selskill.stages.fork import run_fork

    computed = run_fork(recipe.run, recipe.policy, recipe.rollout, recipe.fork, recipe.seed)
    log_stage(recipe, "fork")
    return computed


def label_stage(recipe: Recipe):
    from selskill.stages.label import run_label

    computed = run_label(recipe.run, recipe.label, recipe.seed)
    log_stage(recipe, "label")
    return computed


def train_stage(recipe: Recipe) -> None:
    """In this process, or relaunched under the recipe's `train_accelerate_config` from its command line."""
    from selskill.train.run import launch_parsed

    if launch_parsed(recipe.run, recipe.policy, recipe.train, recipe.argv) != 0:
        raise StageFailed("the train stage failed (see its output above)")


def eval_stage(recipe: Recipe):
    from selskill.stages.evaluate import run_eval

    metrics = run_eval(recipe.run, recipe.policy, recipe.rollout, recipe.eval, recipe.seed)
    if metrics is not None:  # this rank found every rank complete and wrote metrics.json
        log_stage(recipe, "eval")
    return metrics


def _markers_complete(name: str, recipe: Recipe) -> bool:
    """A sharded stage is complete when every rank's completion marker verifies (the eval: with
    `eval_headroom`, those of its no-skills episodes too)."""
    from selskill.data.layout import StageDir

    run, cfg = recipe.run, recipe.eval
    stages = [name]
    if name == "eval":
        stages = [cfg.stage, cfg.headroom_stage] if cfg.eval_headroom else [cfg.stage]
    return all(
        StageDir.of(run.runs_dir, run.exp, run.round, stage).is_complete(r)
        for stage in stages
        for r in range(run.world_size)
    )


def _markers(name: str) -> Callable[[Recipe], bool]:
    # a partial of a module-level function: stages travel pickled to worker processes
    return functools.partial(_markers_complete, name)


def _train_complete(recipe: Recipe) -> bool:
    from selskill.train.stage import COMPLETED

    run = recipe.run
    return (round_dir(run.runs_dir, run.exp, run.round) / "train" / COMPLETED).exists()


STAGES: tuple[Stage, ...] = (
    Stage("init", init_stage, sharded=False, doc="games; round 1: the starting policy and its round-0 eval"),
    Stage(
        "sample", sample_stage, doc="K rollouts per task from round r-1's policy", complete=_markers("sample")
    ),
    Stage("branch", branch_stage, doc="the decision points worth forking", complete=_markers("branch")),
    Stage("fork", fork_stage, doc="invoke and skip continuations from each point", complete=_markers("fork")),
    Stage("label", label_stage, doc="preference pairs: outcome, then efficiency", complete=_markers("label")),
    Stage(
        "train",
        train_stage,
        sharded=False,
        doc="DPO on the round's pairs (accelerate parallelises it)",
        complete=_train_complete,
    ),
    Stage("eval", eval_stage, doc="greedy episodes on the held-out splits", complete=_markers("eval")),
)
BY_NAME = {s.name: s for s in STAGES}


def round_stages(names: Sequence[str] | None = None) -> list[Stage]:
    """The round's stages in table order (`names`: only these)."""
    if names is None:
        return list(STAGES)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown stage {', '.join(unknown)}; the stages are {', '.join(BY_NAME)}")
    return [s for s in STAGES if s.name in names]


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
    if stage.name == "train":  # under `accelerate launch` with DeepSpeed on CPUs, before any config is built
        from selskill.train.launch import init_cpu_deepspeed

        init_cpu_deepspeed()

    def job(r: Recipe):
        if r.train.dry_run and stage.name != "train":
            return describe_only(r, stage.name, r.run.rank)
        return stage.run(r, r.run.rank, r.run.world_size) if stage.sharded else stage.run(r)

    return run_entry(job, argv)
