"""Evaluate round R's model on the held-out splits: `python pipelines/evaluate.py --config RECIPE --round R`."""

import sys

from selskill.config import make_parser, run_entry
from selskill.stages.evaluate import run_eval


def main(argv=None) -> int:
    return run_entry(lambda r: run_eval(r.run, r.policy, r.rollout, r.eval, r.seed), argv)


__all__ = ["main", "make_parser"]

if __name__ == "__main__":
    sys.exit(main())
