"""Real ALFWorld game files: old grammar patched at load, skip rules, splits, verify-games, the expert.

The games are a 60-game sample of ALFWorld's 2.1.1 train split (old grammar, no walkthrough),
found through $ALFWORLD_DATA (the folder holding json_2.1.1/, as the loader reads it; CI sets
it); the tests skip without them.
"""

import json
import os
import shutil
from pathlib import Path

import pytest

from selskill.benchmarks.alfworld.env import AlfworldEnv, data_root, find_games, record_for_trial
from selskill.benchmarks.alfworld.expert import Expert, TaskSpec, play_expert
from selskill.benchmarks.alfworld.grammar import OldGrammarError, is_old_grammar, patch_game
from selskill.benchmarks.alfworld.verify import verify_games
from selskill.envs.base import EnvState


def _sample_root() -> Path | None:
    candidate = os.environ.get("ALFWORLD_DATA")
    if candidate and (data_root(candidate) / "train").is_dir():
        return data_root(candidate)
    return None


SAMPLE = _sample_root()
needs_sample = pytest.mark.skipif(
    SAMPLE is None,
    reason="real ALFWorld games not found: set ALFWORLD_DATA to a folder holding json_2.1.1/train/ (ALFWorld's game files)",
)


def _trial(pattern: str) -> Path:
    return next(p for p in sorted((SAMPLE / "train").glob("*/*")) if pattern in str(p))


def _copy(trials, dest: Path) -> Path:
    for t in trials:
        shutil.copytree(t, dest / "train" / t.parent.name / t.name)
    return dest


ONE_PER_TYPE = (
    "pick_and_place_simple-AlarmClock-None-Desk-307",
    "pick_two_obj_and_place-CD-None-Dresser-303",
    "look_at_obj_in_light-CD-None-DeskLamp-307",  # drawer 3 shares drawer 2's place
    "pick_heat_then_place_in_recep-Mug-None-CoffeeMachine-2",
    "pick_cool_then_place_in_recep-Lettuce-None-CounterTop-24",  # the lettuce lies on a countertop
    "pick_clean_then_place_in_recep",
)


@needs_sample
def test_old_grammar_is_detected_patched_and_won():
    index = find_games(SAMPLE.parent, "train")  # the folder holding json_2.1.1/, as ALFWORLD_DATA
    assert len(index.games) == 60 and index.patched == 60
    assert "60 patched from alfworld's old grammar" in index.summary()
    record = next(g for g in index.games if "AlarmClock-None-Desk-307" in g.task_id)
    data = json.loads(Path(record.path).read_text())
    assert is_old_grammar(data) and "put {o} in/on {r}" in data["grammar"]
    patched = patch_game(data)
    assert not is_old_grammar(patched) and "move {o} to {r}" in patched["grammar"]
    assert patch_game(patched) == patched  # idempotent
    assert patched["pddl_problem"] == data["pddl_problem"]
    env = AlfworldEnv(index)
    commands, state, reason = play_expert(env, record, max_env_steps=50)
    assert reason is None and state.won and record.task_id in env.patched
    assert commands[-1].startswith("move alarmclock ") and "You move the alarmclock" in state.observation


@needs_sample
def test_strict_mode_refuses_old_grammar_naming_the_file_and_the_fix():
    with pytest.raises(
        OldGrammarError, match=r"game\.tw-pddl uses alfworld's old grammar.*patch_tw-pddl\.py"
    ):
        find_games(SAMPLE, "train", grammar="strict")
    record = record_for_trial(_trial("AlarmClock-None-Desk-307"))
    assert record.old_grammar
    with pytest.raises(OldGrammarError, match=str(record.path)):
        AlfworldEnv([record], grammar="strict").reset(record.task_id)
    with pytest.raises(ValueError, match="alfworld_grammar must be one of patch, strict"):
        find_games(SAMPLE, "train", grammar="lenient")
    from selskill.benchmarks.alfworld.config import AlfworldConfig

    assert AlfworldConfig().alfworld_grammar == "patch"
    with pytest.raises(ValueError, match="alfworld_grammar"):
        AlfworldConfig(alfworld_grammar="lenient")


@needs_sample
def test_skip_rules_match_only_below_the_data_root(tmp_path):
    trials = [_trial(p) for p in ONE_PER_TYPE[:3]]
    root = _copy(trials, tmp_path / "Sliced_copy" / "movable_games" / "json_2.1.1")
    index = find_games(root.parent)
    assert len(index.games) == 3 and not index.skipped
    sliced = root / "train" / "pick_and_place_simple-AppleSliced-None-Fridge-1"
    shutil.copytree(trials[0], sliced / "trial_1")
    assert find_games(root).skipped == {"sliced": 1}


@needs_sample
def test_valid_train_is_a_split_of_its_own(tmp_path):
    trials = [_trial(p) for p in ONE_PER_TYPE[:2]]
    root = tmp_path / "json_2.1.1"
    for t in trials:
        shutil.copytree(t, root / "valid_train" / t.parent.name / t.name)
    index = find_games(tmp_path, "valid_train")
    assert [g.split for g in index.games] == ["valid_train"] * 2
    assert all(g.task_id.startswith("valid_train/") for g in index.games)
    assert len(find_games(tmp_path).games) == 2  # the only split present
    shutil.copytree(trials[0], root / "train" / trials[0].parent.name / trials[0].name)
    assert [g.split for g in find_games(tmp_path).games] == ["train"]  # not counted twice by default
    with pytest.raises(ValueError, match="valid_train"):
        find_games(tmp_path, "valid_tran")


@needs_sample
def test_verify_games_plays_games_without_a_walkthrough(tmp_path, capsys):
    from selskill.cli import main

    root = _copy([_trial(p) for p in ONE_PER_TYPE], tmp_path / "data")
    report = verify_games(find_games(root))
    assert report.winnable == 6 and report.won_by == {"ours": 6} and report.patched == 6
    assert main(["verify-games", str(root), "--quiet", "--max-steps", "2"]) == 1
    captured = capsys.readouterr()
    assert "0/6 winnable" in captured.out and "lost 6 (step_limit=6)" in captured.out
    assert "NOT WINNABLE train/" in captured.err and "6 patched" in captured.err


@needs_sample
def test_verify_games_with_alfworlds_handcoded_expert(tmp_path):
    root = _copy([_trial(ONE_PER_TYPE[0])], tmp_path / "data")
    report = verify_games(find_games(root), expert="handcoded")
    assert report.total == 1 and (report.winnable, report.won_by) == (1, {"handcoded": 1}), report.failures


@needs_sample
def test_play_walkthrough_on_real_data_lets_the_expert_play(capsys):
    from selskill.cli import main

    assert main(["play", str(_trial("CD-None-DeskLamp-307")), "--walkthrough"]) == 0
    out = capsys.readouterr().out
    assert "stores no walkthrough" in out and "won=True" in out and "> open drawer 3" in out


def test_expert_reads_both_arrival_texts():
    first = EnvState(
        observation="Looking quickly around you, you see a drawer 8, and a sidetable 1.\n",
        admissible_commands=["go to drawer 8", "go to sidetable 1"],
        task="",
        won=False,
        done=False,
        env_steps=0,
    )
    spec = TaskSpec("pick_and_place_simple", "pen", "sidetable", 1)
    for arrival in (
        "You arrive at loc 12. The drawer 8 is closed.",
        "You arrive at drawer 8. The drawer 8 is closed.",
    ):
        ex = Expert(spec, first)
        after = EnvState(
            arrival, ["examine drawer 8", "open drawer 8", "go to sidetable 1"], "", False, False, 1
        )
        ex.observe("go to drawer 8", after)
        assert ex.loc == "drawer 8" and "drawer 8" in ex.closed
        assert ex.next_command() == "open drawer 8"


@pytest.mark.slow
@needs_sample
def test_expert_wins_95_percent_of_the_sample():
    from selskill.benchmarks.alfworld.demos import DemoBudget, DemoMix, build_demos

    report = build_demos(
        find_games(SAMPLE, "train"), mix=DemoMix.none(), seed=0, budget=DemoBudget(max_env_steps=50)
    )
    assert len(report.demos) >= 57, report.dropped
