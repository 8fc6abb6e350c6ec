"""Train stage: DPO on round r's pair shards (episode + local pairs with the n-turn loss mask).

    python pipelines/train_dpo.py --config recipes/tiny.yaml --round 1
    accelerate launch --config_file recipes/accelerate/zero3.yaml pipelines/train_dpo.py \
        --config recipes/dpo_8b.yaml --round 1
    python pipelines/train_dpo.py --config recipes/dpo_8b.yaml --dry_run

All logic lives in selskill.train.run.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from selskill.train.run import make_parser  # the sections training reads: run, policy, train

__all__ = ["main", "make_parser"]


def main(argv: Sequence[str] | None = None) -> int:
    from selskill.train.run import cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
