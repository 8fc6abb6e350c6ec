"""Executors: how a round's stages are run over their ranks (docs/design.md, "Executors").

`local` (this machine: in-process or worker processes), `slurm` (one `sbatch --array` per
stage) and `ray` (one task per rank). The recipe's `executor` key picks one; its options are
the `local_*`, `slurm_*` and `ray_*` keys of the run section.
"""

from __future__ import annotations

from selskill.config.names import EXECUTORS
from selskill.executors.base import Executor, StageFailed, Step

__all__ = ["EXECUTORS", "Executor", "StageFailed", "Step", "make_executor"]


def make_executor(recipe) -> Executor:
    """The executor the recipe names, with its options from the recipe."""
    run = recipe.run
    if run.executor == "slurm":
        from selskill.executors.slurm import SlurmExecutor, SlurmOptions

        options = SlurmOptions(
            partition=run.slurm_partition,
            time=run.slurm_time,
            cpus_per_task=run.slurm_cpus_per_task,
            gpus_per_task=run.slurm_gpus_per_task,
            train_gpus=run.slurm_train_gpus,
            mem=run.slurm_mem,
            array_parallelism=run.slurm_array_parallelism,
            sbatch_args=run.slurm_sbatch_args,
        )
        return SlurmExecutor(
            options, dry_run=recipe.train.dry_run, wait=run.slurm_wait, poll_seconds=run.slurm_poll_seconds
        )
    if run.executor == "ray":
        from selskill.executors.ray import RayExecutor

        return RayExecutor(
            run.ray_address,
            run.ray_cpus_per_task,
            run.ray_gpus_per_task,
            run.ray_train_gpus,
            dry_run=recipe.train.dry_run,
        )
    from selskill.executors.local import LocalExecutor

    return LocalExecutor(run.local_workers, dry_run=recipe.train.dry_run)
