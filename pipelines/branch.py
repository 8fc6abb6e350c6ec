"""The branch stage of a round, as one rank: `python pipelines/branch.py --config RECIPE --round R --rank I --world_size N`."""

import sys

from selskill.config import make_parser
from selskill.stages.table import stage_main


def main(argv=None) -> int:
    return stage_main("branch", argv)


__all__ = ["main", "make_parser"]

if __name__ == "__main__":
    sys.exit(main())
