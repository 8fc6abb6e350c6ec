"""The `selskill` command line: one subcommand per user-facing job.

Subcommands import their heavy dependencies lazily so `selskill --help` stays instant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _cmd_gen_games(args: argparse.Namespace) -> int:
    from selskill.envs.alfworld_gen import TASK_TYPES, generate_games

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


def _cmd_verify_games(args: argparse.Namespace) -> int:
    from selskill.envs.alfworld import find_games
    from selskill.envs.verify import verify_games

    index = find_games(args.dir, splits=args.split)
    if index.skipped:
        print(index.summary(), file=sys.stderr)
    report = verify_games(index, progress=not args.quiet)
    for task_id, reason in report.failures:
        print(f"NOT WINNABLE {task_id}: {reason}", file=sys.stderr)
    print(f"{report.winnable}/{report.total} winnable")
    return 0 if report.ok else 1


def _cmd_play(args: argparse.Namespace) -> int:
    from selskill.agent.play import play_game

    return play_game(args.game_dir, walkthrough=args.walkthrough)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="selskill",
        description="Preference data and DPO training that teach LLM agents when to invoke a skill and when to "
        "skip it (SelSkill). Each subcommand has its own --help.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "gen-games",
        help="generate ALFWorld households offline for all six task types",
        description="Write ALFWorld games for the real TextWorld/PDDL engine from alfworld's shipped domain, "
        "grammar and floor plans, as OUT/<split>/<task>/<trial>/{game.tw-pddl,traj_data.json}. The same "
        "seed always writes byte-identical files.",
    )
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
        choices=["small", "real"],
        help="small: ~8-15 receptacles and 15-30 objects; real: the floor plan's full receptacle set",
    )
    p.add_argument("--task-types", nargs="+", metavar="TYPE", help="only these task types (default: all six)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_gen_games)

    p = sub.add_parser(
        "verify-games",
        help="check every game loads, has a task, is not already won, and its known solution wins",
        description="Load every game under DIR (a gen-games root, or real ALFWorld data with json_2.1.1/) in "
        "the real engine and replay its known solution. Prints 'N/M winnable'; exits 1 unless all are.",
    )
    p.add_argument("dir", help="games root")
    p.add_argument("--split", nargs="+", help="only these splits (default: all present)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_verify_games)

    p = sub.add_parser(
        "play",
        help="play a game in the terminal (actions and skill calls), or replay its solution",
        description="Play GAME_DIR (a trial directory with game.tw-pddl) as the agent would: type an admissible "
        "command, or a skill call such as /heat_object or "
        '<tool_call>{"name": "heat_object"}</tool_call>. Type /skills to list skills, /quit to stop.',
    )
    p.add_argument("game_dir", help="trial directory holding game.tw-pddl and traj_data.json")
    p.add_argument("--walkthrough", action="store_true", help="replay the game's known solution instead")
    p.set_defaults(func=_cmd_play)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError) as exc:
        print(f"selskill {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
