"""Does each model prefer the side its round's pairs chose? The same as `selskill bench probe-pairs`:
`python pipelines/probe_pairs.py --config recipes/mini.yaml --exp mini --round 1 --models
init=runs/mini/round_0/train/model r1=runs/mini/round_1/train/model`."""

import sys

from selskill.cli import command_main

main = command_main("bench", "probe-pairs")

if __name__ == "__main__":
    sys.exit(main())
