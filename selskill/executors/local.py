"""The local executor: every rank on this machine, in this process or in worker processes.

Workers are started with `spawn`: the parent holds torch threads (and, after a stage, a
loaded model), which a forked child would inherit in an undefined state. A spawned worker
imports the parent's main module again, so a script that drives stages must keep its work
under `if __name__ == "__main__":` (docs/design.md, "Concurrent writers").
"""

from __future__ import annotations

import logging
import os
import sys
from concurrent.futures import ProcessPoolExecutor

from selskill.executors.base import Executor, Step, raise_failures, recipe_argv, run_rank_from_argv

logger = logging.getLogger(__name__)


class LocalExecutor(Executor):
    """`workers`: worker processes at once for a stage of several ranks; 0 = one per rank, 1 = every rank
    in this process one after another (no interpreter start-up or re-parse per rank)."""

    name = "local"

    def __init__(self, workers: int = 0, dry_run: bool = False):
        if workers < 0:
            raise ValueError(f"local_workers must be >= 0; got {workers}")
        self.workers = workers
        self.dry_run = dry_run
        self.waits = not dry_run

    def placement(self, stage: type[Step], ranks: int) -> str:
        if ranks == 1 or self.workers == 1:
            return ", in this process"
        return f", in {min(ranks, self.workers or ranks)} worker processes"

    def run_stage(self, recipe, stage: type[Step], after=None) -> None:
        n = stage.ranks(recipe)
        if n == 1 or self.workers == 1:
            step = stage.of(recipe)
            for rank in range(n):
                step.run(rank, n)
            return
        import multiprocessing

        argv, cwd = recipe_argv(recipe), os.getcwd()
        workers = min(n, self.workers or n)
        threads = worker_threads(workers)
        logger.info(f"{stage.name}: {n} ranks in {workers} worker processes, {threads} torch thread(s) each")
        failures = {}
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            workers, mp_context=context, initializer=_use_threads, initargs=(threads,)
        ) as pool:
            futures = {rank: pool.submit(run_rank_from_argv, stage, argv, rank, n, cwd) for rank in range(n)}
            for rank, future in futures.items():
                try:
                    future.result()
                except Exception as exc:  # every rank runs to its end; the failures are reported together
                    failures[rank] = exc
        raise_failures(stage, failures, n)


def worker_threads(workers: int) -> int:
    """Torch threads for each of `workers` processes: this process's share split between them.

    A spawned worker would otherwise start as many threads as this process has, and two
    workers on a 2-core machine would run four threads on two cores, which is slower than
    one process alone (docs/benchmarks.md, "Ranks side by side on the CPU").
    """
    if "torch" in sys.modules:
        mine = sys.modules["torch"].get_num_threads()
    else:
        mine = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    return max(1, mine // max(1, workers))


def _use_threads(threads: int) -> None:
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[key] = str(threads)
    import torch

    torch.set_num_threads(threads)
