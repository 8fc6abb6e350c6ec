"""The mini replication: `python pipelines/bench_mini.py --config recipes/mini.yaml` (what `make bench-mini` runs).

Init -> R1 -> R2 on the recipe, then the round-1 ablations (pair kinds, window n, branching
strategies) as linked experiments `runs/<exp>-<variant>/`; writes runs/<exp>/ablations.md.
Every step is a resumable round: rerun the same command after an interruption.
`--no-ablations` runs the main line only.
"""

import sys

from selskill.config import make_parser
from selskill.errors import run_main
from selskill.stages.replication import run_replication


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ablations = "--no-ablations" not in argv
    argv = [a for a in argv if a != "--no-ablations"]
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        make_parser().parse_args_and_config(args=["--help"])
        return 0

    def replicate() -> int:
        run_replication(argv, ablations=ablations)
        return 0

    return run_main(replicate)


if __name__ == "__main__":
    sys.exit(main())
