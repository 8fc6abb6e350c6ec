"""Read a run's rows from a notebook or a script, as `datasets.Dataset`s.

    import selskill
    pairs = selskill.load_pairs("runs/tiny", 1)
    forks = selskill.load_forks("runs/tiny", 1)

`run_dir` is always an experiment directory, `runs/<exp>`: the directory that holds
`round_<r>/` (what `selskill report --exp` and the notebook take, and where `report.md` is
written), not the recipe's `runs_dir`. A stage is read the way the next stage reads it
(`selskill.data.contract.read_stage`): every rank complete, every shard checked against
its marker and the schema, so a half-finished or corrupt stage fails naming the file
instead of yielding part of its rows; ranks that kept no rows add nothing. The rows are
read into memory (Arrow), which suits the CPU-scale runs a notebook looks at.
"""

from __future__ import annotations

from pathlib import Path

# stage directory -> (row kind in selskill.data.schema, the stage that writes it: `python -m selskill.stages
# <stage>`); eval-headroom is the eval stage's first split played without skills (eval_headroom)
STAGE_KINDS = {
    "sample": ("rollout", "sample"),
    "branch": ("branch", "branch"),
    "fork": ("fork", "fork"),
    "label": ("pair", "label"),
    "eval": ("rollout", "eval"),
    "eval-headroom": ("rollout", "eval"),
}


def rounds(run_dir: str | Path, stage: str | None = None) -> list[int]:
    """The rounds of `run_dir` (with `stage`: those where that stage has written a shard)."""
    run_dir = Path(run_dir)
    if stage is not None and stage not in STAGE_KINDS:
        raise ValueError(f"unknown stage {stage!r}; the stages with rows are {', '.join(STAGE_KINDS)}")
    from selskill.data.layout import StageDir, round_numbers

    found = round_numbers(run_dir)
    if stage is None:
        return found
    return [r for r in found if StageDir.of(run_dir.parent, run_dir.name, r, stage).shard_files()]


def _stage_dir(run_dir: str | Path, round: int, stage: str):
    from selskill.data.layout import StageDir

    run_dir = Path(run_dir)
    kind, writer = STAGE_KINDS[stage]
    if not run_dir.is_dir():
        raise FileNotFoundError(
            f"no run directory {run_dir}: run_dir is an experiment directory, runs/<exp> (the one that holds "
            "round_<r>/), written by `selskill round --config RECIPE --exp <exp> --round 1`"
        )
    sd = StageDir.of(run_dir.parent, run_dir.name, round, stage)
    if not sd.path.is_dir():
        have = rounds(run_dir)
        where = (
            f"rounds here: {', '.join(map(str, have))}"
            if have
            else "no round_<r>/ here at all: run_dir is runs/<exp>, the directory that holds round_<r>/"
        )
        produce = (
            f"run that stage (`python -m selskill.stages {writer} --config RECIPE --round {round}`, once per "
            f"rank) or the whole round (`selskill round --config RECIPE --round {round}`)"
        )
        raise FileNotFoundError(f"no {stage} stage at {sd.path} ({where}): {produce}")
    return sd, kind


def load_stage(run_dir: str | Path, round: int, stage: str):
    """Every row of one stage of round `round` as a `datasets.Dataset` (0 rows when no rank kept any)."""
    if stage not in STAGE_KINDS:
        raise ValueError(f"unknown stage {stage!r}; the stages with rows are {', '.join(STAGE_KINDS)}")
    sd, kind = _stage_dir(run_dir, round, stage)
    from datasets import Dataset

    from selskill.data.contract import read_stage

    return Dataset(read_stage(sd, kind))


def load_rollouts(run_dir: str | Path, round: int, stage: str = "sample"):
    """Episodes (rollout rows) of the sample stage, or with `stage="eval"` the held-out episodes."""
    if stage not in ("sample", "eval"):
        raise ValueError(f"rollouts come from the sample or eval stage, not {stage!r}")
    return load_stage(run_dir, round, stage)


def load_branches(run_dir: str | Path, round: int):
    """The branch points the branch stage chose."""
    return load_stage(run_dir, round, "branch")


def load_forks(run_dir: str | Path, round: int):
    """The invoke and skip continuations of every branch point."""
    return load_stage(run_dir, round, "fork")


def load_pairs(run_dir: str | Path, round: int):
    """The preference pairs the label stage wrote (what the train stage trains on)."""
    return load_stage(run_dir, round, "label")


def load_eval(run_dir: str | Path, round: int):
    """Round `round`'s held-out episodes (round 0: the init policy's)."""
    return load_stage(run_dir, round, "eval")


def _check_export_folder(out_dir: Path, overwrite: bool) -> None:
    """Refuse to write an export into a file, or into a folder that holds anything, unless `overwrite`."""
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"export folder {out_dir} is a file: give a new or empty folder")
    held = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    if held and not overwrite:
        names = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise FileExistsError(
            f"export folder {out_dir} is not empty (it holds {names}): pass --overwrite "
            "(overwrite=True in Python) to write the export's data/ and README.md into it, "
            "or give a new or empty folder"
        )


def export_pairs(
    run_dir: str | Path,
    round: int,
    out_dir: str | Path,
    window_n: int | str | None = "recipe",
    recipe: str | None = None,
    push_to_hub: str | None = None,
    tokenizer: str | None = None,
    license: str | None = None,
    overwrite: bool = False,
):
    """Round `round`'s pairs as TRL's conversational preference dataset in `out_dir` (Parquet + README.md
    card); returns `selskill.outputs.export.Export` (paths and row count). See `selskill.outputs.export` for the format.

    `out_dir` must be new or empty unless `overwrite` (the export's files would replace a user's
    own `README.md` or `data/` files there without a word).

    `window_n`: the local pairs' loss window the `*_window_turns` columns name ("recipe": what the
    round's train stage recorded, else the recipe default; or a number of turns, or "all").
    `recipe`: the recipe file's name for the card (a run directory does not record it).
    `push_to_hub`: also upload the data file and the card to this hub dataset repo (needs network and a
    token; off by default).
    `tokenizer`: the tokenizer (folder or hub id) the card's token lengths are measured with; by default the
    round's own (the model that sampled it), and character lengths where it has none.
    `license`: the card's license (a hub license id); by default the license of the benchmark's data.
    """
    _stage_dir(run_dir, round, "label")  # a missing run or stage: what to run
    _check_export_folder(Path(out_dir), overwrite)
    from selskill.outputs.export import write_export

    return write_export(
        Path(run_dir),
        round,
        Path(out_dir),
        window_n,
        recipe,
        push_to_hub,
        tokenizer=tokenizer,
        license=license,
    )
