"""selskill's progress messages: the `selskill` logger hierarchy, one level for every process of a run.

Modules log to `logging.getLogger(__name__)`; what a command prints as its result (a table,
metrics, a dry-run plan, a one-line error) stays `print`. The level is the recipe key
`log_level` (TRL's `TrainingArguments` key, reused so that one option sets selskill's level
and, in the train stage, transformers'): the recipe is parsed in every process of a run,
stage workers and relaunched trainers included, so each applies the same level
(`selskill.config.parse_sections` calls `configure`). Commands that take no recipe have a
`--log_level` option of their own.

INFO lines read as the plain messages they replace; other levels carry their name. The
handler writes to whatever `sys.stderr` is when a line is emitted, so a redirected or
captured stderr (pytest, a notebook) receives the lines.
"""

from __future__ import annotations

import logging
import sys

ROOT = "selskill"
# TrainingArguments' names: `passive` leaves transformers' level alone and is selskill's INFO,
# `detail` is transformers' DEBUG
LEVELS = {
    "detail": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "passive": logging.INFO,
}
CHOICES = (*LEVELS, *(name.upper() for name in LEVELS))


def level_number(level: str | int) -> int:
    """The `logging` level of a `log_level` value (any case)."""
    if isinstance(level, int):
        return level
    try:
        return LEVELS[str(level).strip().lower()]
    except KeyError:
        raise ValueError(
            f"log_level: {level!r} is not a level; use one of {', '.join(n for n in LEVELS if n != 'detail')}"
        ) from None


class _Stderr(logging.StreamHandler):
    """A stream handler bound to the current `sys.stderr`, not the one at set-up time."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it
        pass


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        return message if record.levelno == logging.INFO else f"{record.levelname.lower()}: {message}"


def configure(level: str | int = "info") -> None:
    """Send the `selskill` loggers' messages at `level` and above to stderr (idempotent)."""
    logger = logging.getLogger(ROOT)
    logger.setLevel(level_number(level))
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(_Format("%(message)s"))
        logger.addHandler(handler)
    # the one handler says it once; a root handler an application configured would repeat it
    logger.propagate = False
