"""The local executor: every rank on this machine, in this process or in worker processes.

Workers are started with `spawn`: the parent holds torch threads (and, after a stage, a
loaded model), which a forked child would inherit in an undefined state. A spawned worker
imports the parent's main module again, so a script that drives stages must keep its work
under `if __name__ == "__main__":` (docs/design.md, "Concurrent writers").

Each rank runs in a process of its own, `workers` at a time. A worker that dies (killed, out
of memory) fails its rank alone: the others run to their end and keep their outputs, which a
process pool cannot promise (one dead worker breaks it and it terminates the rest). Ctrl-C
reaches this process only (`selskill.errors.start_shielded`); it stops the running workers
with SIGTERM, which each unwinds like an error (its rank lock released, its temporary files
removed), and ends on one line.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import traceback

from selskill.errors import INTERRUPTED, start_shielded
from selskill.executors.base import (
    Executor,
    StageFailed,
    Step,
    raise_failures,
    recipe_argv,
    run_rank_from_argv,
)

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
        argv, cwd = recipe_argv(recipe), os.getcwd()
        workers = min(n, self.workers or n)
        threads = worker_threads(workers)
        logger.info(f"{stage.name}: {n} ranks in {workers} worker processes, {threads} torch thread(s) each")
        raise_failures(stage, run_in_workers(stage, argv, cwd, n, workers, threads), n)


class WorkerTraceback(Exception):
    """Where a rank's error was raised in its worker (the `__cause__` of the error re-raised here)."""


def run_in_workers(
    stage: type[Step], argv: list[str], cwd: str, n: int, workers: int, threads: int
) -> dict[int, BaseException]:
    """Ranks 0..n-1 of `stage`, each in a spawned process of its own, `workers` at a time: the error of each
    rank that failed (every rank runs to its end). Ctrl-C stops the running ones and is raised here."""
    import multiprocessing
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("spawn")
    pending, running, failures = list(range(n)), {}, {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                rank = pending.pop(0)
                receive, send = context.Pipe(duplex=False)
                process = context.Process(
                    target=_rank_worker,
                    args=(stage, argv, rank, n, cwd, threads, send),
                    name=f"selskill-{stage.name}-rank-{rank}",
                )
                running[rank] = _Worker(process, receive)
                start_shielded(process)
                send.close()
            ready = set(wait([w for worker in running.values() for w in worker.waited()]))
            for rank, worker in list(running.items()):
                if worker.receive in ready:  # read before the process ends: a large error would fill the pipe
                    worker.read()
                if worker.process.sentinel in ready:
                    worker.process.join()
                    worker.receive.close()
                    del running[rank]
                    error = _outcome(stage, rank, worker.process.exitcode, worker.sent)
                    if error is not None:
                        failures[rank] = error
    except KeyboardInterrupt:
        _stop([worker.process for worker in running.values()])
        raise
    return failures


class _Worker:
    """A rank's process, the pipe it answers through, and its answer once read."""

    def __init__(self, process, receive):
        self.process, self.receive = process, receive
        self.sent, self.done = None, False

    def waited(self) -> list:
        return [self.process.sentinel] if self.done else [self.process.sentinel, self.receive]

    def read(self) -> None:
        try:
            self.sent = self.receive.recv()
        except (EOFError, OSError):  # ended without answering (killed)
            pass
        self.done = True


def _outcome(stage: type[Step], rank: int, exitcode: int | None, sent) -> BaseException | None:
    """The error of a rank whose worker ended with `exitcode` after sending `sent` (None: it succeeded)."""
    if isinstance(sent, tuple) and sent[0] == "error":
        error, where = sent[1], sent[2]
        error.__cause__ = WorkerTraceback(where)
        return error
    if sent == ("ok",):
        return None
    if exitcode is not None and exitcode < 0:
        name = (
            signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else f"signal {-exitcode}"
        )
        how = f"was killed by {name}" + (" (out of memory?)" if -exitcode == signal.SIGKILL else "")
    else:
        how = f"exited with status {exitcode}"
    return StageFailed(
        f"{stage.name}: the worker process of rank {rank} {how} before the rank finished; the other ranks ran "
        "on. Rerun the same command to compute it (complete ranks are skipped)"
    )


def _stop(processes) -> None:
    """Ctrl-C: SIGTERM to each running worker, which unwinds its rank; a second Ctrl-C kills them at once."""
    started = [p for p in processes if p.pid is not None]
    for p in started:
        if p.exitcode is None:
            p.terminate()
    try:
        for p in started:
            p.join()
    except KeyboardInterrupt:
        for p in started:
            p.kill()
            p.join()


def _interrupt(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the rank is unwinding
    raise KeyboardInterrupt


def _rank_worker(stage: type[Step], argv, rank: int, world_size: int, cwd: str, threads: int, conn) -> None:
    """One rank in a worker: its error (or "ok") goes back through `conn`; stopped by SIGTERM, it unwinds
    and ends with status 130, printing nothing."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the executor's (`start_shielded`)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        _use_threads(threads)
        run_rank_from_argv(stage, argv, rank, world_size, cwd)
        message = ("ok",)
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED)
    except BaseException as exc:  # noqa: BLE001 - every error of the rank goes back to the executor
        where = "".join(traceback.format_exception(exc))
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:  # noqa: BLE001 - an error that does not cross processes goes back as its text
            exc = StageFailed(f"{stage.name}: rank {rank}: {type(exc).__name__}: {exc}")
        message = ("error", exc, where)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the rank is over: its answer is what is left to do
    conn.send(message)
    conn.close()


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
