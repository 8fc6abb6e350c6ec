"""The fork stage of a round, as one rank: `python pipelines/fork.py --config RECIPE --round R --rank I --world-size N`."""

import sys

from selskill.config import make_parser, run_entry
from selskill.stages.fork import run_fork


def main(argv=None) -> int:
    return run_entry(lambda r: run_fork(r.run, r.policy, r.rollout, r.fork, r.seed), argv)


__all__ = ["main", "make_parser"]

if __name__ == "__main__":
    sys.exit(main())
