"""The sample stage of a round, as one rank: `python pipelines/sample.py --config RECIPE --round R --rank I --world-size N`."""

import sys

from selskill.config import make_parser, run_entry
from selskill.stages.sample import run_sample


def main(argv=None) -> int:
    return run_entry(lambda r: run_sample(r.run, r.policy, r.rollout, r.sample, r.seed), argv)


__all__ = ["main", "make_parser"]

if __name__ == "__main__":
    sys.exit(main())
