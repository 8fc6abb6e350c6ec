"""BFCL's ground-truth sweep: `python pipelines/bench_bfcl_gt.py [--categories ...]`, the same as
`selskill bench bfcl-gt`. Figures: docs/benchmarks.md, "BFCL"."""

import sys

from selskill.cli import command_main

main = command_main("bench", "bfcl-gt")

if __name__ == "__main__":
    sys.exit(main())
