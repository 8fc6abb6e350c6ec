"""`selskill bench bfcl-gt`: BFCL's ground truth played through `BfclEnv`, all 800 multi-turn tasks.

Each task is reset, its ground-truth calls are sent one call per step (a turn over BFCL's
20-step limit is batched into 20 steps), each turn is ended with an empty step, and BFCL's
own checker judges the recorded calls. The env decodes each step as BFCL's pipeline does,
so positional arguments are dropped. Four sweeps:

- `verbatim`: the data's own text under BFCL's rule for withheld functions: what BFCL's own
  pipeline scores when a model writes the ground truth as the data does (positional
  arguments included);
- `strict`: keyword form (every positional argument named, as demonstrations write it), the
  strict option `withheld_callable=False` (withheld miss_func functions refused until revealed);
- `bfcl-rule`: keyword form, the env as shipped (`withheld_callable=True`, BFCL's own rule:
  withheld functions run);
- `drop-last`: strict, with each task's last ground-truth call left out: all should lose.

Prints how many tasks and calls pass an argument by position, then, per sweep and
category, tasks won / played and the wall time.

    OMP_NUM_THREADS=1 selskill bench bfcl-gt [--categories base miss_func]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from selskill.benchmarks.bfcl.env import CATEGORIES, BfclEnv, ground_truth_commands, is_positional, load_tasks


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--categories", nargs="+", default=list(CATEGORIES), choices=CATEGORIES)


def sweep(
    env: BfclEnv, drop_last_call: bool = False, verbatim: bool = False
) -> tuple[Counter, Counter, list[str], float]:
    """(won by category, played by category, ids of the tasks whose outcome was not the expected one, seconds)."""
    won, played, odd = Counter(), Counter(), []
    start = time.perf_counter()
    for task_id in env.task_ids():
        task = env.task(task_id)
        commands = ground_truth_commands(task, drop_last_call=drop_last_call, verbatim=verbatim)
        state = env.replay(task_id, commands)
        played[task.category] += 1
        won[task.category] += int(state.won)
        if state.won == drop_last_call and not verbatim:
            odd.append(f"{task_id} ({(state.info.get('verdict') or {}).get('error_type')})")
    return won, played, odd, time.perf_counter() - start


def positional_counts(categories: list[str]) -> str:
    """Per category: tasks whose ground truth passes an argument by position, and such calls."""
    cells = []
    for c in categories:
        calls = [[x for turn in t.ground_truth for x in turn if is_positional(x)] for t in load_tasks([c])]
        cells.append(f"{c} {sum(1 for x in calls if x)} tasks / {sum(len(x) for x in calls)} calls")
    return "positional ground truth: " + "  ".join(cells)


def main(args: argparse.Namespace) -> int:
    print(positional_counts(args.categories))
    settings = [
        ("verbatim", dict(withheld_callable=True), False, True),
        ("strict", dict(withheld_callable=False), False, False),
        ("bfcl-rule", dict(withheld_callable=True), False, False),
        ("drop-last", dict(withheld_callable=False), True, False),
    ]
    for name, kwargs, drop, verbatim in settings:
        env = BfclEnv(args.categories, **kwargs)
        won, played, odd, seconds = sweep(env, drop_last_call=drop, verbatim=verbatim)
        cells = "  ".join(f"{c} {won[c]}/{played[c]}" for c in args.categories)
        total_won, total = sum(won.values()), sum(played.values())
        print(
            f"{name:10s} won {total_won}/{total} ({100 * total_won / total:.2f}%)  {cells}  "
            f"{seconds:.2f} s ({1000 * seconds / total:.2f} ms/task)"
        )
        if odd:
            print(f"           unexpected: {', '.join(odd)}")
    return 0
