"""One full round: `python pipelines/round.py --config recipes/tiny.yaml --round 1` (what `make round` runs)."""

import sys

from selskill.config import load_recipe, make_parser
from selskill.stages.common import StageRefused
from selskill.stages.round import run_round


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        recipe = load_recipe(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        run_round(recipe, argv)
    except (FileNotFoundError, StageRefused) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


__all__ = ["main", "make_parser"]

if __name__ == "__main__":
    sys.exit(main())
