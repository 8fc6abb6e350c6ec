"""The mini replication: `python pipelines/bench_mini.py --config recipes/mini.yaml [--ablations comparisons|all|none]`
(what `make bench-mini` runs), the same as `selskill bench mini`."""

import sys

from selskill.cli import command_main

main = command_main("bench", "mini")

if __name__ == "__main__":
    sys.exit(main())
