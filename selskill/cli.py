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


def _cmd_play(args: argparse.Namespace) -> int:
    from selskill.agent.play import play_game

    return play_game(args.game_dir, walkthrough=args.walkthrough, grammar=args.grammar)


def _cmd_train(args: argparse.Namespace) -> int:
    from selskill.train.run import launch

    return launch(args.recipe_args)


def _cmd_init(args: argparse.Namespace) -> int:
    from selskill.config import load_recipe
    from selskill.stages.round import format_summary, round_summary
    from selskill.stages.table import BY_NAME, describe_only, ensure_init_policy
    from selskill.stages.task_source import ensure_games

    recipe = load_recipe(args.recipe_args)
    if recipe.train.dry_run:
        describe_only(recipe.with_run(round=1, rank=0, world_size=1), "init")
        return 0
    if recipe.policy.model_name_or_path:
        ensure_games(recipe.run, recipe.games)
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


def _cmd_round(args: argparse.Namespace) -> int:
    from selskill.config import load_recipe
    from selskill.stages.round import run_round

    run_round(load_recipe(args.recipe_args))
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from selskill.config import load_recipe
    from selskill.stages.evaluate import evaluate_model

    recipe = load_recipe(args.recipe_args)
    if recipe.train.dry_run:
        where = args.games or f"the recipe's {recipe.run.benchmark} tasks"
        print(
            f"dry run: would evaluate {args.model} on {recipe.eval.eval_splits} of {where} (eval_mode "
            f"{recipe.eval.eval_mode}){f', writing {args.out}' if args.out else ''}; nothing computed or written"
        )
        return 0
    evaluate_model(recipe, args.model, games=args.games, out=args.out)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from selskill.report import build_report

    rep = build_report(args.exp, n_boot=args.n_boot, seed=args.seed)
    for note in rep.notes:
        print(f"note: {note}")
    print(f"wrote {rep.markdown}, {rep.html} and {len(rep.plots)} plots in {rep.markdown.parent / 'plots'}")
    return 0


def _cmd_export_pairs(args: argparse.Namespace) -> int:
    from selskill.api import export_pairs

    out = export_pairs(
        args.exp,
        args.round,
        args.out,
        window_n=args.window_n,
        recipe=args.recipe,
        push_to_hub=args.push_to_hub,
    )
    pushed = f"; pushed to the hub as {args.push_to_hub}" if args.push_to_hub else ""
    print(f"wrote {out.rows} pairs to {out.data_file} and the dataset card {out.card}{pushed}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from selskill.bench import main as bench_main

    return bench_main(args)


def _cmd_bench_scenes(args: argparse.Namespace) -> int:
    from selskill.bench import main_scenes

    return main_scenes(args)


def _cmd_bench_retrieval(args: argparse.Namespace) -> int:
    from selskill.bench_retrieval import main as bench_retrieval_main

    return bench_retrieval_main(args)


def _cmd_bench_label_agreement(args: argparse.Namespace) -> int:
    from selskill.stages.agreement import run_label_agreement

    run_label_agreement(args.recipe_args, fork_seed=args.fork_seed)
    return 0


def _cmd_import_skills(args: argparse.Namespace) -> int:
    from selskill.skills.importer import import_skill_folder

    report = import_skill_folder(
        args.source,
        args.out,
        prefix=args.prefix,
        max_body_chars=args.max_body_chars,
        overwrite=args.overwrite,
        max_file_bytes=args.max_file_bytes or None,
    )
    for source, reason in report.skipped:
        print(f"skipped {source}: {reason}", file=sys.stderr)
    print(f"{report.summary()}; wrote {len(report.written)} files under {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from selskill.envs.alfworld_gen import SIZES
    from selskill.envs.alfworld_grammar import GRAMMAR_MODES
    from selskill.envs.verify import DEFAULT_MAX_STEPS, EXPERTS
    from selskill.skills.importer import MAX_FILE_BYTES

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
        choices=list(SIZES),
        help="the scale ladder: tiny (3-5 receptacles, 4-8 objects: the CPU scale), small (8-15, 15-30), "
        "real (the floor plan's full receptacle set); default small",
    )
    p.add_argument("--task-types", nargs="+", metavar="TYPE", help="only these task types (default: all six)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_gen_games)

    p = sub.add_parser(
        "verify-games",
        help="check every game loads, has a task, is not already won, and can be won",
        description="Load every game under DIR (a gen-games root, or real ALFWorld data with json_2.1.1/) in "
        "the real engine and show it can be won: a game with a stored walkthrough (generated games) replays "
        "it; a game without one (real ALFWorld data) is played by an expert, selskill's own (no skill calls; "
        "--expert ours, the default) or alfworld's hand-coded one (--expert handcoded). Old-grammar games "
        "are patched in memory (--grammar strict refuses them). Prints 'won N (by ...); lost L (reasons); "
        "skipped S (reasons); ...' and then 'N/M winnable'; a game an expert loses counts as not winnable. "
        "Exits 1 unless all are winnable.",
    )
    p.add_argument("dir", help="games root")
    p.add_argument("--split", nargs="+", help="only these splits (default: all present but valid_train)")
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
    p.add_argument(
        "--grammar",
        choices=GRAMMAR_MODES,
        default="patch",
        help="old-grammar games (put X in/on Y): patch in memory (default) or refuse (strict)",
    )
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
    p.add_argument(
        "--walkthrough",
        action="store_true",
        help="replay the game's stored walkthrough instead; a game without one (real ALFWorld data) is played "
        "by selskill's expert (no skill calls), step by step",
    )
    p.add_argument(
        "--grammar",
        choices=GRAMMAR_MODES,
        default="patch",
        help="an old-grammar game (put X in/on Y): patch in memory (default) or refuse (strict)",
    )
    p.set_defaults(func=_cmd_play)

    # Everything after `train` is the recipe's command line (TrlParser owns it, --help included); the
    # prefix char keeps argparse from reading --config & co. as options of this subparser.
    p = sub.add_parser(
        "train",
        add_help=False,
        prefix_chars="+",
        help="DPO on a round's pair shards (relaunches under the recipe's accelerate config)",
        description="Train round r with DPO on runs/<exp>/round_<r>/label/shards and write "
        "runs/<exp>/round_<r>/train/{model,COMPLETED}. Takes the recipe and any recipe key as an override, e.g. "
        "selskill train --config recipes/dpo_8b.yaml --round 1; add --dry_run to print the effective batch size "
        "and steps without loading weights. With train_accelerate_config set it relaunches itself under "
        "`accelerate launch --config_file <that file>`.",
    )
    p.add_argument(
        "recipe_args", nargs=argparse.REMAINDER, help="--config RECIPE, --key value overrides, --help"
    )
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser(
        "init",
        help="bootstrap the offline init policy (demonstrations + tokenizer + SFT) and report its held-out metrics",
        description="Build the recipe's init policy at runs/<exp>/round_0/train/model (reused when it exists): "
        "generate train games, make demonstrations with useful, premature and redundant skill calls, train a "
        "tokenizer and a small Qwen3 model, SFT it on assistant tokens (then --init_dagger_iters N DAgger "
        "iterations: the expert relabels the policy's own episodes; --init_dagger_from DIR starts them from an "
        "init already built with the same settings); then play greedily on the recipe's "
        "held-out split and print SR, Exec. Prec., Skill/ep, ... (runs/<exp>/round_0/eval/metrics.json). "
        "Every init_* key: python pipelines/round.py --help. "
        "Example: selskill init --config recipes/tiny.yaml",
    )
    p.set_defaults(takes_recipe=True)  # --config RECIPE and --key value overrides pass through to TrlParser
    p.set_defaults(func=_cmd_init)

    p = sub.add_parser(
        "round",
        help="run one SelSkill round: sample, branch, fork, label, train, eval (what `make round` runs)",
        description="Run round r of the recipe with round r-1's model; stages and ranks already complete are "
        "skipped. The recipe's executor runs the stages' ranks: local (this machine; local_workers), slurm (one "
        "sbatch --array per stage) or ray (one Ray task per rank). With --dry_run nothing runs: every executor "
        "prints what each stage would run (slurm: its scripts), then the train stage's dry run. Example: selskill round --config recipes/tiny.yaml --round 1; selskill round --config "
        "recipes/dpo_8b.yaml --round 1 --world_size 64 --executor slurm --slurm_partition gpu --dry_run",
    )
    p.set_defaults(takes_recipe=True)  # --config RECIPE and --key value overrides pass through to TrlParser
    p.set_defaults(func=_cmd_round)

    p = sub.add_parser(
        "eval",
        help="greedy evaluation of any model on any games (outside a round too)",
        description="Play every game of the recipe's eval splits under --games (or the recipe's games) greedily "
        "with --model and print the paper's metrics with 95% bootstrap intervals; with --eval_headroom true, "
        "also play the first split without skills and print the skills' headroom (won with vs without them, "
        "per task). Example: selskill eval --model runs/tiny/round_1/train/model --games runs/games-tiny --config "
        "recipes/tiny.yaml",
    )
    p.add_argument("--model", required=True, help="model directory (or hub id when you ask for one)")
    p.add_argument("--games", help="games root (<games>/<split>/...); default: the recipe's games")
    p.add_argument(
        "--out", help="also write the rows and metrics.json to this directory (no-skills rows in headroom/)"
    )
    p.set_defaults(takes_recipe=True)  # --config RECIPE and --key value overrides pass through to TrlParser
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser(
        "report",
        help="write runs/<exp>/report.{md,html} and plots: metrics across rounds, pair yield, entropy at branches",
        description="Collect every round of an experiment into runs/<exp>/report.md and report.html (plots "
        "embedded) plus runs/<exp>/plots/*.png: the Table-1 metrics per round and split with 95% intervals and "
        "the paired SR difference vs init, pair yield per round, entropy after invoke/skip branch points, skill "
        "calls per episode, chosen-vs-rejected steps. Missing rounds or stages are skipped with a note. "
        "Example: selskill report --exp runs/tiny",
    )
    p.add_argument("--exp", required=True, help="experiment directory (runs/<exp>)")
    p.add_argument("--n-boot", type=int, default=2000, help="paired-bootstrap resamples for ΔSR")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser(
        "export-pairs",
        help="write a round's preference pairs in TRL's conversational format (prompt/chosen/rejected messages)",
        description="Read round R's label stage of runs/<exp> (every rank complete and verified) and write "
        "OUT/data/train-00000-of-00001.parquet (prompt, chosen and rejected as lists of role/content messages, "
        "plus the pair's kind, label reason, arms, task, branch and loss-window turns) and OUT/README.md (a "
        "dataset card). Any DPO trainer that reads conversational preference data (trl.DPOTrainer) can train "
        "on it. Example: selskill export-pairs --exp runs/tiny --round 1 --out exports/tiny-r1",
    )
    p.add_argument("--exp", required=True, help="experiment directory (runs/<exp>)")
    p.add_argument("--round", type=int, required=True, help="the round whose pairs to export")
    p.add_argument("--out", required=True, help="output directory (data/*.parquet and README.md)")
    p.add_argument(
        "--window-n",
        default="recipe",
        help="local pairs' loss window the *_window_turns columns name: a number of assistant turns, 'all', or "
        "'recipe' (default: what the round's train stage recorded, else the recipe default)",
    )
    p.add_argument("--recipe", help="the recipe file's name, for the dataset card (a run does not record it)")
    p.add_argument(
        "--push-to-hub", metavar="REPO", help="also upload to this hub dataset repo (needs network)"
    )
    p.set_defaults(func=_cmd_export_pairs)

    p = sub.add_parser(
        "bench",
        help="benchmarks (bench rollout: speed; bench retrieval: skill retrieval R@k; bench label-agreement: "
        "whether a branch point forked twice gets the same label)",
        description="Benchmarks that print their figures (record them in docs/benchmarks.md).",
    )
    bsub = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    b = bsub.add_parser(
        "rollout",
        help="episodes/s at 1 vs 16 vs 32 concurrent episodes, fork prefix reuse, cost of exact entropy",
        description="Plays the same episodes one at a time and 16 / 32 at once (and 32 at once with the episode "
        "process off, then with padded instead of ragged prefill), forks K=4 continuations from an "
        "800-token prefix with and without prefix KV reuse, and times generation with and without exact "
        "full-vocabulary entropy. Uses --model (e.g. runs/tiny/round_0/train/model) or an untrained tiny model.",
    )
    b.add_argument("--model", help="policy directory (default: an untrained tiny Qwen3)")
    b.add_argument("--games", help="games root with a valid_seen split (default: 12 generated games)")
    b.add_argument("--episodes", type=int, default=32, help="episodes per setting (default 32)")
    b.add_argument("--max-env-steps", type=int, default=10, help="env-step budget per episode (default 10)")
    b.add_argument("--out", help="also write the JSON figures here")
    b.set_defaults(func=_cmd_bench)
    b = bsub.add_parser(
        "scenes",
        help="receptacles, objects, co-located receptacles and admissible commands per scene, per games root",
        description="Reads each game's PDDL problem (real ALFWorld data or gen-games output, measured by the same "
        "rule) and prints the means per root: receptacles, objects, the share of scenes with co-located "
        "receptacles and, with --admissible (loads every game), the admissible commands at the start. "
        "Example: selskill bench scenes $ALFWORLD_DATA runs/games-tiny --split train --admissible",
    )
    b.add_argument("dirs", nargs="+", help="games roots")
    b.add_argument("--split", nargs="+", help="only these splits (default: all present but valid_train)")
    b.add_argument(
        "--admissible", action="store_true", help="also count admissible commands at start (slower)"
    )
    b.add_argument("--out", help="also write the JSON figures here")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.set_defaults(func=_cmd_bench_scenes)
    b = bsub.add_parser(
        "retrieval",
        help="R@1/3/5 of the retrieval modes (all, task, progress) x scorers on BFCL and ALFWorld, up to ~1,000 skills",
        description="Replays BFCL's ground truth and ALFWorld expert demonstrations and, at every decision point, "
        "checks whether a skill relevant to the next move is in the top k of each retrieval mode (all truncated, "
        "task, progress) and scorer (bm25, dense, fused), with the library padded by seeded distractors. "
        "Dense and fused need the encoder offline (extra `dense`); they are skipped with a note otherwise.",
    )
    b.add_argument("--envs", nargs="+", default=["bfcl", "alfworld"], choices=["bfcl", "alfworld"])
    b.add_argument(
        "--sizes", default="own,68,250,1000", help="library sizes ('own' = the benchmark's skills)"
    )
    b.add_argument(
        "--scorers", nargs="+", default=["bm25", "dense", "fused"], choices=["bm25", "dense", "fused"]
    )
    b.add_argument(
        "--dense-model", default="sentence-transformers/all-MiniLM-L6-v2", help="hub id or local path"
    )
    b.add_argument("--fusion", default="rrf", choices=["rrf", "weighted"])
    b.add_argument(
        "--record-weight", type=float, default=0.5, help="progress: the record's share vs the step"
    )
    b.add_argument("--bfcl-split", default="test", choices=["train", "test"])
    b.add_argument("--bfcl-limit", type=int, help="only the first N tasks of the split")
    b.add_argument("--alfworld-games", help="games root (default: tiny games generated in a temp folder)")
    b.add_argument("--alfworld-split", default="valid_seen")
    b.add_argument("--alfworld-per-type", type=int, default=10, help="games per task type when generating")
    b.add_argument("--pseudo-skills", help="JSON {task_id: [pseudo-skill text, ...]} for task mode")
    b.add_argument("--seed", type=int, default=0, help="distractor and demonstration seed")
    b.add_argument("--out", help="also write retrieval.json and retrieval.md to this directory")
    b.set_defaults(func=_cmd_bench_retrieval)
    b = bsub.add_parser(
        "label-agreement",
        allow_abbrev=False,  # every other option is a recipe key, passed through whole
        help="fork a round's branch points again with another seed and measure whether their labels agree",
        description="Forks round r's branch points a second time with another fork seed, in the experiment "
        "runs/<exp>-refork-seed<S>/ (its sample and branch stages and the policy it starts from are links "
        "to runs/<exp>/), labels them with the same recipe, and compares per branch point the arm each "
        "label chose (invoke, skip, or none where the label dropped the point): the share with the same "
        "outcome, Cohen's kappa and the confusion table, printed and written to "
        "runs/<exp>-refork-seed<S>/round_<r>/label_agreement.json. The round's own fork and label stages must "
        "have been computed with the same recipe (checked through their recorded inputs; a complete rank is "
        "never recomputed). Recipe keys (--config, --exp, --round, ...) pass through. "
        "Example: selskill bench label-agreement --config recipes/tiny.yaml --exp tiny --round 1 --fork-seed 1",
    )
    b.add_argument(
        "--fork-seed",
        type=int,
        help="seed of the second fork (default: the recipe's seed + 1); the recipe's own --seed is the first's",
    )
    b.set_defaults(takes_recipe=True)  # --config RECIPE and --key value overrides pass through to TrlParser
    b.set_defaults(func=_cmd_bench_label_agreement)

    p = sub.add_parser(
        "import-skills",
        help="import a folder of public SKILL.md files as memory skills",
        description="Find every SKILL.md below SOURCE (Agent Skills format: name, description, Markdown body), "
        "rewrite each as a selskill memory skill (snake_case name, its description and body) and write "
        "OUT/<name>/SKILL.md, loadable with load_skills. Files without a description or body are skipped.",
    )
    p.add_argument("source", help="folder holding <skill>/SKILL.md files, at any depth")
    p.add_argument("--out", required=True, help="where to write <name>/SKILL.md")
    p.add_argument("--prefix", default="", help="prepended to every name (e.g. pub_)")
    p.add_argument("--max-body-chars", type=int, help="cut longer bodies (marked as truncated)")
    p.add_argument("--overwrite", action="store_true", help="replace skills already in OUT")
    p.add_argument(
        "--max-file-bytes",
        type=int,
        default=MAX_FILE_BYTES,
        help=f"skip a larger SKILL.md unread (default {MAX_FILE_BYTES:,}; 0 = no limit)",
    )
    p.set_defaults(func=_cmd_import_skills)
    _add_log_level(
        [p for name, p in sub.choices.items() if name not in ("train", "bench")], bsub.choices.values()
    )
    return parser


def _add_log_level(*parsers) -> None:
    """`--log_level` on every subcommand; those that take a recipe have it as the recipe key `log_level`."""
    from selskill.logs import CHOICES

    for group in parsers:
        for p in group:
            if not p.get_default("takes_recipe"):
                p.add_argument(
                    "--log_level",
                    "--log-level",
                    default="info",
                    choices=CHOICES,
                    metavar="LEVEL",
                    help="how much to say on stderr: debug, info (default), warning, error or critical",
                )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if getattr(args, "takes_recipe", False):
        args.recipe_args = unknown  # --config RECIPE and --key value overrides, checked by TrlParser
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    from selskill.errors import run_main
    from selskill.logs import configure

    configure(getattr(args, "log_level", "info"))  # a recipe's log_level applies once it is parsed
    return run_main(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
