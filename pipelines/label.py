"""The label stage of a round, as one rank: `python pipelines/label.py --config RECIPE --round R --rank I --world-size N`."""

import sys

from selskill.config import make_parser, run_entry
from selskill.stages.label import run_label


def main(argv=None) -> int:
    return run_entry(lambda r: run_label(r.run, r.label, r.train.window_turns or -1, r.seed), argv)


__all__ = ["main", "make_parser"]

if __name__ == "__main__":
    sys.exit(main())
