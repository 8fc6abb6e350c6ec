"""BFCL's own commands: `selskill bench bfcl-gt` (they reach the CLI through the registry)."""

from __future__ import annotations

import argparse

from selskill.cli_commands.command import Command


def _gt_arguments(p: argparse.ArgumentParser) -> None:
    from selskill.benchmarks.bfcl.gt_bench import add_arguments

    add_arguments(p)


def _gt(args: argparse.Namespace) -> int:
    from selskill.benchmarks.bfcl.gt_bench import main

    return main(args)


BENCH_COMMANDS = [
    Command(
        "bfcl-gt",
        help="BFCL's ground truth through the env and BFCL's checker: tasks won per category and sweep",
        description="Plays every task's ground truth through BfclEnv, one call per step, and lets BFCL's own "
        "checker judge it, in four sweeps: verbatim (the data's text, positional arguments included), strict "
        "(keyword form), bfcl-rule (keyword form, withheld functions callable) and drop-last (each task's last "
        "call left out: all should lose). Prints tasks won / played per category and the wall time. "
        "Example: OMP_NUM_THREADS=1 selskill bench bfcl-gt --categories base miss_func",
        add_arguments=_gt_arguments,
        run=_gt,
    ),
]
