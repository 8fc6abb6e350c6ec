"""The plugin contract is code: each built-in benchmark's task index and env satisfy the protocols
the core calls (`selskill.envs.base.TaskIndex`, `Env`), and no code of the core names a benchmark."""

from __future__ import annotations

import importlib.util
import io
import re
import tokenize
from pathlib import Path

import pytest

from selskill.config import RunConfig
from selskill.envs.base import Env, EnvState, TaskIndex, TaskRecord
from selskill.registry import benchmark, names


def _run(name: str, small_games) -> RunConfig:
    run = RunConfig(benchmark=name)
    if name == "alfworld":  # generated games, not $ALFWORLD_DATA
        run.benchmark_settings.games_dir = str(small_games)
    return run


@pytest.mark.parametrize("name", ["alfworld", "bfcl"])
def test_each_builtin_plugin_satisfies_the_index_and_env_protocols(name, small_games):
    if name == "bfcl" and importlib.util.find_spec("bfcl_eval") is None:
        pytest.skip("bfcl-eval is not installed")
    assert name in names()
    spec = benchmark(name)
    split = spec.held_out[0] if name == "bfcl" else "train"
    index = spec.task_index(_run(name, small_games), split)
    assert isinstance(index, TaskIndex) and index.benchmark == name
    assert index.games and all(isinstance(g, TaskRecord) for g in index.games)
    assert index.by_id()[index.games[0].task_id] is index.games[0]
    assert isinstance(index.summary(), str) and isinstance(index.stats(), dict)
    env = spec.env_factory(index)()
    state = env.reset(index.games[0].task_id)
    assert isinstance(env, Env)  # after a reset: an env has no `state` before one
    assert isinstance(state, EnvState) and env.state is state and isinstance(env.inventory(), list)


PACKAGE = Path(__file__).resolve().parents[1] / "selskill"
BENCHMARK_WORDS = re.compile("alfworld|bfcl", re.IGNORECASE)
STATEMENT_START = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
BLANK = {tokenize.NL, tokenize.COMMENT}
# names, and the text of an f-string where Python (3.12+) tokenizes it in parts
TEXT = {tokenize.NAME, getattr(tokenize, "FSTRING_MIDDLE", tokenize.NAME)}


def code_tokens(source: str):
    """The NAME and STRING tokens (and f-strings' text) of `source`, less its docstrings (a statement that is
    only a string)."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in BLANK]
    for i, tok in enumerate(tokens):
        if tok.type in TEXT:
            yield tok
        elif tok.type == tokenize.STRING:
            j = i
            while j > 0 and tokens[j - 1].type == tokenize.STRING:  # implicitly concatenated
                j -= 1
            k = i
            while tokens[k + 1].type == tokenize.STRING:
                k += 1
            alone = (j == 0 or tokens[j - 1].type in STATEMENT_START) and tokens[k + 1].type in (
                tokenize.NEWLINE,
                tokenize.ENDMARKER,
            )
            if not alone:
                yield tok


def test_code_tokens_leave_out_docstrings_and_comments_only():
    source = (
        '"""bfcl."""\ndef f():\n    """A bfcl docstring."""\n    # alfworld\n    return "bfcl", alfworld_x\n'
    )
    assert [t.string for t in code_tokens(source) if BENCHMARK_WORDS.search(t.string)] == [
        '"bfcl"',
        "alfworld_x",
    ]


def test_no_code_of_the_core_names_a_benchmark():
    """Outside selskill/benchmarks/, no name or string (help texts and messages included) says "alfworld" or
    "bfcl": the core asks the registry, so a benchmark is one folder and the core treats all of them alike."""
    core = [p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).parts[0] != "benchmarks"]
    assert len(core) > 50
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{tok.start[0]}: {tok.string[:60]}"
        for path in core
        for tok in code_tokens(path.read_text())
        if BENCHMARK_WORDS.search(tok.string)
    ]
    assert not found, "the core names a benchmark:\n" + "\n".join(found)
