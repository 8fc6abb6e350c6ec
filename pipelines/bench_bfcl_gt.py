"""Benchmark: BFCL's ground truth played through `BfclEnv`, all 800 multi-turn tasks.

Each task is reset, its ground-truth calls are sent one call per step (a turn over BFCL's
20-step limit is batched into 20 steps), each turn is ended with an empty step, and BFCL's
own checker judges the recorded calls. Three sweeps:

- `strict`: the env as shipped (withheld miss_func functions refused until revealed);
- `bfcl-rule`: `withheld_callable=True`, BFCL's own rule (withheld functions run if called);
- `drop-last`: strict, with each task's last ground-truth call left out: all should lose.

Prints, per sweep and category, tasks won / played and the wall time.

    OMP_NUM_THREADS=1 python pipelines/bench_bfcl_gt.py [--categories base miss_func]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from selskill.envs.bfcl import CATEGORIES, BfclEnv, ground_truth_commands


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--categories", nargs="+", default=list(CATEGORIES), choices=CATEGORIES)
    return p


def sweep(env: BfclEnv, drop_last_call: bool = False) -> tuple[Counter, Counter, list[str], float]:
    """(won by category, played by category, ids of the tasks whose outcome was not the expected one, seconds)."""
    won, played, odd = Counter(), Counter(), []
    start = time.perf_counter()
    for task_id in env.task_ids():
        task = env.task(task_id)
        state = env.replay(task_id, ground_truth_commands(task, drop_last_call=drop_last_call))
        played[task.category] += 1
        won[task.category] += int(state.won)
        if state.won == drop_last_call:
            odd.append(f"{task_id} ({(state.info.get('verdict') or {}).get('error_type')})")
    return won, played, odd, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    settings = [
        ("strict", dict(withheld_callable=False), False),
        ("bfcl-rule", dict(withheld_callable=True), False),
        ("drop-last", dict(withheld_callable=False), True),
    ]
    for name, kwargs, drop in settings:
        env = BfclEnv(args.categories, **kwargs)
        won, played, odd, seconds = sweep(env, drop_last_call=drop)
        cells = "  ".join(f"{c} {won[c]}/{played[c]}" for c in args.categories)
        total_won, total = sum(won.values()), sum(played.values())
        print(
            f"{name:10s} won {total_won}/{total} ({100 * total_won / total:.2f}%)  {cells}  "
            f"{seconds:.2f} s ({1000 * seconds / total:.2f} ms/task)"
        )
        if odd:
            print(f"           unexpected: {', '.join(odd)}")
    return 0


if __name__ == "__main__":
    from selskill.errors import run_main

    sys.exit(run_main(main))
