"""The ALFWorld adapter: the Env protocol over the real engine, and the real-data loader."""

import json
import shutil

import pytest

from selskill.benchmarks.alfworld.env import AlfworldEnv, clear_engine_caches, find_games
from selskill.benchmarks.alfworld.verify import verify_games
from selskill.envs.base import Env, EnvError


def _solution(root, task_id):
    return json.loads((root / task_id / "traj_data.json").read_text())["selskill"]["solution"]


def test_adapter_implements_the_protocol(small_games):
    env = AlfworldEnv(find_games(small_games))
    env.reset(env.task_ids()[0])
    assert isinstance(env, Env)


def test_step_inventory_and_invalid_commands(small_games):
    env = AlfworldEnv(find_games(small_games))
    task_id = next(t for t in env.task_ids() if "pick_and_place_simple" in t)
    solution = _solution(small_games, task_id)
    state = env.reset(task_id)
    assert state.env_steps == 0 and not state.done and env.inventory() == []
    bad = env.step("fly to the moon")
    assert bad.observation == "Nothing happens." and bad.env_steps == 1 and not bad.won
    take = next(i for i, c in enumerate(solution) if c.startswith("take "))
    for c in solution[: take + 1]:
        state = env.step(c)
    held = solution[take].split(" from ")[0].removeprefix("take ")
    assert env.inventory() == [held]
    assert f"You pick up the {held}" in state.observation


def test_replay_reaches_the_same_state_and_counts_steps(small_games):
    env = AlfworldEnv(find_games(small_games))
    task_id = next(t for t in env.task_ids() if "pick_two" in t)
    solution = _solution(small_games, task_id)
    direct = env.reset(task_id)
    for c in solution[:-1]:
        direct = env.step(c)
    other = AlfworldEnv(find_games(small_games))  # a fresh process would do the same
    replayed = other.replay(task_id, solution[:-1])
    assert replayed.env_steps == len(solution) - 1
    assert replayed.observation == direct.observation
    assert replayed.admissible_commands == direct.admissible_commands
    assert other.step(solution[-1]).won


def test_task_ids_are_relative_and_stable(small_games):
    a = find_games(small_games)
    b = find_games(str(small_games))
    assert [g.task_id for g in a.games] == [g.task_id for g in b.games]
    assert all(t.startswith("train/") and not t.startswith("/") for t in AlfworldEnv(a).task_ids())


def _write_trial(base, rel, traj, game=None):
    d = base / rel
    d.mkdir(parents=True)
    (d / "traj_data.json").write_text(json.dumps(traj))
    if game is not None:
        (d / "game.tw-pddl").write_text(json.dumps(game))
    return d


def test_real_data_layout_with_skip_reasons(small_games, tmp_path, monkeypatch):
    """A directory laid out like $ALFWORLD_DATA (json_2.1.1/<split>/...) built from generated games."""
    data = tmp_path / "alfworld"
    real = data / "json_2.1.1"
    shutil.copytree(small_games / "train", real / "valid_seen")
    good = find_games(small_games).games[0]
    game = json.loads((small_games / good.task_id / "game.tw-pddl").read_text())
    traj = json.loads((small_games / good.task_id / "traj_data.json").read_text())
    lamp = dict(
        traj,
        task_type="look_at_obj_in_light",
        pddl_params=dict(traj["pddl_params"], toggle_target="FloorLamp"),
    )
    sliced = dict(traj, pddl_params=dict(traj["pddl_params"], object_sliced=True))
    _write_trial(
        real,
        "valid_seen/pick_and_place_with_movable_recep-Mug-Pan-Cabinet-1/trial_1",
        dict(traj, task_type="pick_and_place_with_movable_recep"),
        game,
    )
    _write_trial(real, "valid_seen/pick_and_place_simple-AppleSliced-None-Fridge-1/trial_1", traj, game)
    _write_trial(real, "valid_seen/look_at_obj_in_light-Book-None-FloorLamp-201/trial_1", lamp, game)
    _write_trial(real, "valid_seen/pick_and_place_simple-Mug-None-Desk-301/trial_1", sliced, game)
    _write_trial(
        real, "valid_seen/pick_and_place_simple-Mug-None-Desk-302/trial_1", traj, dict(game, solvable=False)
    )
    _write_trial(real, "valid_seen/pick_and_place_simple-Mug-None-Desk-303/trial_1", traj, None)
    _write_trial(
        real,
        "valid_seen/pick_and_place_simple-Mug-None-Desk-304/trial_1",
        dict(traj, task_type="pick_and_place_something"),
        game,
    )
    broken = _write_trial(
        real,
        "valid_seen/pick_and_place_simple-Mug-None-Desk-305/trial_1",
        traj,
        dict(game, pddl_problem="(define (problem broken) (:domain alfred) (:objects"),
    )

    monkeypatch.setenv("ALFWORLD_DATA", str(data))
    index = find_games(splits="valid_seen")
    assert index.skipped == {
        "movable": 1,
        "sliced": 2,
        "floorlamp": 1,
        "unsolvable": 1,
        "missing_game_file": 1,
        "unsupported_task_type": 1,
    }
    assert len(index.games) == 7  # six generated + the broken one (only loading reveals it)
    env = AlfworldEnv(index)
    broken_id = broken.relative_to(real).as_posix()
    with pytest.raises(EnvError, match="engine failed"):
        env.reset(broken_id)
    report = verify_games(index)
    assert report.winnable == 6 and report.failures == [(broken_id, report.failures[0][1])]
    assert report.failures[0][1].startswith("load_error")
    # the env stays usable after a broken game
    assert not env.reset(env.task_ids()[0]).won


def test_missing_root_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA"):
        find_games()
    with pytest.raises(FileNotFoundError, match="none of the splits"):
        find_games(tmp_path)


def test_engine_caches_change_nothing(small_games, monkeypatch):
    """The memoised template parser and PDDL translation yield exactly the engine's own texts,
    commands and outcomes, also when a game is restarted (the translation cache's hit path)."""
    from textworld.envs.pddl import logic, textgen

    def trace(root):
        index = find_games(root)
        env = AlfworldEnv(index)
        out = []
        for task_id in env.task_ids() + env.task_ids()[:2]:
            state = env.reset(task_id)
            out.append((state.observation, tuple(state.admissible_commands)))
            for c in _solution(root, task_id):
                state = env.step(c)
                out.append((state.observation, tuple(state.admissible_commands), state.won))
        return out

    cached = trace(small_games)
    assert getattr(textgen._parse_and_convert, "_selskill_cached", False)
    assert getattr(logic.fast_downward.pddl2sas, "_selskill_cached", False)
    assert getattr(textgen.copy_context, "_selskill_cached", False)
    assert logic.fast_downward.pddl2sas.cache and textgen._parse_and_convert.cache
    clear_engine_caches()  # what the rollout benchmark does between settings
    assert not logic.fast_downward.pddl2sas.cache and not textgen._parse_and_convert.cache
    assert trace(small_games) == cached
    import selskill.benchmarks.alfworld.env as adapter

    monkeypatch.setattr(adapter, "install_grammar_parse_cache", lambda: None)
    monkeypatch.setattr(adapter, "install_translation_cache", lambda: None)
    monkeypatch.setattr(adapter, "install_context_copy", lambda: None)
    monkeypatch.setattr(textgen, "copy_context", textgen.copy_context._original)
    monkeypatch.setattr(textgen, "_parse_and_convert", textgen._parse_and_convert._original)
    monkeypatch.setattr(logic.fast_downward, "pddl2sas", logic.fast_downward.pddl2sas._original)
    plain = trace(small_games)
    assert not getattr(textgen._parse_and_convert, "_selskill_cached", False)
    assert not getattr(logic.fast_downward.pddl2sas, "_selskill_cached", False)
    assert cached == plain
