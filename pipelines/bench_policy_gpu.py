"""GPU check of the transformers backend: `python pipelines/bench_policy_gpu.py [--out $OUT/gpu_check.json]`
on a CUDA machine, the same as `selskill bench policy-gpu`. Figures: docs/benchmarks.md."""

import sys

from selskill.cli import command_main

main = command_main("bench", "policy-gpu")

if __name__ == "__main__":
    sys.exit(main())
