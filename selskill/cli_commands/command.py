"""One subcommand of `selskill`: its name, its help, the options it adds and what it runs.

Commands are values so that the `selskill` parser is one loop over lists (`selskill.cli`),
and so that a benchmark contributes its own commands (top-level ones and `selskill bench`
ones) as lists of the same shape without the CLI naming the benchmark. This module imports
nothing of selskill, so a benchmark's package builds its commands without importing the CLI.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """`add_arguments` of a command whose options are all the recipe's."""


@dataclass(frozen=True)
class Command:
    """`selskill <name>`: `add_arguments(parser)` builds its options, `run(args)` returns the exit status.

    `takes_recipe`: the arguments the command does not know are the recipe's (`--config RECIPE`,
    `--key value` overrides), handed to `run` as `args.recipe_args` for TrlParser to check; the
    command's own options are then never abbreviated, the recipe key `log_level` sets the level,
    and `--help` lists the recipe's keys after the command's own options. `recipe_parser(**kwargs)`:
    the TrlParser whose keys those are, built with argparse's keywords (`prog`, ...), as TRL's
    scripts' `make_parser(prog=)`; None: every section's (`selskill.config.make_parser`).
    `log_level`: whether the command has its own `--log_level` option (no recipe parses its command line).
    `subcommands`: a group (`selskill bench`) that runs one of them instead of `run`.
    """

    name: str
    help: str
    description: str
    run: Callable[[argparse.Namespace], int] | None = None
    add_arguments: Callable[[argparse.ArgumentParser], None] = no_arguments
    takes_recipe: bool = False
    recipe_parser: Callable[..., argparse.ArgumentParser] | None = None
    log_level: bool = True
    subcommands: tuple[Command, ...] = ()
