"""Where an `EpisodeHost` runs: in a child process of its own, or in this one.

The environment is pure Python and the policy's forward passes are torch kernels, so on a
CPU the two only overlap in separate processes (a thread was measured: the GIL serialises
them). `ProcessHost` and `LocalHost` answer the same calls (`submit` a host method, then
`result` in order), so the runner drives either the same way; a child needs the host's
arguments to pickle (`picklable`), e.g. an env factory that is a `functools.partial`.
"""

from __future__ import annotations

from collections import deque

from selskill.agent.episode_host import EpisodeHost
from selskill.errors import start_shielded


class ProcessHost:
    """An `EpisodeHost` in a child process; calls are queued and answered in order."""

    def __init__(self, host_args: tuple):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # no fork of a process that holds torch threads
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=serve_host, args=(child, host_args), daemon=True, name="selskill-episodes"
        )
        start_shielded(self._proc)  # Ctrl-C stops the stage in this process, which closes the host
        child.close()

    def submit(self, method: str, *args) -> None:
        self._conn.send((method, args))

    def result(self):
        try:
            status, value = self._conn.recv()
        except (EOFError, ConnectionError) as exc:
            raise RuntimeError(
                f"the episode host process died (exit code {self._proc.exitcode}); rerun the stage, "
                "or set env_overlap: false to play episodes in this process"
            ) from exc
        if status == "error":
            raise RuntimeError(f"the episode host process failed:\n{value}")
        return value

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.terminate()
        self._conn.close()


class LocalHost:
    """The same call interface as `ProcessHost`, answered at once in this process."""

    def __init__(self, host: EpisodeHost):
        self.host = host
        self._answers: deque = deque()

    def submit(self, method: str, *args) -> None:
        self._answers.append(getattr(self.host, method)(*args))

    def result(self):
        return self._answers.popleft()

    def close(self) -> None:
        pass


def serve_host(conn, host_args: tuple) -> None:
    import signal
    import traceback

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the stage's, which closes the host

    host = EpisodeHost(*host_args)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        method, args = message
        try:
            conn.send(("ok", getattr(host, method)(*args)))
        except Exception:
            conn.send(("error", traceback.format_exc()))


def picklable(obj) -> bool:
    import pickle

    try:
        pickle.dumps(obj)
    except Exception:
        return False
    return True
