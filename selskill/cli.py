"""The `selskill` command line: one subcommand per user-facing job.

Each subcommand is a `Command` (`selskill/command.py`) in a list; `build_parser` loops over
the lists: the core ones (`selskill/cli_commands/`), which name no benchmark, and those a
benchmark adds (`benchmark_commands`). Subcommands import their heavy dependencies lazily so
`selskill --help` stays instant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from selskill.command import Command


def benchmark_commands() -> tuple[list[Command], list[Command]]:
    """The commands every registered benchmark adds: (top-level ones, `selskill bench` ones)."""
    from selskill.registry import benchmark, names

    specs = [benchmark(name) for name in names()]
    return [c for b in specs for c in b.commands()], [c for b in specs for c in b.bench_commands()]


def commands() -> list[Command]:
    """Every top-level command, in the order `selskill --help` lists them."""
    from selskill.cli_commands import bench, outputs, rounds

    top, benches = benchmark_commands()
    group = Command(
        "bench",
        help="benchmarks (bench rollout: speed; bench retrieval: skill retrieval R@k; bench label-agreement: "
        "whether a branch point forked twice gets the same label)",
        description="Benchmarks that print their figures (record them in docs/benchmarks.md).",
        subcommands=(*benches, *bench.COMMANDS),
    )
    return [*top, *rounds.COMMANDS, outputs.REPORT, outputs.EXPORT_PAIRS, group, outputs.IMPORT_SKILLS]


def add_commands(sub: argparse._SubParsersAction, cmds: Sequence[Command]) -> None:
    """One parser per command under `sub`; a group's commands under its own."""
    for cmd in cmds:
        # where the recipe's keys share the command line, none may be read as an abbreviated option
        options = {"allow_abbrev": not cmd.takes_recipe, **cmd.parser_options}
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.description, **options)
        cmd.add_arguments(p)
        if cmd.subcommands:
            group = p.add_subparsers(dest=cmd.name, metavar=cmd.name.upper(), required=True)
            add_commands(group, cmd.subcommands)
            continue
        p.set_defaults(func=cmd.run, takes_recipe=cmd.takes_recipe)
        if cmd.log_level and not cmd.takes_recipe:  # a recipe has it as the key `log_level`
            _add_log_level(p)


def _add_log_level(p: argparse.ArgumentParser) -> None:
    from selskill.logs import CHOICES

    p.add_argument(
        "--log_level",
        "--log-level",
        default="info",
        choices=CHOICES,
        metavar="LEVEL",
        help="how much to say on stderr: debug, info (default), warning, error or critical",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="selskill",
        description="Preference data and DPO training that teach LLM agents when to invoke a skill and when to "
        "skip it (SelSkill). Each subcommand has its own --help.",
    )
    add_commands(parser.add_subparsers(dest="command", metavar="COMMAND", required=True), commands())
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.takes_recipe:
        args.recipe_args = unknown  # --config RECIPE and --key value overrides, checked by TrlParser
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    from selskill.errors import run_main
    from selskill.logs import configure

    configure(getattr(args, "log_level", "info"))  # a recipe's log_level applies once it is parsed
    return run_main(lambda: args.func(args))


def command_main(*words: str):
    """`main` of a script that is `selskill <words...>`: its command-line arguments follow the words."""

    def script_main(argv: Sequence[str] | None = None) -> int:
        return main([*words, *(sys.argv[1:] if argv is None else argv)])

    return script_main


if __name__ == "__main__":
    sys.exit(main())
