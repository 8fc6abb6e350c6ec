"""The Slurm executor: one `sbatch` job per stage, an array of `world_size` tasks for a sharded stage.

Each job waits for the previous stage's job (`--dependency=afterok`, with
`--kill-on-invalid-dep=yes` so that a failed stage cancels the rest instead of leaving
them pending forever). Submitting returns at once, or, with `wait` (`slurm_wait`), once
every stage's completion markers are on disk: the markers, not the job states, say a
stage is done (a job can end without error and
still leave a rank incomplete), and a job that leaves the queue before its stage's markers
are complete fails the round with the logs to read. Array task i runs rank i of the
stage from the recipe's own command line, the one a user would type for that rank, so a
failed task is rerun by hand with the line in its script; ranks already complete are
skipped by the stage. Scripts go to `runs/<exp>/round_<r>/slurm/<stage>.sh`, logs to
`slurm/logs/`. With `dry_run` the scripts and the `sbatch` lines are printed and nothing is
written or submitted.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from selskill.config.executor import SlurmOptions
from selskill.executors.base import Executor, StageFailed, Step, rank_command, worker_argv

RANK = "$SLURM_ARRAY_TASK_ID"

__all__ = ["SlurmExecutor", "SlurmOptions", "worker_argv"]


class SlurmExecutor(Executor):
    name = "slurm"

    def __init__(
        self,
        options: SlurmOptions | None = None,
        dry_run: bool = False,
        python: str = sys.executable,
        out: Callable[[str], None] = print,
    ):
        self.options = options or SlurmOptions()
        self.dry_run = dry_run
        self.python = python
        self.out = out
        self.waits = self.options.wait and not dry_run
        self.jobs: dict[str, str] = {}  # stage -> job id, as submitted

    def script_dir(self, recipe) -> Path:
        from selskill.data.layout import round_dir

        run = recipe.run
        return (Path.cwd() / round_dir(run.runs_dir, run.exp, run.round) / "slurm").resolve()

    def command(self, recipe, stage: type[Step]) -> str:
        return rank_command(recipe, stage, RANK, self.python)

    def render(self, recipe, stage: type[Step]) -> str:
        """The sbatch script of `stage`: the same text whether printed (dry run) or submitted."""
        o, run, n = self.options, recipe.run, stage.ranks(recipe)
        logs = self.script_dir(recipe) / "logs"
        gpus = stage.gpus(o.gpus_per_task, o.train_gpus)
        lines = ["#!/bin/bash", f"#SBATCH --job-name=selskill-{run.exp}-r{run.round}-{stage.name}"]
        if stage.sharded:
            lines.append(
                f"#SBATCH --array=0-{n - 1}" + (f"%{o.array_parallelism}" if o.array_parallelism else "")
            )
            lines.append(f"#SBATCH --output={logs}/%x-%A_%a.out")
        else:
            lines.append(f"#SBATCH --output={logs}/%x-%j.out")
        lines += ["#SBATCH --ntasks=1", f"#SBATCH --cpus-per-task={o.cpus_per_task}"]
        for key, value in (("partition", o.partition), ("time", o.time), ("mem", o.mem)):
            if value:
                lines.append(f"#SBATCH --{key}={value}")
        if gpus:
            lines.append(f"#SBATCH --gres=gpu:{gpus}")
        lines += [f"#SBATCH {a}" for a in shlex.split(o.sbatch_args)]
        what = (
            f"rank {RANK} of {n}: a rank already complete with this recipe is skipped"
            if stage.sharded
            else "one job: what is already complete is skipped"
        )
        lines += [
            f"# the {stage.name} stage of round {run.round} of {run.exp!r}, {what}",
            "set -euo pipefail",
            f"cd {shlex.quote(os.getcwd())}",
            f"exec {self.command(recipe, stage)}",
        ]
        return "\n".join(lines) + "\n"

    def sbatch_argv(self, script: Path, after: str | None) -> list[str]:
        cmd = ["sbatch", "--parsable"]
        if after:
            cmd += [f"--dependency=afterok:{after}", "--kill-on-invalid-dep=yes"]
        return [*cmd, str(script)]

    def run(self, recipe, stages) -> None:
        super().run(recipe, stages)
        if self.dry_run:
            return
        if self.waits:
            for stage in stages:
                self.wait_for(recipe, stage)
        else:
            jobs = ", ".join(f"{s} {j}" for s, j in self.jobs.items())
            self.out(
                f"submitted {jobs}. Follow them with squeue -j {','.join(self.jobs.values())}; logs in "
                f"{self.script_dir(recipe) / 'logs'}. Once they are done, the same command with executor: local "
                "prints the round's summary (every stage is then complete and skipped)"
            )

    def queued(self, job: str) -> bool:
        """Whether `job` (any task of its array) is still pending or running."""
        done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True, text=True)
        return done.returncode == 0 and bool(done.stdout.strip())  # squeue refuses a job id it forgot

    def wait_for(self, recipe, stage: type[Step]) -> None:
        """Until the stage's markers are complete; a job gone from the queue before that fails the round."""
        job = self.jobs[stage.name]
        started = time.monotonic()
        while True:
            complete = stage.complete_in(recipe)
            if complete:
                break
            if not self.queued(job):
                if complete is None or stage.complete_in(recipe):  # a marker written as the job ended
                    break
                raise StageFailed(
                    f"{stage.name}: job {job} left the queue before every rank of the stage was complete (it "
                    f"failed, was cancelled, or an earlier stage's failure cancelled it). Its log: "
                    f"{self.script_dir(recipe) / 'logs'}. Rerun the same command: complete ranks are skipped"
                )
            time.sleep(self.options.poll_seconds)
        self.out(f"{stage.name}: complete (job {job}, waited {time.monotonic() - started:.0f} s)")

    def describe(self, recipe, stage: type[Step], previous: type[Step] | None = None) -> None:
        """The stage's script and the sbatch line that would submit it."""
        script = self.script_dir(recipe) / f"{stage.name}.sh"
        placeholder = previous and f"<job id of {previous.name}>"
        self.out(
            f"# --- {script}\n{self.render(recipe, stage)}# submit: "
            f"{shlex.join(self.sbatch_argv(script, placeholder))}\n"
        )

    def run_stage(self, recipe, stage: type[Step], after: str | None = None) -> str:
        script = self.script_dir(recipe) / f"{stage.name}.sh"
        text = self.render(recipe, stage)
        for tool in ("sbatch", "squeue") if self.waits else ("sbatch",):
            if shutil.which(tool) is None:
                raise FileNotFoundError(
                    f"the slurm executor needs Slurm's {tool} on PATH; add --dry_run to print the scripts instead"
                )
        (script.parent / "logs").mkdir(parents=True, exist_ok=True)
        script.write_text(text)
        done = subprocess.run(self.sbatch_argv(script, after), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"sbatch {script} failed (exit {done.returncode}): {done.stderr.strip()}")
        job = done.stdout.strip().split(";")[0]
        self.jobs[stage.name] = job
        self.out(f"{stage.name}: submitted job {job} ({script})")
        return job
