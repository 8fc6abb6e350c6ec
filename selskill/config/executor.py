"""The executor section: how a round's stages run over their ranks (selskill/executors/).

None of these keys changes a row, so no stage records them among its inputs: they are a
section of their own, never handed to a stage. The `slurm_*` keys configure `SlurmOptions`,
whose fields hold their defaults: each key names the field it sets (`KeysOf`) and takes its type
and default from it, and `ExecutorConfig.slurm` builds it from them, so each is written once.
"""

from __future__ import annotations

from dataclasses import dataclass

from selskill.config.checks import check_at_least, check_choice
from selskill.config.keys import KeysOf, key, recipe_section, settings_of
from selskill.config.names import EXECUTORS


@dataclass(frozen=True)
class SlurmOptions:
    """What the Slurm executor submits with (`selskill.executors.slurm`): one field per `slurm_*` key."""

    partition: str = ""
    time: str = ""
    cpus_per_task: int = 1
    gpus_per_task: int = 0
    train_gpus: int = 0
    mem: str = ""
    array_parallelism: int = 0
    sbatch_args: str = ""
    wait: bool = False  # return once every stage's markers are written, not once the jobs are queued
    poll_seconds: float = 30.0


@recipe_section
class ExecutorConfig:
    """Where and with what resources the ranks of each stage run."""

    _argument_group_name = "executor"  # its heading in `--help`

    executor: str = key(
        "local",
        "local (this machine) | slurm (one sbatch --array per stage; add --dry_run to print the "
        "scripts) | ray (one Ray task per rank)",
    )
    local_workers: int = key(
        0,
        "executor local, world_size > 1: worker processes at once (0 = one per rank; 1 = every rank "
        "in this process, one after another)",
    )
    _slurm = KeysOf(
        SlurmOptions,
        "slurm_",
        {
            "slurm_partition": "executor slurm: --partition (empty: the default)",
            "slurm_time": "executor slurm: --time per job, e.g. 04:00:00",
            "slurm_cpus_per_task": "executor slurm: --cpus-per-task",
            "slurm_gpus_per_task": "executor slurm: GPUs of each rank's job (--gres=gpu:N)",
            "slurm_train_gpus": "executor slurm: GPUs of the one-job stages, init and train (0 = slurm_gpus_per_task)",
            "slurm_mem": "executor slurm: --mem per job, e.g. 64G",
            "slurm_array_parallelism": "executor slurm: at most this many ranks of a stage at once (0 = no limit)",
            "slurm_sbatch_args": "executor slurm: more sbatch options, one #SBATCH line each "
            "(e.g. '--account=a --qos=b')",
            "slurm_wait": "executor slurm: wait until every stage's completion markers are written, then print the "
            "round's summary (false: return once the jobs are queued)",
            "slurm_poll_seconds": "executor slurm with slurm_wait: seconds between looks at the markers",
        },
    )
    ray_address: str = key(
        "", "executor ray: ray.init address (empty: a local Ray instance for the round; auto: the cluster)"
    )
    ray_cpus_per_task: float = key(1.0, "executor ray: CPUs of each rank's task")
    ray_gpus_per_task: float = key(0.0, "executor ray: GPUs of each rank's task")
    ray_train_gpus: float = key(
        0.0, "executor ray: GPUs of the one-job stages, init and train (0 = ray_gpus_per_task)"
    )

    def __post_init__(self):
        check_choice(self, "executor", EXECUTORS)
        check_at_least(self, 0, "local_workers", why="0 = one worker process per rank")
        check_at_least(self, 1, "slurm_cpus_per_task")
        check_at_least(
            self,
            0,
            "slurm_gpus_per_task",
            "slurm_train_gpus",
            "slurm_array_parallelism",
            "ray_cpus_per_task",
            "ray_gpus_per_task",
            "ray_train_gpus",
            "slurm_poll_seconds",
        )

    def slurm(self) -> SlurmOptions:
        """The Slurm executor's options: the `slurm_*` keys."""
        return settings_of(self, SlurmOptions)
