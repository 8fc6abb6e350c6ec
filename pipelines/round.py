"""One full round: `python pipelines/round.py --config recipes/tiny.yaml --round 1` (what `make round` runs).

Add `--executor slurm --dry_run` to print the round's job scripts, `--executor ray` for one Ray task per rank.
"""

import sys

from selskill.config import make_parser
from selskill.stages.round import main

__all__ = ["main", "make_parser"]

if __name__ == "__main__":
    sys.exit(main())
