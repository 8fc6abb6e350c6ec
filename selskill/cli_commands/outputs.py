"""`selskill report`, `export-pairs` and `import-skills`: what goes out of a run, and skills that come in."""

from __future__ import annotations

import argparse
import sys

from selskill.cli_commands.command import Command


def _report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--exp",
        help="the experiment directory (runs/<exp>); with --config, the experiment's name instead, as every "
        "recipe command takes it (default: the recipe's `exp`)",
    )
    p.add_argument(
        "--config",
        metavar="RECIPE",
        help="report the experiment this recipe writes (<runs_dir>/<exp>, as `selskill round` resolves it)",
    )
    p.add_argument("--n-boot", "--n_boot", type=int, default=2000, help="paired-bootstrap resamples for ΔSR")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")


def _experiment_dir(args: argparse.Namespace):
    """The folder to report: --exp itself, or the recipe's <runs_dir>/<exp> (the name --exp overrides)."""
    if not args.config:
        if not args.exp:
            raise SystemExit("error: pass --exp runs/<exp>, or --config RECIPE [--exp NAME]")
        return args.exp
    from selskill.config import load_recipe
    from selskill.data.layout import exp_dir

    run = load_recipe(["--config", args.config, *(["--exp", args.exp] if args.exp else [])]).run
    return exp_dir(run.runs_dir, run.exp)


def _report(args: argparse.Namespace) -> int:
    from selskill.report import build_report

    rep = build_report(_experiment_dir(args), n_boot=args.n_boot, seed=args.seed)
    for note in rep.notes:
        print(f"note: {note}")
    print(f"wrote {rep.markdown}, {rep.html} and {len(rep.plots)} plots in {rep.markdown.parent / 'plots'}")
    return 0


def _export_pairs_arguments(p: argparse.ArgumentParser) -> None:
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
        "--overwrite",
        action="store_true",
        help="write into an OUT that already holds files (the export's own replace theirs)",
    )
    p.add_argument(
        "--push-to-hub",
        metavar="REPO",
        help="also upload the data file and the dataset card to this hub dataset repo (needs network)",
    )
    p.add_argument(
        "--tokenizer",
        help="measure the card's token lengths with this tokenizer (folder or hub id; default: the round's own, "
        "the model that sampled it; without one the card gives characters)",
    )
    p.add_argument(
        "--license",
        help="the card's license, a hub license id (default: the license of the benchmark's data)",
    )


def _export_pairs(args: argparse.Namespace) -> int:
    from selskill.api import export_pairs

    # the command's options are export_pairs' keyword parameters, by name
    options = ("window_n", "recipe", "push_to_hub", "tokenizer", "license", "overwrite")
    out = export_pairs(args.exp, args.round, args.out, **{name: getattr(args, name) for name in options})
    pushed = f"; pushed to the hub as {args.push_to_hub}" if args.push_to_hub else ""
    need = (
        f"; trl.DPOTrainer needs max_length >= {out.lengths.max_length} to keep every pair whole (the card says how)"
        if out.lengths.unit == "tokens"
        else "; the card gives character lengths (no tokenizer: --tokenizer MODEL measures tokens)"
    )
    print(f"wrote {out.rows} pairs to {out.data_file} and the dataset card {out.card}{pushed}{need}")
    return 0


def _import_skills_arguments(p: argparse.ArgumentParser) -> None:
    from selskill.skills.importer import MAX_FILE_BYTES

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


def _import_skills(args: argparse.Namespace) -> int:
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


REPORT = Command(
    "report",
    help="write runs/<exp>/report.{md,html} and plots: metrics across rounds, pair yield, entropy at branches",
    description="Collect every round of an experiment into runs/<exp>/report.md and report.html (plots "
    "embedded) plus runs/<exp>/plots/*.png: the Table-1 metrics per round and split with 95% intervals and "
    "the paired SR difference vs init, pair yield per round, entropy after invoke/skip branch points, skill "
    "calls per episode, chosen-vs-rejected steps. Missing rounds or stages are skipped with a note. "
    "Example: selskill report --exp runs/tiny, or selskill report --config recipes/tiny.yaml (what `make round` "
    "runs after the round)",
    add_arguments=_report_arguments,
    run=_report,
)

EXPORT_PAIRS = Command(
    "export-pairs",
    help="write a round's preference pairs in TRL's conversational format (prompt/chosen/rejected messages)",
    description="Read round R's label stage of runs/<exp> (every rank complete and verified) and write "
    "OUT/data/train-00000-of-00001.parquet (prompt, chosen and rejected as lists of role/content messages, "
    "plus the pair's kind, label reason, arms, task, branch and loss-window turns) and OUT/README.md (a "
    "dataset card). Any DPO trainer that reads conversational preference data (trl.DPOTrainer) can train "
    "on it. Example: selskill export-pairs --exp runs/tiny --round 1 --out exports/tiny-r1",
    add_arguments=_export_pairs_arguments,
    run=_export_pairs,
)

IMPORT_SKILLS = Command(
    "import-skills",
    help="import a folder of public SKILL.md files as memory skills",
    description="Find every SKILL.md below SOURCE (Agent Skills format: name, description, Markdown body), "
    "rewrite each as a selskill memory skill (snake_case name, its description and body) and write "
    "OUT/<name>/SKILL.md, loadable with load_skills. Files without a description or body are skipped.",
    add_arguments=_import_skills_arguments,
    run=_import_skills,
)
