"""The branch stage of a round, as one rank: `python pipelines/branch.py --config RECIPE --round R --rank I --world-size N`."""

import sys

from selskill.config import make_parser, run_entry
from selskill.stages.branch import run_branch


def main(argv=None) -> int:
    return run_entry(lambda r: run_branch(r.run, r.policy, r.rollout, r.branch, r.seed), argv)


__all__ = ["main", "make_parser"]

if __name__ == "__main__":
    sys.exit(main())
