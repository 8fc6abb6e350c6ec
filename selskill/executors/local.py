"""The local executor: every rank on this machine, in this process or in worker processes.

Workers are started with `spawn`: the parent holds torch threads (and, after a stage, a
loaded model), which a forked child would inherit in an undefined state. A spawned worker
imports the parent's main module again, so a script that drives stages must keep its work
under `if __name__ == "__main__":` (docs/design.md, "Concurrent writers").
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

from selskill.executors.base import Executor, Stage, raise_failures, recipe_argv, run_rank_from_argv


class LocalExecutor(Executor):
    """`workers`: worker processes at once for a stage of several ranks; 0 = one per rank, 1 = every rank
    in this process one after another (no interpreter start-up or re-parse per rank)."""

    name = "local"

    def __init__(self, workers: int = 0):
        if workers < 0:
            raise ValueError(f"local_workers must be >= 0; got {workers}")
        self.workers = workers

    def run_stage(self, recipe, stage: Stage, after=None) -> None:
        n = stage.ranks(recipe)
        if n == 1 or self.workers == 1:
            for rank in range(n):
                stage.run(recipe, rank, n)
            return
        import multiprocessing

        argv, cwd = recipe_argv(recipe), os.getcwd()
        workers = min(n, self.workers or n)
        print(f"{stage.name}: {n} ranks in {workers} worker processes", flush=True)
        failures = {}
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {rank: pool.submit(run_rank_from_argv, stage, argv, rank, n, cwd) for rank in range(n)}
            for rank, future in futures.items():
                try:
                    future.result()
                except Exception as exc:  # every rank runs to its end; the failures are reported together
                    failures[rank] = exc
        raise_failures(stage, failures, n)
