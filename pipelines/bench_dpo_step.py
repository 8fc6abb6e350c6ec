"""DPO steps, ours vs stock trl.DPOTrainer: `python pipelines/bench_dpo_step.py [--round DIR --policy MODEL]`
(what `make bench-dpo` runs), the same as `selskill bench dpo-step`. Figures: docs/benchmarks.md."""

import sys

from selskill.cli import command_main

main = command_main("bench", "dpo-step")

if __name__ == "__main__":
    sys.exit(main())
