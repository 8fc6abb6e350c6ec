"""Hostile BFCL steps: bounded in time and memory, answered with an error text, and never run.

A model's step is text the env decodes (selskill/benchmarks/bfcl/calls.py) and executes
(selskill/benchmarks/bfcl/execution.py). Text over a bound (characters, nesting, calls, int
digits) is refused before it is parsed, or right after, with the reason in the observation;
text that would make BFCL's `eval` run anything but a backend method runs nothing, and the
checker, which gets it as BFCL's decoder wrote it, answers it with the env's output instead of
running it. Nothing here goes near BFCL's own `eval`. Time and
memory are measured inside the tests with generous bounds (a shared CPU).
"""

from __future__ import annotations

import builtins
import os
import time
import tracemalloc

import pytest

pytest.importorskip("bfcl_eval")

from selskill.benchmarks.bfcl.calls import (  # noqa: E402
    MAX_CALLS_PER_STEP,
    MAX_INT_WORK_BITS,
    MAX_INT_WORK_DIGITS,
    MAX_NAME_CHARS,
    MAX_NESTING,
    MAX_STEP_CHARS,
    decode_step,
)
from selskill.benchmarks.bfcl.decoding import decode  # noqa: E402
from selskill.benchmarks.bfcl.env import BfclEnv  # noqa: E402

TASK = "multi_turn_base_0"  # GorillaFileSystem + TwitterAPI


@pytest.fixture(scope="module")
def env():
    return BfclEnv(["base"], scenarios=[0])


def _bounded_step(env: BfclEnv, text: str, seconds: float = 1.0, megabytes: float = 100.0):
    """env.step(text) on a fresh task, checked to take under `seconds` and, run again under
    tracemalloc (which slows it), to peak under `megabytes`."""
    env.reset(TASK)
    start = time.perf_counter()
    state = env.step(text)
    elapsed = time.perf_counter() - start
    assert elapsed < seconds, f"{elapsed:.2f} s"
    env.reset(TASK)
    tracemalloc.start()
    try:
        again = env.step(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < megabytes * 2**20, f"{peak / 2**20:.1f} MB"
    assert again.observation == state.observation
    return again


def _within_the_characters(arguments) -> str:
    """`f(...)` with as many of `arguments` as the character bound holds."""
    kept, size = [], 4
    for argument in arguments:
        if size + len(argument) + 2 > MAX_STEP_CHARS:
            break
        kept.append(argument)
        size += len(argument) + 2
    return f"f({', '.join(kept)})"


OVER_BOUNDS = {
    "10 MB of calls": "g(), " * 2_000_000,
    "100k-digit int": "f(x=" + "7" * 100_000 + ")",
    "20k-digit int (within the character bound)": "f(x=" + "7" * 20_000 + ")",
    "5k-deep brackets": "f(x=" + "[" * 5_000 + "]" * 5_000 + ")",
    "5k-deep unary minus": "f(x=" + "-" * 5_000 + "1)",
    "5k-deep attributes": "f(x=a" + ".b" * 5_000 + ")",
    "nesting just over the bound": "f(x=" + "[" * MAX_NESTING + "]" * MAX_NESTING + ")",
    "too many calls": "[" + "g(), " * (MAX_CALLS_PER_STEP + 1) + "]",
    "arithmetic past the int bound": "f(x=10**10**10)",
    "a repeated sequence": "f(x='a'*10**9)",
    "a bare attribute chain": "a.__class__.__mro__",
    "ints near the digit bound, over and over": _within_the_characters(
        f"x{i}=7**9000//3**9000" for i in range(5000)
    ),
    "an int past twice the digit bound": "f(x=(7**5000)**3)",
    "BFCL's named lists, over and over": _within_the_characters(
        f"x{i}=ALL_CATEGORIES+ALL_CATEGORIES" for i in range(5000)
    ),
}


@pytest.mark.parametrize("name", sorted(OVER_BOUNDS))
def test_a_step_over_a_bound_ends_the_turn_with_the_reason(env, name):
    state = _bounded_step(env, OVER_BOUNDS[name])
    assert (
        state.observation.startswith("(No call was run: ") and "The user turn has ended." in state.observation
    )
    assert env.turn == 1 and state.env_steps == 0 and env.calls == [[], []]


def test_the_bounds_say_which_bound(env):
    assert decode_step("g(), " * 2_000_000).error == (
        f"the reply has 10,000,000 characters, over the bound of {MAX_STEP_CHARS:,}"
    )
    assert decode_step(OVER_BOUNDS["too many calls"]).refused
    assert "4300 digits" in decode_step(OVER_BOUNDS["20k-digit int (within the character bound)"]).error
    assert (
        f"nested deeper than the bound of {MAX_NESTING}"
        in decode_step(OVER_BOUNDS["nesting just over the bound"]).error
    )
    assert decode_step("f(x=" + "[" * (MAX_NESTING - 4) + "]" * (MAX_NESTING - 4) + ")").calls
    assert (
        f"over {MAX_INT_WORK_BITS:,} bits"
        in decode(OVER_BOUNDS["ints near the digit bound, over and over"]).error
    )
    assert (
        f"more than {MAX_INT_WORK_DIGITS} digits"
        in decode(OVER_BOUNDS["an int past twice the digit bound"]).error
    )
    assert (
        f"over {MAX_NAME_CHARS:,} characters"
        in decode(OVER_BOUNDS["BFCL's named lists, over and over"]).error
    )
    # under the bounds, ints are exact: 4,300 digits decode, 4,301 fail as BFCL's repr fails
    assert decode("f(x=10**4300 - 1)").calls and not decode("f(x=10**4300)").refused
    assert "4300 digits" in decode("f(x=10**4300)").error


def test_the_largest_step_within_the_bound_is_answered_in_bounded_time(env):
    text = ("g(), " * MAX_STEP_CHARS)[: MAX_STEP_CHARS - 10]
    state = _bounded_step(env, text)
    assert "calls, over the bound of" in state.observation


# --- hostile calls never run --------------------------------------------------------------------


HOSTILE = [
    "__import__('os').system('touch {path}/system')",
    "open(file='{path}/open', mode='w')",
    "exec(source=\"open('{path}/exec', 'w')\")",
    "eval(source=\"open('{path}/eval', 'w')\")",
    "ls(a=__import__(name='os'))",
    "ls(a=open(file='{path}/nested', mode='w'))",
    "ls(a={{'open': {{'file': '{path}/dict', 'mode': 'w'}}}})",
    "ls(a={{\"open('{path}/key', 'w').write('x') or g\": {{'b': 1}}}})",
    "ls(a=lambda: open('{path}/lambda', 'w'))",
    "ls(a=[].__class__.__base__.__subclasses__())",
    "getattr(o=ls, name='__globals__')",
    "ls(a=copy.copy(x=1))",
    "json.dumps(obj=open(file='{path}/json', mode='w'))",
    "breakpoint()",
    "input(prompt='x')",
    "exit()",
    "ls(a=10**10**10)",
    "ls(a='x'*10**10)",
    "ls(a='%999999999d' % 1)",
]


def test_hostile_calls_never_run(env, tmp_path, monkeypatch):
    opened, systems = [], []
    real_open = builtins.open

    def watch_open(file, *args, **kwargs):
        if str(tmp_path) in str(file):
            opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", watch_open)
    monkeypatch.setattr(os, "system", lambda command: systems.append(command) or 0)
    ends = [""] * len(env.task(TASK).turns)
    for template in HOSTILE:
        text = template.format(path=tmp_path)
        state = _bounded_step(env, text)
        for result in state.info["call_results"]:  # a call runs only as a string argument of ls
            assert result["error"] or result["call"].startswith("ls(a='"), text
        runs = [
            (call, (0, s, i) in env.refused)
            for s, step in enumerate(env.calls[0])
            for i, call in enumerate(step)
        ]
        # what the checker would run: only calls the walk accepted, which run a backend method at most
        assert all(refused or call.startswith(("ls(a='", "system(", "exit(")) for call, refused in runs), text
        assert env.replay(TASK, [text, *ends]).done  # through the checker, which gets the same calls
    assert not opened and not systems and not list(tmp_path.iterdir())
