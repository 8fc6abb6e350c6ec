"""The Ray executor: one Ray task per rank, on a running cluster or a local instance.

Ray is optional: it is imported only when this executor runs. Every node must see the
same files at the same paths (the package, the recipe, `runs_dir`, `games_dir`), as with
Slurm; a task works from the directory the round was started in. A rank whose worker dies
is retried by Ray, which the stage contract makes safe (the retry takes the rank's lock and
recomputes it from scratch).
"""

from __future__ import annotations

import logging
import os

from selskill.errors import MissingPackage
from selskill.executors.base import Executor, Step, raise_failures, recipe_argv, run_rank_from_argv

logger = logging.getLogger(__name__)


def import_ray():
    try:
        import ray
    except ImportError:
        raise MissingPackage(
            "the ray executor needs Ray, which is not installed: pip install ray==2.60.0 "
            "(or pip install -e '.[ray]'), or choose executor: local | slurm"
        ) from None
    return ray


class RayExecutor(Executor):
    """`address`: "" starts a local Ray instance for the round (and stops it after), anything else is passed
    to `ray.init` ("auto": the cluster this machine belongs to). A Ray already initialised in this process is
    used as it is."""

    name = "ray"

    def __init__(
        self,
        address: str = "",
        cpus_per_task: float = 1,
        gpus_per_task: float = 0,
        train_gpus: float = 0,
        dry_run: bool = False,
    ):
        self.address = address
        self.cpus_per_task = cpus_per_task
        self.gpus_per_task = gpus_per_task
        self.train_gpus = train_gpus
        self.dry_run = dry_run
        self.waits = not dry_run

    def placement(self, stage: type[Step], ranks: int) -> str:
        gpus = stage.gpus(self.gpus_per_task, self.train_gpus)
        return f", as {ranks} Ray task{'s' if ranks > 1 else ''} of {self.cpus_per_task} CPUs and {gpus} GPUs"

    def run(self, recipe, stages) -> None:
        if self.dry_run:  # no Ray started
            return super().run(recipe, stages)
        ray = import_ray()
        started = not ray.is_initialized()
        if started:
            ray.init(address=self.address or None)
        try:
            super().run(recipe, stages)
        finally:
            if started:
                ray.shutdown()

    def run_stage(self, recipe, stage: type[Step], after=None) -> None:
        ray = import_ray()
        n = stage.ranks(recipe)
        gpus = stage.gpus(self.gpus_per_task, self.train_gpus)
        task = ray.remote(num_cpus=self.cpus_per_task, num_gpus=gpus)(run_rank_from_argv)
        argv, cwd = recipe_argv(recipe), os.getcwd()
        logger.info(f"{stage.name}: {n} Ray task{'s' if n > 1 else ''}")
        refs = {rank: task.remote(stage, argv, rank, n, cwd) for rank in range(n)}
        failures = {}
        for rank, ref in refs.items():
            try:
                ray.get(ref)
            except Exception as exc:  # RayTaskError is also an instance of the task's own exception type
                failures[rank] = exc
        raise_failures(stage, failures, n)
