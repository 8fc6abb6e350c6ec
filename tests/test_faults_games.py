"""Fault injection, part 2: games identified by content, one-line errors from every entry point, dry runs.

Regenerated or edited games (ALFWorld, generated and real) and another bfcl-eval version or
data are refused like a changed recipe; a corrupt shard, a full disk and a mistyped model
path read as the same one line whichever entry point met them; a dry run under the local
or Ray executor writes nothing.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_faults import ENV, ROOT, _compute, _run, _sample_rank, branch_rows
from test_pipeline_stages import _inproc

from selskill.benchmarks.alfworld.config import AlfworldConfig
from selskill.benchmarks.alfworld.env import data_root
from selskill.benchmarks.alfworld.generate import generate_games
from selskill.config import RunConfig
from selskill.data import manifest
from selskill.data.contract import StageRefused
from selskill.data.inputs import StageInputs
from selskill.data.layout import StageDir, check_model_source
from selskill.data.rank_writer import run_rank
from selskill.data.shards import ShardError
from selskill.errors import error_message, run_main
from selskill.executors import StageFailed
from selskill.stages.table import stage_main
from selskill.stages.task_source import games_identity

# --- games identified by content -----------------------------------------------------------------------


def _played(run: RunConfig, games: dict, stage: str = "sample", upstream=()) -> bool:
    """One rank of a toy stage that records `games` as what it played."""
    inputs = StageInputs([run], 3, 1, upstream=upstream, games=games)
    return run_rank(StageDir.of(run.runs_dir, "t", 1, stage), "branch", run, inputs, _compute(branch_rows(2)))


@pytest.fixture
def games_recipe(tmp_path, small_games, tiny_model_dir):
    games = tmp_path / "games"
    shutil.copytree(small_games, games)
    path = tmp_path / "recipe.yaml"
    path.write_text(
        f"exp: t\nruns_dir: {tmp_path / 'runs'}\ngames_dir: {games}\nmodel_name_or_path: {tiny_model_dir}\n"
        "sample_k: 1\nsample_max_tasks: 2\nmax_env_steps: 2\nmax_new_tokens: 8\nconcurrent_episodes: 2\n"
        "policy_batch_size: 4\nseed: 3\nworld_size: 2\n"
    )
    return path, games


def test_regenerated_games_are_refused_by_every_rank_until_redo(games_recipe, capsys):
    recipe, games = games_recipe
    assert _inproc("sample", recipe, "--rank", "0") == 0
    stage = StageDir.of(recipe.parent / "runs", "t", 1, "sample")
    before = json.loads(stage.marker(0).read_text())["inputs"]["games"]["train"]
    assert (games / ".manifest-train.json").is_file() and before["files"] == 12  # 6 trials x 2 files
    generate_games(games, per_type=1, seed=1, split="train", size="small")  # another seed, same folder
    capsys.readouterr()
    assert _inproc("sample", recipe, "--rank", "0") == 2  # was: "rank 0 already complete, skipping"
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "games.train.files: 12 -> 24" in err and "--redo" in err, err
    assert _inproc("sample", recipe, "--rank", "1") == 2  # was: played the new games beside rank 0's old ones
    err = capsys.readouterr().err
    assert "its rank 0 was computed with other inputs" in err and "games.train.sha256" in err
    assert not stage.marker(1).exists()
    assert _inproc("sample", recipe, "--rank", "0", "--redo", "true") == 0
    after = json.loads(stage.marker(0).read_text())["inputs"]["games"]["train"]
    assert after["files"] == 24 and after["sha256"] != before["sha256"]
    # an edit in place, same size: the file's stat changed, so it is hashed again
    game = sorted(games.rglob("game.tw-pddl"))[0]
    game.write_bytes(game.read_bytes()[:-1] + b" ")  # its closing newline made a space
    capsys.readouterr()
    assert _inproc("sample", recipe, "--rank", "0") == 2
    assert "games.train.sha256" in capsys.readouterr().err


def test_real_data_is_indexed_once_under_runs_dir_and_an_edited_file_is_a_change(tmp_path, monkeypatch):
    sample = os.environ.get("ALFWORLD_DATA")
    if not sample or not (data_root(sample) / "train").is_dir():
        pytest.skip("real ALFWorld games not found: set ALFWORLD_DATA to a folder holding json_2.1.1/train/")
    real = tmp_path / "alfworld"
    shutil.copytree(sample, real)  # edited below: never the shared copy
    monkeypatch.setenv("ALFWORLD_DATA", str(real))
    run = RunConfig(runs_dir=str(tmp_path / "runs"))
    run.benchmark_settings = AlfworldConfig(use_alfworld_data=True)
    hashed = []
    real_sha = manifest.file_sha256
    monkeypatch.setattr(manifest, "file_sha256", lambda p: hashed.append(p) or real_sha(p))
    first = games_identity(run, ["train"])
    assert first["train"]["files"] == len(hashed) > 0
    stores = list((tmp_path / "runs" / manifest.MANIFESTS_DIR).glob("alfworld-train-*.json"))
    assert len(stores) == 1 and not list(real.rglob(".manifest*"))  # data selskill does not own is left alone
    hashed.clear()
    assert games_identity(run, ["train"]) == first and hashed == []  # a rerun only stats the files
    traj = sorted(real.rglob("traj_data.json"))[0]
    traj.write_text(traj.read_text() + " ")
    changed = games_identity(run, ["train"])
    assert hashed == [traj] and changed["train"]["sha256"] != first["train"]["sha256"]
    assert _played(_run(tmp_path), first) is True
    with pytest.raises(StageRefused, match=r"games\.train\.sha256: '[0-9a-f]+' -> '[0-9a-f]+'.*--redo"):
        _played(_run(tmp_path), changed)


def test_another_bfcl_eval_version_or_data_is_refused(tmp_path, monkeypatch):
    pytest.importorskip("bfcl_eval")
    from selskill.benchmarks.bfcl import env as bfcl

    run = _run(tmp_path, benchmark="bfcl")
    games = games_identity(run, ["train"])
    assert games["train"]["bfcl-eval"] == bfcl.installed_version() and games["train"]["files"] == 20
    assert _played(run, games) is True
    assert _played(run, games_identity(run, ["train"])) is False  # unchanged: skipped
    # bfcl-eval's data edited (simulated in the manifest: a file's recorded hash no longer the one it had)
    (store,) = (tmp_path / "runs" / manifest.MANIFESTS_DIR).glob("bfcl-eval-*.json")
    kept = store.read_text()
    data = json.loads(kept)
    data["files"]["possible_answer/BFCL_v4_multi_turn_base.json"]["sha256"] = "0" * 64
    store.write_text(json.dumps(data))
    with pytest.raises(
        StageRefused,
        match=r"rank 0 was computed with other inputs than this run: games\.train\.sha256: .*--redo",
    ):
        _played(run, games_identity(run, ["train"]))
    store.write_text(kept)
    monkeypatch.setattr(bfcl, "installed_version", lambda: "2099.1.1")
    with pytest.raises(StageRefused) as err:
        _played(run, games_identity(run, ["train"]))
    assert f"games.train.bfcl-eval: '{games['train']['bfcl-eval']}' -> '2099.1.1'" in str(err.value)
    assert "sha256" not in str(err.value)  # only the version changed


def test_a_fork_on_games_changed_since_the_sample_is_refused(tmp_path):
    old, new = {"train": {"files": 2, "sha256": "a"}}, {"train": {"files": 2, "sha256": "b"}}
    assert _played(_run(tmp_path), old, "sample") is True
    with pytest.raises(StageRefused, match=r"fork: the games changed since the sample stage played them: "
                       r"games\.train\.sha256: 'a' -> 'b'.*from sample with --redo"):  # fmt: skip
        _played(_run(tmp_path, redo=True), new, "fork", upstream=("sample",))
    assert _played(_run(tmp_path), old, "fork", upstream=("sample",)) is True


def test_a_marker_written_before_games_were_recorded_is_reused_with_a_note(tmp_path):
    run = _run(tmp_path)
    stage = StageDir.of(run.runs_dir, "t", 1, "sample")
    run_rank(stage, "branch", run, StageInputs([run], 3, 1), _compute(branch_rows(2)))
    lines = []
    inputs = StageInputs([run], 3, 1, games={"train": {"files": 2, "sha256": "a"}})
    assert run_rank(stage, "branch", run, inputs, _compute([]), log=lines.append) is False
    assert any("predates recorded games" in line and "--redo" in line for line in lines)


# --- one-line errors from every entry point ------------------------------------------------------------


def _error_lines(err: str) -> list[str]:
    return [line for line in err.strip().splitlines() if line.strip()]


def _raise(exc: BaseException):
    def main():
        raise exc

    return main


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (ValueError("sample_k must be >= 1"), 2),
        (FileNotFoundError("no policy at runs/t/round_0/train/model"), 2),
        (StageRefused("sample: rank 0 was computed with other inputs"), 2),
        (ShardError("sample rank 0: shard does not match"), 2),
        (StageFailed("sample: 2 of 4 ranks failed"), 1),
        (OSError(errno.EIO, os.strerror(errno.EIO), "runs/t/x.json"), 1),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_one_wrapper_gives_every_error_its_line_and_status(exc, status, capsys):
    assert run_main(_raise(exc)) == status
    (line,) = _error_lines(capsys.readouterr().err)
    assert line == f"error: {error_message(exc)}" and "Traceback" not in line
    with pytest.raises(KeyError):  # a bug keeps its traceback
        run_main(_raise(KeyError("bug")))


def test_a_checksum_mismatch_is_the_same_line_from_pipelines_stages_and_selskill(tmp_path, capsys):
    from selskill.cli import main

    _sample_rank(tmp_path, 0, world_size=1)
    run = _run(tmp_path)
    branch = StageDir.of(run.runs_dir, "t", 1, "branch")
    run_rank(branch, "branch", run, StageInputs([run], 3, 1), _compute(branch_rows(2)))
    shard = StageDir.of(run.runs_dir, "t", 1, "sample").shard(0)
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"exp: t\nruns_dir: {tmp_path / 'runs'}\nmodel_name_or_path: {model}\nseed: 3\n")
    argv = ["--config", str(recipe)]
    got = {}
    capsys.readouterr()
    assert stage_main("fork", argv) == 2
    got["python -m selskill.stages fork"] = capsys.readouterr().err
    assert _inproc("fork", recipe) == 2
    got["pipelines/fork.py (main)"] = capsys.readouterr().err
    assert main(["bench", "label-agreement", *argv]) == 2
    got["selskill bench label-agreement"] = capsys.readouterr().err
    done = subprocess.run(
        [sys.executable, str(ROOT / "pipelines" / "fork.py"), *argv],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    got["pipelines/fork.py"] = done.stderr
    lines = {name: _error_lines(err) for name, err in got.items()}
    want = f"error: sample rank 0: shard {shard} does not match the sha256 its marker records"
    for name, err in lines.items():
        assert len(err) == 1 and err[0].startswith(want) and "Rerun the sample stage" in err[0], (name, err)
    assert len({tuple(v) for v in lines.values()}) == 1, lines


@pytest.mark.parametrize(
    "fault",
    [
        OSError("Error writing bytes to file. Detail: [errno 28] No space left on device"),  # pyarrow's words
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/elsewhere/.00000.parquet.1-ab.tmp"),
    ],
    ids=["pyarrow", "errno"],
)
def test_a_full_disk_names_the_file_being_written(tmp_path, capsys, monkeypatch, fault):
    from selskill.data import shards

    _sample_rank(tmp_path, 0, world_size=1)

    def full(table, path):
        Path(path).write_bytes(b"PAR1 half")  # a part written, then the disk is full
        raise fault

    monkeypatch.setattr(shards, "_write_parquet", full)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"exp: t\nruns_dir: {tmp_path / 'runs'}\nseed: 3\nlabel_kinds: episode\n")
    capsys.readouterr()
    assert stage_main("label", ["--config", str(recipe)]) == 1
    err = _error_lines(capsys.readouterr().err)
    label = StageDir.of(tmp_path / "runs", "t", 1, "label")
    assert err == [
        f"error: {label.shard(0)}: cannot write: No space left on device (free space on that filesystem, "
        "then rerun: complete ranks are skipped)"
    ]
    assert not label.marker(0).exists() and not list(label.shards.iterdir())  # nothing half-written stays


def test_a_relative_model_path_that_does_not_exist_gets_the_fix(tmp_path, monkeypatch, capsys, games_recipe):
    recipe, _ = games_recipe
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "tiny-qwen").mkdir(parents=True)
    with pytest.raises(FileNotFoundError) as err:
        check_model_source("models/tiny", "model_name_or_path")
    msg = str(err.value)
    assert f"models/tiny does not exist (a local path under {tmp_path}" in msg
    assert "Did you mean models/tiny-qwen?" in msg and "save_pretrained" in msg and "hub id" in msg
    capsys.readouterr()
    assert _inproc("sample", recipe, "--model_name_or_path", "models/tiny") == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert line == f"error: {msg}"


# --- dry runs compute nothing ----------------------------------------------------------------------------


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.is_dir(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_a_local_dry_run_on_a_fresh_experiment_writes_nothing(tmp_path, monkeypatch, capsys):
    from selskill.cli import main

    shutil.copy(ROOT / "recipes" / "tiny.yaml", tmp_path / "tiny.yaml")  # runs/ and runs/games-tiny: relative
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "ray", None)  # a Ray dry run needs no Ray
    before = _tree(tmp_path)
    capsys.readouterr()
    assert main(["round", "--config", "tiny.yaml", "--dry_run"]) == 0
    out = capsys.readouterr().out
    for stage in ("init", "sample", "branch", "fork", "label", "train", "eval"):
        assert f"\n  {sys.executable} -m selskill.stages {stage} --config tiny.yaml" in f"\n{out}", out
    assert "sample: K rollouts per task" in out and "rank R of 2 (R = 0..1), in 2 worker processes" in out
    assert "not complete: would compute" in out and out.rstrip().endswith("and nothing computed")
    assert main(["round", "--config", "tiny.yaml", "--dry_run", "--executor", "ray"]) == 0
    assert "as 2 Ray tasks of 1.0 CPUs" in capsys.readouterr().out
    assert main(["init", "--config", "tiny.yaml", "--dry_run"]) == 0
    assert "init: games" in capsys.readouterr().out
    assert stage_main("sample", ["--config", "tiny.yaml", "--dry_run", "--rank", "1"]) == 0
    assert "--rank 1 --world_size 2" in capsys.readouterr().out
    assert main(["eval", "--config", "tiny.yaml", "--model", "models/none", "--dry_run"]) == 0
    assert "dry run: would evaluate models/none" in capsys.readouterr().out
    assert _tree(tmp_path) == before
