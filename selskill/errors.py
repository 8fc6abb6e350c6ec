"""How every entry point ends on an error a person can act on: one line, `error: <what is wrong and the fix>`.

`selskill`, `pipelines/*.py`, `python -m selskill.stages` and `python -m selskill.train.run`
all run their work through `run_main`, so one error reads the same whichever of them met it
(a traceback hides the line that matters under thirty lines that do not).

Exit status 2: the command cannot run as given, and the message says what to change: a bad
value or path (`ValueError`, `FileNotFoundError`, `FileExistsError`), or an input that
conflicts with what is on disk (an `ExplainedError`: a rank refused for other recorded inputs
or another writer, a shard that does not match its marker). Exit status 1: the command ran
and failed (`StageFailed`: ranks that raised; any other `OSError`, such as a full disk,
which names the file). An error that stands for a relaunched process carries that process's
status (`status=`), so the same bad input exits 2 however it was reached. A module of an extra the install lacks exits 2 naming the extra to
add. Any other exception is a bug and keeps its traceback.

Ctrl-C ends the same way: one line, exit status 130. Only the entry point's own process sees
it: the processes it starts for ranks or episodes are started with SIGINT blocked
(`start_shielded`), and the process that started them stops them, so a terminal's Ctrl-C
prints no traceback from any of them.
"""

from __future__ import annotations

import errno
import importlib.util
import signal
import sys
from collections.abc import Callable, Iterable, Sequence

BAD_INPUT = (ValueError, FileNotFoundError, FileExistsError)
INTERRUPTED = 130  # the exit status of a process stopped by Ctrl-C, as a shell reports it
INTERRUPTED_LINE = (
    "interrupted: rerun the same command to resume (complete ranks and train checkpoints are kept)"
)

# top-level module -> the extra of the core that installs it (pyproject.toml): a subcommand that needs a
# package the install lacks says which extra to add instead of a traceback. A benchmark plugin names its own
# (`selskill.registry.Benchmark.extra` and `requires`), which its registration declares (`declare_extra`).
EXTRA_OF = {
    "torch": "train",
    "transformers": "train",
    "tokenizers": "train",
    "trl": "train",
    "accelerate": "train",
    "bm25s": "train",
    "deepspeed": "deepspeed",
    "wandb": "wandb",
    "vllm": "vllm",
    "ray": "ray",
}
_DECLARED: dict[str, str] = {}  # the plugins' modules -> their extras


def declare_extra(extra: str, modules: Iterable[str]) -> None:
    """Make `extra` what a missing module of `modules` names as its install."""
    _DECLARED.update(dict.fromkeys(modules, extra))


def extras() -> dict[str, str]:
    """Every module a missing-module error names an extra for: the core's and those plugins declared."""
    return {**EXTRA_OF, **_DECLARED}


def require_modules(what: str, modules: Sequence[str], extra: str | None) -> None:
    """Raise a one-line `MissingPackage` naming the modules of `modules` that are not installed and the install
    that adds them, before any work starts rather than deep inside it (datatrove's `_requires_dependencies`)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        fix = f"pip install 'selskill[{extra}]'" if extra else f"pip install {' '.join(missing)}"
        verb = "is" if len(missing) == 1 else "are"
        raise MissingPackage(f"{what} needs {', '.join(missing)}, which {verb} not installed: {fix}")


class ExplainedError(RuntimeError):
    """An error whose message says what is wrong and the fix: entry points print it without a traceback."""

    status = 2  # the exit status of an entry point that ends on it

    def __init__(self, *args: object, status: int | None = None):
        """`status`: this error's exit status, where a class's own does not decide it (a relaunched process's)."""
        super().__init__(*args)
        if status is not None:
            self.status = status


DISK_FULL_WORDS = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from, is a full disk or an exceeded quota: safetensors and
    torch write through their own code and say so only in their message (`... (os error 28)`)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(word in str(exc) for word in DISK_FULL_WORDS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class MissingPackage(ExplainedError, ImportError):
    """A package the install lacks, with the command that installs it (for one no extra installs, or with
    more to say than the extra): one line and exit status 2 like a missing extra, and still an ImportError for
    code that carries on without the package."""


def error_message(exc: BaseException | str) -> str:
    """The message of `exc` as an entry point prints it; an OSError names its file first."""
    if isinstance(exc, str):
        return exc
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        files = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 is not None else "")
        message = f"{files}: {exc.strerror}"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            message += " (free space on that filesystem, then rerun: complete ranks are skipped)"
        return message
    return str(exc) or type(exc).__name__


def _missing_extra(exc: BaseException) -> str | None:
    """The extra that installs the module `exc` did not find (None: not a module of an extra)."""
    if not isinstance(exc, ModuleNotFoundError):
        return None
    return extras().get((exc.name or "").partition(".")[0])


def exit_status(exc: BaseException) -> int | None:
    """The exit status an entry point ends with on `exc`: 2, the command cannot run as given (a rerun as it
    is fails alike); 1, it ran and failed; None, a bug (its traceback is kept)."""
    if isinstance(exc, BAD_INPUT):
        return 2
    if isinstance(exc, ExplainedError):
        return exc.status
    if _missing_extra(exc) is not None:
        return 2
    if isinstance(exc, OSError):
        return 1
    return None


def run_main(main: Callable[[], int | None], out=None) -> int:
    """`main()`'s exit status, or an error's one line on stderr and its status (`exit_status`)."""
    try:
        return int(main() or 0)
    except Exception as exc:
        status = exit_status(exc)
        if status is None:
            raise
        extra = _missing_extra(exc)
        error = (
            f"this needs {exc.name.partition('.')[0]}, which is not installed: pip install 'selskill[{extra}]'"
            if extra is not None
            else exc
        )
    except OSError as exc:
        status, error = 1, exc
    except KeyboardInterrupt:
        print(INTERRUPTED_LINE, file=out or sys.stderr, flush=True)
        return INTERRUPTED
    print(f"error: {error_message(error)}", file=out or sys.stderr, flush=True)
    return status


def start_shielded(process) -> None:
    """`process.start()` with SIGINT blocked, which the child keeps: a terminal's Ctrl-C, sent to every
    process of the foreground group, reaches only the process that started it, which stops its children.

    A blocked signal stays pending here and is raised once the start is done, so none is lost. The
    resource tracker is started first: starting it unblocks SIGINT (`multiprocessing.resource_tracker`).
    """
    if not hasattr(signal, "pthread_sigmask"):
        process.start()
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
