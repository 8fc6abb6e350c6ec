"""DPO on a round's pairs: the train stage as a script (docs/design.md, "The train stage").

    python -m selskill.train.run --config recipes/tiny.yaml --round 1          (one process)
    accelerate launch --config_file recipes/accelerate/zero3.yaml -m selskill.train.run \\
        --config recipes/dpo_8b.yaml --round 1                                (many)
    selskill train --config recipes/dpo_8b.yaml --round 1   (relaunches under train_accelerate_config)
    python -m selskill.train.run --config recipes/dpo_8b.yaml --dry_run      (what it would do)

The recipe is parsed into the only sections training reads (run, policy, train), so training
loads none of the stage, environment or init code. The stage itself (`selskill.train.stage`),
its dataset, checkpoints, wandb run, launcher and dry run live in the modules beside this one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from selskill.train.dry_run import dry_run
from selskill.train.launch import init_cpu_deepspeed, relaunch, under_launcher
from selskill.train.stage import run_train


def _sections() -> tuple[type, ...]:
    from selskill.config import PolicyConfig, RunConfig
    from selskill.config.train import TrainConfig

    return (RunConfig, PolicyConfig, TrainConfig)


def make_parser(**kwargs):
    """The recipe parser over the sections training reads (`selskill train --help` lists their keys);
    `kwargs` are argparse's (`prog`, ...)."""
    from selskill.config import make_parser as recipe_parser

    return recipe_parser(_sections(), **kwargs)


def parse(argv: Sequence[str] | None = None) -> tuple:
    """(RunConfig, PolicyConfig, TrainConfig) of a recipe plus command-line overrides.

    The other sections' keys are accepted unchecked (`selskill.config.parse_sections`).
    """
    from selskill.config import parse_sections

    init_cpu_deepspeed()  # before the configs: TrainingArguments sets up the distributed state
    return parse_sections(argv, _sections())


def main(run, policy, cfg) -> None:
    """Train (or dry-run) in this process; under `accelerate launch`, in every process."""
    if run.dry_run:
        dry_run(run, policy, cfg)
    else:
        run_train(run, policy, cfg)


def cli_main(argv: Sequence[str] | None = None) -> int:
    """`main` on a command line: its exit status, or an error's one line (`selskill.errors`), as every
    other entry point."""
    from selskill.errors import run_main

    return run_main(lambda: main(*parse(argv)))


def launch(argv: Sequence[str]) -> int:
    """`selskill train`: relaunch under the recipe's accelerate config, or train here when none is set."""
    argv = list(argv)
    return launch_parsed(*parse(argv), argv)


def launch_parsed(run, policy, cfg, argv: Sequence[str] | None) -> int:
    """`launch` on configs already parsed (a round's train stage).

    `argv` is the command line they were parsed from: the processes `accelerate launch`
    starts must build their configs themselves, after the distributed state exists.
    """
    if run.dry_run or not cfg.train_accelerate_config or under_launcher():
        main(run, policy, cfg)
        return 0
    return relaunch(cfg.train_accelerate_config, list(argv) if argv is not None else None)


if __name__ == "__main__":
    sys.exit(cli_main())
