"""The plugin contract is code: each built-in benchmark's task index and env satisfy the protocols
the core calls (`selskill.envs.base.TaskIndex`, `Env`)."""

from __future__ import annotations

import importlib.util

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
