"""What a bare `pip install selskill` (no extras) must do: import selskill, load a round's pairs,
write the experiment's report and export the pairs for a DPO trainer (API and CLI); and what it
cannot do say so in one line (`selskill bench retrieval`: the extra it needs).

    python tests/light_install.py write RUNS    # with the full install: a small run under RUNS
    python tests/light_install.py read RUNS --hide-optional   # the extras' packages hidden
    python tests/light_install.py read RUNS --not-installed   # the extras' packages must be absent

`--hide-optional` makes this process see the extras' packages as not installed (a path finder
that does not find them, so `importlib.util.find_spec` says None, as libraries probing for
torch expect): tests/test_light_install.py runs it in `make test`. `--not-installed` checks a
venv that really lacks them: `make check-light-install` runs it in a fresh one.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import importlib.util
import io
import json
import sys
from pathlib import Path

# the top-level modules of the extras (pyproject.toml: train, alfworld, bfcl, deepspeed, wandb, vllm)
OPTIONAL = (
    "torch",
    "transformers",
    "tokenizers",
    "trl",
    "accelerate",
    "bm25s",
    "deepspeed",
    "alfworld",
    "textworld",
    "bfcl_eval",
    "wandb",
    "vllm",
)
EXP = "light"


def hide(names) -> None:
    """Make `names` (top-level modules) look not installed to this process."""
    hidden = frozenset(names)
    path_finder = importlib.machinery.PathFinder

    class Hiding(path_finder):
        @classmethod
        def find_spec(cls, fullname, path=None, target=None):
            if fullname.partition(".")[0] in hidden:
                return None
            return super().find_spec(fullname, path, target)

    sys.meta_path[:] = [Hiding if f is path_finder else f for f in sys.meta_path]


def write(runs: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fixtures_run import write_fixture_run

    write_fixture_run(runs, EXP)
    print(f"wrote {runs / EXP}")


def read(runs: Path) -> dict:
    import selskill
    from selskill.cli import main as cli

    run = runs / EXP
    pairs = selskill.load_pairs(run, 1)
    if cli(["report", "--exp", str(run)]) != 0:
        raise SystemExit(f"selskill report --exp {run} failed")
    export = selskill.export_pairs(run, 1, runs / "export-api")
    if cli(["export-pairs", "--exp", str(run), "--round", "1", "--out", str(runs / "export-cli")]) != 0:
        raise SystemExit(f"selskill export-pairs --exp {run} --round 1 failed")
    loaded = sorted(m for m in OPTIONAL if m in sys.modules)
    if loaded:
        raise SystemExit(
            f"reading pairs, writing the report and exporting the pairs imported {', '.join(loaded)}"
        )
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = cli(["bench", "retrieval"])
    said = err.getvalue().strip().splitlines()
    if status != 2 or len(said) != 1 or "pip install" not in said[0]:
        raise SystemExit(
            f"selskill bench retrieval without its extras must exit 2 on one line naming the install; it exited "
            f"{status} saying: {err.getvalue()}"
        )
    return {
        "pairs": len(pairs),
        "columns": pairs.column_names,
        "report": [str(p) for p in (run / "report.md", run / "report.html") if p.is_file()],
        "export": {
            "rows": export.rows,
            "files": [str(p) for p in (export.data_file, export.card) if p.is_file()],
            "cli_files": sorted(
                str(p.relative_to(runs)) for p in (runs / "export-cli").rglob("*") if p.is_file()
            ),
            "lengths": export.lengths.unit,
        },
        "bench_retrieval": {"status": status, "stderr": err.getvalue()},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("write", "read"))
    parser.add_argument("runs", type=Path)
    parser.add_argument("--hide-optional", action="store_true")
    parser.add_argument("--not-installed", action="store_true")
    args = parser.parse_args(argv)
    if args.action == "write":
        write(args.runs)
        return 0
    if args.hide_optional:
        hide(OPTIONAL)
    if args.not_installed:
        present = [m for m in OPTIONAL if importlib.util.find_spec(m) is not None]
        if present:
            raise SystemExit(f"not a light install: {', '.join(present)} installed")
    print(json.dumps(read(args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
