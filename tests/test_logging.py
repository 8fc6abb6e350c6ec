"""selskill's messages go through `logging` with one level: the recipe key `log_level` (any case) or,
for commands without a recipe, `--log_level`; INFO lines read as plain messages."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fixtures_run import write_fixture_run

from selskill.config import load_recipe
from selskill.monitor.logs import configure, level_number
from selskill.stages.table import stage_main

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "recipes" / "tiny.yaml")


def test_info_lines_are_the_message_and_other_levels_carry_their_name(capsys):
    log = logging.getLogger("selskill.test")
    configure("info")
    log.info("sample: rank 0 already complete")
    log.warning("train: skipping checkpoint-3")
    log.debug("not shown")
    assert (
        capsys.readouterr().err == "sample: rank 0 already complete\nwarning: train: skipping checkpoint-3\n"
    )
    configure("WARNING")
    log.info("not shown either")
    log.error("shown")
    captured = capsys.readouterr()
    assert captured.err == "error: shown\n" and captured.out == ""


def test_a_bad_level_is_refused_naming_the_levels(tmp_path, capsys):
    with pytest.raises(
        ValueError, match=r"log_level: 'loud' is not a level; use one of debug, info, warning"
    ):
        level_number("loud")
    with pytest.raises(SystemExit) as exc:
        load_recipe(["--config", TINY, "--log_level", "loud"])
    assert exc.value.code == 2 and "invalid choice: 'loud'" in capsys.readouterr().err
    from selskill.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["report", "--exp", str(tmp_path), "--log_level", "loud"])
    assert exc.value.code == 2


def test_the_recipes_log_level_sets_selskills_level_in_any_case():
    recipe = load_recipe(["--config", TINY, "--log_level", "WARNING"])
    assert recipe.run.log_level == "warning"
    assert recipe.train.log_level == "warning"  # what TRL's Trainer reads for transformers' level
    assert logging.getLogger("selskill").level == logging.WARNING
    load_recipe(["--config", TINY])  # passive, TRL's default: selskill says what it does
    assert logging.getLogger("selskill").level == logging.INFO


def test_log_level_warning_silences_a_stages_info_lines(tmp_path, capsys):
    write_fixture_run(tmp_path / "runs", "fx")
    argv = ["--config", TINY, "--runs_dir", str(tmp_path / "runs"), "--exp", "fx", "--world_size", "1"]
    assert stage_main("label", [*argv, "--log_level", "WARNING"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
    assert stage_main("label", argv) == 0
    assert "label: rank 0 already complete, skipping" in capsys.readouterr().err


def test_commands_without_a_recipe_take_log_level(tmp_path, capsys):
    from selskill.cli import main

    exp = write_fixture_run(tmp_path / "runs", "fx")
    assert main(["report", "--exp", str(exp), "--n-boot", "20", "--log_level", "error"]) == 0
    assert logging.getLogger("selskill").level == logging.ERROR
    assert "wrote " in capsys.readouterr().out  # the command's result is printed whatever the level
