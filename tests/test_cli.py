"""The user-facing commands: gen-games, verify-games, play, --help."""

import json
import subprocess
import sys

import pytest

from selskill.cli import main


def test_gen_then_verify_prints_all_winnable(tmp_path, capsys):
    assert main(["gen-games", "--out", str(tmp_path), "--per-type", "1", "--seed", "5", "--quiet"]) == 0
    assert main(["verify-games", str(tmp_path), "--quiet"]) == 0
    assert capsys.readouterr().out.strip().endswith("6/6 winnable")


def test_verify_fails_on_a_game_its_solution_cannot_win(tmp_path, capsys):
    main(
        [
            "gen-games",
            "--out",
            str(tmp_path),
            "--per-type",
            "1",
            "--quiet",
            "--task-types",
            "pick_and_place_simple",
            "pick_heat_then_place_in_recep",
        ]
    )
    game = next(tmp_path.rglob("game.tw-pddl"))
    data = json.loads(game.read_text())
    data["walkthrough"] = data["walkthrough"][:-1]
    game.write_text(json.dumps(data))
    assert main(["verify-games", str(tmp_path), "--quiet"]) == 1
    captured = capsys.readouterr()
    assert "1/2 winnable" in captured.out and "solution_does_not_win" in captured.err


def test_errors_name_the_bad_input(tmp_path, capsys):
    assert main(["verify-games", str(tmp_path / "nowhere")]) == 2
    assert "none of the splits" in capsys.readouterr().err


def test_play_walkthrough_wins(small_games, capsys):
    trial = next(small_games.rglob("game.tw-pddl")).parent
    assert main(["play", str(trial), "--walkthrough"]) == 0
    assert "won=True" in capsys.readouterr().out


def test_play_interactive_with_a_skill_call(small_games):
    from selskill.benchmarks.alfworld.play import play_game

    trial = next(p.parent for p in small_games.rglob("game.tw-pddl") if "pick_heat" in str(p))
    solution = json.loads((trial / "traj_data.json").read_text())["selskill"]["solution"]
    take = next(i for i, c in enumerate(solution) if c.startswith("take "))
    obj = solution[take].split(" from ")[0].removeprefix("take ")
    after = solution[take + 3 :]  # skip go to microwave + heat: the skill does both
    inputs = iter(solution[: take + 1] + ["<action>look</action>", "/heat_object", *after, "/quit"])
    lines = []
    assert play_game(str(trial), read=lambda _: next(inputs), out=lines.append) == 0
    text = "\n".join(lines)
    assert f"You heat the {obj}" in text
    assert "[skill heat_object: precise=True error=None env_steps=2]" in text
    assert lines[-1].startswith("won=True")


@pytest.mark.parametrize("sub", ["gen-games", "verify-games", "play"])
def test_help_explains_each_subcommand(sub):
    out = subprocess.run(
        [sys.executable, "-m", "selskill.cli", sub, "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "usage: selskill" in out.stdout and len(out.stdout) > 300


def test_a_benchmark_adds_its_commands_through_benchmark_commands(monkeypatch, capsys):
    """The core lists name no benchmark: what `benchmark_commands` returns is all a benchmark adds,
    top-level and under `selskill bench`, each with its own options and exit status."""
    import selskill.cli as cli
    from selskill.command import Command

    ran = []
    top = Command(
        "hello",
        help="greet",
        description="Greets.",
        add_arguments=lambda p: p.add_argument("--times", type=int, default=1),
        run=lambda args: ran.append(("hello", args.times)) or 0,
    )
    sub = Command(
        "hello", help="greet", description="Greets.", run=lambda args: ran.append(args.log_level) or 3
    )
    monkeypatch.setattr(cli, "benchmark_commands", lambda: ([top], [sub]))
    assert main(["hello", "--times", "2"]) == 0
    assert main(["bench", "hello", "--log_level", "warning"]) == 3
    assert ran == [("hello", 2), "warning"]
    with pytest.raises(SystemExit) as gone:
        main(["gen-games", "--out", "x", "--per-type", "1"])
    assert gone.value.code == 2 and "invalid choice: 'gen-games'" in capsys.readouterr().err
    listed = cli.build_parser().format_help()
    assert "hello" in listed and "round" in listed and "gen-games" not in listed


def test_a_bench_script_is_the_command(capsys):
    """pipelines/probe_pairs.py is `selskill bench probe-pairs`: the same checks, the same one-line error."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "pipelines" / "probe_pairs.py"
    spec = importlib.util.spec_from_file_location("probe_pairs_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for entry in (script.main, lambda argv: main(["bench", "probe-pairs", *argv])):
        assert entry(["--models", "init"]) == 2
        assert capsys.readouterr().err == "error: --models takes NAME=PATH entries, got 'init'\n"
