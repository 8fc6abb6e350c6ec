"""Evaluate round R's model on the held-out splits, as one rank: `python pipelines/evaluate.py --config RECIPE --round R`."""

import sys

from selskill.config import make_parser
from selskill.stages.table import stage_main


def main(argv=None) -> int:
    return stage_main("eval", argv)


__all__ = ["main", "make_parser"]

if __name__ == "__main__":
    sys.exit(main())
