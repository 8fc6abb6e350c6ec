"""Executors: how a round's stages are run over their ranks (docs/design.md, "Executors").

`local` (this machine: in-process or worker processes), `slurm` (one `sbatch --array` per
stage) and `ray` (one task per rank). The recipe's `executor` key picks one; its options are
the `local_*`, `slurm_*` and `ray_*` keys of the executor section (`selskill.config.executor`).
"""

from __future__ import annotations

from selskill.config.names import EXECUTORS
from selskill.executors.base import Executor, StageFailed, Step

__all__ = ["EXECUTORS", "Executor", "StageFailed", "Step", "make_executor"]


def make_executor(recipe) -> Executor:
    """The executor the recipe names, with its options from the recipe."""
    ex = recipe.executor
    if ex.executor == "slurm":
        from selskill.executors.slurm import SlurmExecutor, SlurmOptions

        options = SlurmOptions(
            partition=ex.slurm_partition,
            time=ex.slurm_time,
            cpus_per_task=ex.slurm_cpus_per_task,
            gpus_per_task=ex.slurm_gpus_per_task,
            train_gpus=ex.slurm_train_gpus,
            mem=ex.slurm_mem,
            array_parallelism=ex.slurm_array_parallelism,
            sbatch_args=ex.slurm_sbatch_args,
        )
        return SlurmExecutor(
            options, dry_run=recipe.train.dry_run, wait=ex.slurm_wait, poll_seconds=ex.slurm_poll_seconds
        )
    if ex.executor == "ray":
        from selskill.executors.ray import RayExecutor

        return RayExecutor(
            ex.ray_address,
            ex.ray_cpus_per_task,
            ex.ray_gpus_per_task,
            ex.ray_train_gpus,
            dry_run=recipe.train.dry_run,
        )
    from selskill.executors.local import LocalExecutor

    return LocalExecutor(ex.local_workers, dry_run=recipe.train.dry_run)
