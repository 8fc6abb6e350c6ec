"""`python -m selskill.stages STAGE --config RECIPE [--key value ...]`: one rank of one stage.

What each Slurm array task runs (with `--rank $SLURM_ARRAY_TASK_ID`): the same as
`pipelines/<stage>.py`, without needing the repository checkout.
"""

import sys

from selskill.stages.table import BY_NAME, stage_main


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in BY_NAME:
        stages = "\n".join(f"  {s.name:<7} {s.doc}" for s in BY_NAME.values())
        print(
            f"usage: python -m selskill.stages STAGE --config RECIPE [--key value ...]\n{stages}",
            file=sys.stderr,
        )
        return 2
    return stage_main(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
