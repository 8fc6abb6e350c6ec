"""What every executor shares: the step type, the executor interface, and how a worker runs one rank.

A stage is a step (datatrove's `PipelineStep`): built from the recipe sections it reads
(`Step.of(recipe)`), it computes one rank of its output (`step.run(rank, world_size)`). It
writes through the run-directory contract (`selskill.data.rank_writer.run_rank`: a lock per
rank, outputs renamed into place, the completion marker last), so an executor never decides
what to skip: it starts every rank, and a rank whose marker verifies with this recipe's
inputs returns at once. That is what makes executors interchangeable and a crashed round
resumable under any of them: rerun the same command, with the same or another executor.

Out-of-process workers (local worker processes, Ray tasks, Slurm array tasks) receive the
recipe as its command line (`Recipe.argv`) and the step's class, and build the recipe once
there: `TrainConfig` caches the device it was parsed on, and under `accelerate` or DeepSpeed
the configs must be built after the distributed state exists, so a worker on another
machine must parse for itself. One path for every worker also means the local
multi-process run checks that the command line alone rebuilds what a rank needs, which is
all a Slurm array task gets.
"""

from __future__ import annotations

import os
import shlex
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from selskill.errors import ExplainedError

if TYPE_CHECKING:
    from selskill.config import Recipe


class Step(ABC):
    """One entry of a round's table: a stage built from its recipe sections, run one rank at a time.

    `sharded`: the stage splits its items over `world_size` ranks (sample, branch, fork,
    label, eval). A stage that is not runs as one job that parallelises itself, if at all
    (train relaunches under `accelerate`; init builds one model). Workers receive the class
    (pickled by reference) and build the step from the recipe they parse.
    """

    name: ClassVar[str] = ""
    doc: ClassVar[str] = ""
    sharded: ClassVar[bool] = True

    @classmethod
    @abstractmethod
    def of(cls, recipe: Recipe) -> Step:
        """This stage of `recipe`, holding only the sections it reads."""

    @abstractmethod
    def run(self, rank: int = 0, world_size: int = 1) -> Any:
        """Compute rank `rank` of `world_size` (a stage that is not sharded: rank 0 of 1)."""

    def complete(self) -> bool | None:
        """Whether every output of the stage is on disk (its completion markers): what an executor that queues
        jobs polls when it waits; None: only the job's end says."""
        return None

    def one_job(self, rank: int, world_size: int) -> None:
        """Refuse a rank of a stage that is not sharded."""
        if (rank, world_size) != (0, 1):
            raise ValueError(
                f"the {self.name} stage is one job (rank 0 of 1); got rank {rank} of {world_size}"
            )

    @classmethod
    def complete_in(cls, recipe: Recipe) -> bool | None:
        return cls.of(recipe).complete()

    @classmethod
    def ranks(cls, recipe: Recipe) -> int:
        return recipe.run.world_size if cls.sharded else 1

    @classmethod
    def gpus(cls, per_task: float, one_job: float) -> float:
        """GPUs a task of this stage asks for: `per_task` for a rank, `one_job` (when set) for a one-job stage."""
        return one_job if not cls.sharded and one_job else per_task


DRY_RUN_DONE = "dry run: nothing was written or submitted, and nothing computed"


class StageFailed(ExplainedError):
    """Some ranks of a stage raised; the others ran to the end (their outputs are complete and kept)."""

    status = 1  # the run failed, not its input


# keys a worker must not see: they say how this command schedules the round, and a worker runs one rank of it
SCHEDULING_KEYS = ("executor", "local_workers", "dry_run")
SCHEDULING_PREFIXES = ("slurm_", "ray_")
FLAGS = ("dry_run",)  # boolean keys, which may stand without a value


def worker_argv(argv: list[str], drop: tuple[str, ...] = ()) -> list[str]:
    """The recipe's command line as one worker runs it: without the scheduling keys (a printed command must do
    what it says, so it never dry-runs) and without the keys in `drop`."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        key = a[2:].split("=", 1)[0] if a.startswith("--") else ""
        if key and (key in SCHEDULING_KEYS or key.startswith(SCHEDULING_PREFIXES) or key in drop):
            if "=" in a:
                i += 1
            elif key in FLAGS:
                nxt = argv[i + 1].lower() if i + 1 < len(argv) else ""
                i += 2 if nxt in ("true", "false", "1", "0", "yes", "no") else 1
            else:
                i += 2
            continue
        out.append(a)
        i += 1
    return out


def rank_command(recipe: Recipe, stage: type[Step], rank: str, python: str = sys.executable) -> str:
    """The command that computes rank `rank` (a number or a shell variable) of `stage`, as a worker runs it."""
    drop = ("rank", "world_size") if stage.sharded else ()
    cmd = shlex.join([python, "-m", "selskill.stages", stage.name, *worker_argv(recipe_argv(recipe), drop)])
    if stage.sharded:
        cmd += f" --rank {rank} --world_size {stage.ranks(recipe)}"
    return cmd


def recipe_argv(recipe: Recipe) -> list[str]:
    if recipe.argv is None:
        raise ValueError(
            "this recipe was built in code, not parsed from a command line: workers in other processes rebuild "
            "the recipe from its command line, so build it with load_recipe([...]) or use the local executor "
            "with local_workers: 1"
        )
    return list(recipe.argv)


def run_rank_from_argv(stage: type[Step], argv: Sequence[str], rank: int, world_size: int, cwd: str) -> None:
    """One rank in a worker process: build the recipe here, once, from the directory the round was started in
    (recipes, runs_dir and games_dir may be relative to it)."""
    from selskill.config import load_recipe

    if os.getcwd() != cwd:
        os.chdir(cwd)
    stage.of(load_recipe(list(argv))).run(rank, world_size)


def raise_failures(stage: type[Step], failures: dict[int, BaseException], world_size: int) -> None:
    """Re-raise a single failure as itself (a refused rank stays a `StageRefused`); several as one error, with
    the status the worst of them would give alone: a round ends on a refusal as the stage alone does (a
    `StageRefused`, exit status 2, each rank's line naming its fix), never with "a rerun computes them"."""
    from selskill.data.contract import StageRefused
    from selskill.errors import exit_status

    if not failures:
        return
    if len(failures) == 1:
        raise next(iter(failures.values()))
    lines = "\n".join(f"  rank {r}: {type(e).__name__}: {e}" for r, e in sorted(failures.items()))
    refused = sorted(r for r, e in failures.items() if exit_status(e) == 2)
    if not refused:
        raise StageFailed(
            f"{stage.name}: {len(failures)} of {world_size} ranks failed (the others are complete; a rerun "
            f"computes only the failed ones):\n{lines}"
        )
    ranks = f"rank{'s' if len(refused) > 1 else ''} {', '.join(map(str, refused))}"
    fix = f"a rerun as it is is refused again: apply the fix {'each' if len(refused) > 1 else 'it'} names"
    if len(refused) == len(failures):
        raise StageRefused(f"{stage.name}: {ranks} of {world_size} cannot run as given ({fix}):\n{lines}")
    raise StageRefused(
        f"{stage.name}: {len(failures)} of {world_size} ranks failed and {ranks} cannot run as given ({fix}; "
        f"the rerun then computes the other failed ranks too):\n{lines}"
    )


class Executor(ABC):
    """Runs a round's stages in order, each over all of its ranks.

    `waits`: `run` returns once every stage has finished, so the caller can read the
    outputs (local, Ray). A batch scheduler's executor returns once the jobs are queued.
    """

    name = ""
    waits = True
    dry_run = False  # print what each stage would run, and compute, write and submit nothing
    out: Callable[[str], None] = staticmethod(print)

    def run(self, recipe: Recipe, stages: Sequence[type[Step]]) -> None:
        if self.dry_run:
            previous = None
            for stage in stages:
                self.describe(recipe, stage, previous)
                previous = stage
            self.out(DRY_RUN_DONE)
            return
        after = None
        for stage in stages:
            after = self.run_stage(recipe, stage, after)

    def describe(
        self, recipe: Recipe, stage: type[Step], previous: type[Step] | None = None, rank: int | None = None
    ) -> None:
        """What running `stage` would do (a dry run): its ranks' command and whether its outputs are complete;
        `rank`: that rank only.

        Only reads: the completion markers say whether a rerun would skip the stage.
        """
        n = stage.ranks(recipe)
        if rank is not None and n > 1:
            ranks = f"rank {rank} of {n}"
        else:
            ranks = f"rank R of {n} (R = 0..{n - 1})" if n > 1 else "one job"
        complete = stage.complete_in(recipe)
        if complete is None:
            state = ""
        elif complete:
            state = "; complete on disk: skipped unless its recorded inputs differ from this recipe's"
        else:
            state = "; not complete: would compute"
        try:
            command = rank_command(recipe, stage, "R" if rank is None and n > 1 else str(rank or 0))
        except ValueError:  # a recipe built in code has no command line
            command = f"{stage.name} in this process"
        self.out(f"{stage.name}: {stage.doc}; {ranks}{self.placement(stage, n)}{state}\n  {command}")

    def placement(self, stage: type[Step], ranks: int) -> str:
        """Where the ranks of `stage` would run, for `describe` (e.g. ", in 2 worker processes")."""
        return ""

    @abstractmethod
    def run_stage(self, recipe: Recipe, stage: type[Step], after: Any = None) -> Any:
        """Run (or queue) every rank of `stage`; `after` is what the previous stage returned."""
