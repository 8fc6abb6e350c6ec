"""How often an init policy reproduces its demonstrations' turns, the same as `selskill bench init-accuracy`:
`python pipelines/init_turn_accuracy.py --model runs/tiny/round_0/train/model --heldout runs/games-heldout --games 30`."""

import sys

from selskill.cli import command_main

main = command_main("bench", "init-accuracy")

if __name__ == "__main__":
    sys.exit(main())
