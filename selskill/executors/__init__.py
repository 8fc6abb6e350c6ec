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
    """The executor the recipe names, with its options from the recipe (`dry_run`: the run section's)."""
    ex, dry_run = recipe.executor, recipe.run.dry_run
    if ex.executor == "slurm":
        from selskill.executors.slurm import SlurmExecutor

        return SlurmExecutor(ex.slurm(), dry_run=dry_run)
    if ex.executor == "ray":
        from selskill.executors.ray import RayExecutor

        return RayExecutor(
            ex.ray_address, ex.ray_cpus_per_task, ex.ray_gpus_per_task, ex.ray_train_gpus, dry_run=dry_run
        )
    from selskill.executors.local import LocalExecutor

    return LocalExecutor(ex.local_workers, dry_run=dry_run)
