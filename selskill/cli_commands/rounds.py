"""`selskill init`, `round`, `train` and `eval`: the commands that build a round's pieces from a recipe.

Each takes the recipe's command line (`--config RECIPE`, `--key value` overrides) and calls
the function `pipelines/` and `python -m selskill.stages` call for the same job.
"""

from __future__ import annotations

import argparse

from selskill.cli_commands.command import Command


def _train_parser(**kwargs) -> argparse.ArgumentParser:
    """The recipe parser of the sections training reads (run, policy, train)."""
    from selskill.train.run import make_parser

    return make_parser(**kwargs)


def _train(args: argparse.Namespace) -> int:
    from selskill.train.run import launch

    return launch(args.recipe_args)


def _init(args: argparse.Namespace) -> int:
    from selskill.config import load_recipe
    from selskill.stages.round import format_summary, round_summary
    from selskill.stages.table import BY_NAME, describe_only, ensure_init_policy
    from selskill.stages.task_source import ensure_games

    recipe = load_recipe(args.recipe_args)
    if recipe.run.dry_run:
        describe_only(recipe.with_run(round=1, rank=0, world_size=1), "init")
        return 0
    if recipe.policy.model_name_or_path and not recipe.policy.init_sft:
        ensure_games(recipe.run)
        converted = ensure_init_policy(recipe)
        if converted:
            print(f"model_name_or_path {recipe.policy.model_name_or_path} is converted: {converted}")
        else:
            print("model_name_or_path is set: the recipe starts from that model, no init policy to build")
        return 0
    recipe = recipe.with_run(round=1, rank=0, world_size=1)  # the init stage is round 1's first stage
    path = BY_NAME["init"].of(recipe).run()
    print(f"init policy: {path}")
    print(format_summary(round_summary(recipe.with_run(round=0).run)))
    return 0


def _round(args: argparse.Namespace) -> int:
    from selskill.stages.round import main as round_main

    return round_main(args.recipe_args)


def _eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        help="model directory (or hub id when you ask for one); default: the recipe's round `--round` model, "
        "runs/<exp>/round_<round>/train/model (round 0: the init policy)",
    )
    p.add_argument("--games", help="games root (<games>/<split>/...); default: the recipe's games")
    p.add_argument(
        "--out", help="also write the rows and metrics.json to this directory (no-skills rows in headroom/)"
    )


def _eval(args: argparse.Namespace) -> int:
    from selskill.config import load_recipe
    from selskill.stages.evaluate import evaluate_model
    from selskill.stages.policy_source import eval_policy_path

    recipe = load_recipe(args.recipe_args)
    model = args.model or eval_policy_path(recipe.run, must_exist=not recipe.run.dry_run)
    if recipe.run.dry_run:
        where = args.games or f"the recipe's {recipe.run.benchmark} tasks"
        print(
            f"dry run: would evaluate {model} on {recipe.eval.eval_splits} of {where} (eval_mode "
            f"{recipe.eval.eval_mode}){f', writing {args.out}' if args.out else ''}; nothing computed or written"
        )
        return 0
    evaluate_model(recipe, model, games=args.games, out=args.out)
    return 0


COMMANDS = [
    Command(
        "train",
        help="DPO on a round's pair shards (relaunches under the recipe's accelerate config)",
        description="Train round r with DPO on runs/<exp>/round_<r>/label/shards and write "
        "runs/<exp>/round_<r>/train/{model,COMPLETED}. Takes the recipe and any recipe key as an override, e.g. "
        "selskill train --config recipes/dpo_8b.yaml --round 1; add --dry_run to print the effective batch size "
        "and steps without loading weights. With train_accelerate_config set it relaunches itself under "
        "`accelerate launch --config_file <that file>`.",
        run=_train,
        takes_recipe=True,
        recipe_parser=_train_parser,
    ),
    Command(
        "init",
        help="bootstrap the offline init policy (demonstrations + tokenizer + SFT) and report its held-out metrics",
        description="Build the recipe's init policy at runs/<exp>/round_0/train/model (reused when it exists): "
        "generate train games, make demonstrations with useful, premature and redundant skill calls, train a "
        "tokenizer and a small Qwen3 model, SFT it on assistant tokens (then --init_dagger_iters N DAgger "
        "iterations: the expert relabels the policy's own episodes; --init_dagger_from DIR starts them from an "
        "init already built with the same settings); with model_name_or_path and --init_sft true, fine-tune that "
        "model on the same demonstrations instead (assistant tokens, its own chat template; LoRA with use_peft); "
        "then play greedily on the recipe's "
        "held-out split and print SR, Exec. Prec., Skill/ep, ... (runs/<exp>/round_0/eval/metrics.json). "
        "--help lists every init_* key. "
        "Example: selskill init --config recipes/tiny.yaml",
        run=_init,
        takes_recipe=True,
    ),
    Command(
        "round",
        help="run one SelSkill round: sample, branch, fork, label, train, eval (what `make round` runs)",
        description="Run round r of the recipe with round r-1's model; stages and ranks already complete are "
        "skipped. The recipe's executor runs the stages' ranks: local (this machine; local_workers), slurm (one "
        "sbatch --array per stage) or ray (one Ray task per rank). With --dry_run nothing runs: every executor "
        "prints what each stage would run (slurm: its scripts), then the train stage's dry run. Example: selskill round --config recipes/tiny.yaml --round 1; selskill round --config "
        "recipes/dpo_8b.yaml --round 1 --world_size 64 --executor slurm --slurm_partition gpu --dry_run",
        run=_round,
        takes_recipe=True,
    ),
    Command(
        "eval",
        help="greedy evaluation of any model on any games (outside a round too)",
        description="Play every game of the recipe's eval splits under --games (or the recipe's games) greedily "
        "with --model and print the paper's metrics with 95% bootstrap intervals; with --eval_headroom true, "
        "also play the first split without skills and print the skills' headroom (won with vs without them, "
        "per task). Without --model it evaluates the recipe's round --round model (what `make eval ROUND=r` "
        "runs). Example: selskill eval --model runs/tiny/round_1/train/model --games runs/games-tiny --config "
        "recipes/tiny.yaml",
        add_arguments=_eval_arguments,
        run=_eval,
        takes_recipe=True,
    ),
]
