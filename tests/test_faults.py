"""Fault injection on the stage contract (issue 16): each fault gives a clear error naming the
input and the fix, or a correct recovery.

Concurrent writers, stale results, a truncated shard behind its marker, a missing upstream
rank, a half-written checkpoint, bad recipe values, bad model paths, unreadable game files,
and the smaller ones (round 0, a mistyped RECIPE, an init built with other settings).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from fixtures_run import rollout_row
from test_pipeline_stages import _inproc, recipe  # noqa: F401 (the fixture)

from selskill.benchmarks.alfworld.config import AlfworldConfig
from selskill.config import PolicyConfig, RunConfig
from selskill.data.contract import StageRefused, read_stage
from selskill.data.inputs import StageInputs, changed_settings
from selskill.data.layout import StageDir, check_model_source, resolve_round_policy
from selskill.data.rank_writer import run_rank
from selskill.data.shards import ShardError
from selskill.data.stage_stats import StageStats, collect_stats
from selskill.stages.label import LabelConfig, LabelStep
from selskill.stages.sample import SampleConfig
from selskill.stages.task_source import task_list

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}


def branch_rows(n: int, tag: str = "b") -> list[dict]:
    return [
        {
            "branch_id": f"r1/train/t/{tag}{i}/t0",
            "rollout_id": f"r1/train/t/{tag}{i}",
            "task_id": "train/t",
            "task_type": "pick_and_place_simple",
            "round": 1,
            "turn_index": 0,
            "token_offset": 6,
            "pool": "ordinary",
            "score": 0.5,
            "strategy": "entropy",
            "candidate_skill": "heat_object",
            "original_decision": "skip",
            "source_env_steps_before": 0,
        }
        for i in range(n)
    ]


def _run(tmp_path, **kw) -> RunConfig:
    return RunConfig(**{"exp": "t", "runs_dir": str(tmp_path / "runs"), **kw})


def _compute(rows):
    def compute(stats: StageStats) -> list[dict]:
        return rows

    return compute


def _branch_rank(run, sample_k=2, seed=3, rows=None, log=print, compute=None) -> bool:
    """One rank of a toy stage (named `branch`) whose inputs are a real RunConfig + SampleConfig."""
    stage = StageDir.of(run.runs_dir, run.exp, run.round, "branch")
    inputs = StageInputs([run, SampleConfig(sample_k=sample_k)], seed, code_version=1)
    return run_rank(stage, "branch", run, inputs, compute or _compute(rows or branch_rows(5)), log=log)


# --- 1. two writers on one rank ------------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from test_faults import _branch_rank, _run, branch_rows

    def slow(stats):
        Path({started!r}).write_text("x")
        time.sleep(3)
        return branch_rows(400)

    _branch_rank(_run(Path({tmp!r})), compute=slow)
    """
)


def test_a_second_writer_on_a_rank_is_refused_and_readers_never_see_a_partial_file(tmp_path):
    started = tmp_path / "started"
    code = WRITER.format(tests=str(ROOT / "tests"), tmp=str(tmp_path), started=str(started))
    proc = subprocess.Popen([sys.executable, "-c", code], env=ENV, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not started.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert started.exists(), proc.stderr.read() if proc.poll() is not None else "writer did not start"
    run = _run(tmp_path, rank=0, world_size=1)
    with pytest.raises(StageRefused, match=rf"rank 0 is being computed by another process \(pid {proc.pid} "):
        _branch_rank(run)
    stage = StageDir.of(run.runs_dir, "t", 1, "branch")
    reads = 0
    while proc.poll() is None:  # readers while the first writer finishes: absent, or whole
        if stage.shard(0).exists():
            assert pq.read_table(stage.shard(0)).num_rows == 400
            reads += 1
        time.sleep(0.01)
    assert proc.returncode == 0, proc.stderr.read()
    assert stage.is_complete(0) and pq.read_table(stage.shard(0)).num_rows == 400
    assert not list(stage.shards.glob(".*.tmp"))
    lines = []
    assert _branch_rank(run, log=lines.append) is False and "already complete, skipping" in lines[-1]


RACER = textwrap.dedent(
    """
    import sys
    from selskill.data.shards import write_shard
    rows = [{{"branch_id": str(i), "rollout_id": "r", "task_id": "t", "task_type": "x", "round": 1,
              "turn_index": 0, "token_offset": 0, "pool": "ordinary", "score": 0.0, "strategy": "entropy",
              "candidate_skill": "", "original_decision": "skip", "source_env_steps_before": 0}}
            for i in range(3000)]
    for _ in range(40):
        write_shard(rows, {path!r}, "branch")
    """
)


def test_racing_writers_of_one_file_never_expose_a_partial_one(tmp_path):
    """The write itself (without the rank lock): unique temporary names, so no reader ever sees a torn file."""
    path = tmp_path / "shards" / "00000.parquet"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER.format(path=str(path))], env=ENV, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    reads = 0
    while any(p.poll() is None for p in procs):
        if path.exists():
            assert pq.read_table(path).num_rows == 3000
            reads += 1
    assert [p.returncode for p in procs] == [0, 0], [p.stderr.read() for p in procs]
    assert reads > 0 and not list(path.parent.glob(".*.tmp"))


# --- 2. stale results: changed inputs on a rerun ---------------------------------------------------------


def test_a_rerun_with_other_inputs_is_refused_naming_the_keys_and_redo_recomputes(tmp_path):
    run = _run(tmp_path)
    assert _branch_rank(run, sample_k=2, seed=3) is True
    stage = StageDir.of(run.runs_dir, "t", 1, "branch")
    marker = json.loads(stage.marker(0).read_text())
    assert marker["inputs"]["sample_k"] == 2 and marker["inputs"]["seed"] == 3 and marker["fingerprint"]
    assert yaml.safe_load(stage.config.read_text())["seed"] == 3  # config.yaml records the seed
    with pytest.raises(StageRefused) as err:
        _branch_rank(run, sample_k=3, seed=7)
    msg = str(err.value)
    assert "sample_k: 2 -> 3" in msg and "seed: 3 -> 7" in msg and "--redo" in msg
    assert yaml.safe_load(stage.config.read_text())["sample_k"] == 2  # still what the rows were computed with
    # keys that say where or as whom a stage runs are not inputs
    assert _branch_rank(_run(tmp_path, wandb_project="other"), sample_k=2, seed=3) is False
    redo = _run(tmp_path, redo=True)
    assert _branch_rank(redo, sample_k=3, seed=7, rows=branch_rows(2)) is True
    assert json.loads(stage.marker(0).read_text())["inputs"]["sample_k"] == 3
    assert yaml.safe_load(stage.config.read_text())["seed"] == 7


def test_a_rank_computed_with_other_inputs_than_its_siblings_is_refused(tmp_path):
    assert _branch_rank(_run(tmp_path, rank=0, world_size=2), sample_k=2) is True
    with pytest.raises(StageRefused, match=r"its rank 0 was computed with other inputs.*sample_k: 2 -> 4"):
        _branch_rank(_run(tmp_path, rank=1, world_size=2), sample_k=4)
    # forced with --redo, the stage is mixed: readers refuse it
    _branch_rank(_run(tmp_path, rank=1, world_size=2, redo=True), sample_k=4)
    with pytest.raises(StageRefused, match=r"ranks 0 and 1 were computed with different inputs.*--redo"):
        read_stage(StageDir.of(tmp_path / "runs", "t", 1, "branch"), "branch", 2)


def test_the_sample_stage_refuses_a_changed_recipe_and_records_its_seed(recipe, tmp_path, capsys):  # noqa: F811
    runs = tmp_path / "runs"
    assert _inproc("sample", recipe, "--sample_max_tasks", "1", "--sample_k", "1") == 0
    stage = StageDir.of(runs, "t", 1, "sample")
    assert yaml.safe_load(stage.config.read_text())["seed"] == 3
    capsys.readouterr()
    assert _inproc("sample", recipe, "--sample_max_tasks", "1", "--sample_k", "3", "--seed", "7") == 2
    err = capsys.readouterr().err
    assert "sample_k: 1 -> 3" in err and "seed: 3 -> 7" in err and "--redo" in err
    assert _inproc("sample", recipe, "--sample_max_tasks", "1", "--sample_k", "1") == 0  # unchanged: reused
    assert "already complete, skipping" in capsys.readouterr().err


# --- 3. a marker over a truncated shard ------------------------------------------------------------------


def test_a_truncated_shard_behind_its_marker_is_not_complete_and_is_recomputed(tmp_path):
    run = _run(tmp_path)
    _branch_rank(run)
    stage = StageDir.of(run.runs_dir, "t", 1, "branch")
    marker = json.loads(stage.marker(0).read_text())
    assert {"rows", "bytes", "sha256"} <= set(marker) and marker["rows"] == 5
    assert not list(stage.completions.glob(".*.tmp"))  # written via a temporary file + rename
    data = stage.shard(0).read_bytes()
    stage.shard(0).write_bytes(data[: len(data) // 2])
    assert not stage.is_complete(0) and "truncated" in stage.problem(0)
    with pytest.raises(ShardError, match=rf"{stage.shard(0)} has \d+ bytes but its marker records"):
        read_stage(stage, "branch", 1)
    lines = []
    assert _branch_rank(run, log=lines.append) is True
    assert any("is recomputed" in line and "truncated" in line for line in lines)
    assert read_stage(stage, "branch", 1).num_rows == 5
    # same size, other bytes: the checksum catches it; an unreadable marker is no marker
    stage.shard(0).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert "sha256" in stage.problem(0)
    stage.marker(0).write_text('{"rows": 5, "by')
    assert "unreadable" in stage.problem(0)


# --- 4. a missing upstream rank -------------------------------------------------------------------------


def _sample_rank(tmp_path, rank: int, world_size: int = 2):
    run = _run(tmp_path, rank=rank, world_size=world_size)
    rows = [
        rollout_row("t", 1, f"train/pick_and_place_simple/t{rank}", "pick_and_place_simple", k, plan, k)
        for k, plan in enumerate([(True, 0, 0, 4, 0), (False, 0, 0, 6, 0)])
    ]
    stage = StageDir.of(run.runs_dir, "t", 1, "sample")
    run_rank(stage, "rollout", run, StageInputs([run], 3, 1), _compute(rows))


def test_label_refuses_a_sample_stage_with_a_missing_rank(tmp_path):
    _sample_rank(tmp_path, 0)
    run = _run(tmp_path, rank=0, world_size=2)
    with pytest.raises(FileNotFoundError, match=r"sample: rank 1 of world size 2 has not finished.*--rank R"):
        LabelStep(run, LabelConfig(label_kinds="episode"), 3).run(run.rank, run.world_size)
    _sample_rank(tmp_path, 1)
    assert LabelStep(run, LabelConfig(label_kinds="episode"), 3).run(run.rank, run.world_size) is True


def test_branch_and_fork_refuse_a_missing_upstream_rank(tmp_path, tiny_model_dir):
    from selskill.config.rollout import RolloutConfig
    from selskill.stages.branch import BranchConfig, BranchStep
    from selskill.stages.fork import ForkConfig, ForkStep

    _sample_rank(tmp_path, 0)
    pol = PolicyConfig(model_name_or_path=str(tiny_model_dir))
    run = _run(tmp_path, rank=0, world_size=2)
    with pytest.raises(FileNotFoundError, match=r"sample: rank 1 of world size 2 has not finished"):
        BranchStep(run, BranchConfig(), 3, policy=pol, rollout=RolloutConfig()).run(run.rank, run.world_size)
    _sample_rank(tmp_path, 1)
    branch = StageDir.of(run.runs_dir, "t", 1, "branch")
    run_rank(branch, "branch", run, StageInputs([run], 3, 1), _compute(branch_rows(2)))  # rank 0 of 2 only
    with pytest.raises(FileNotFoundError, match=r"branch: rank 1 of world size 2 has not finished"):
        ForkStep(run, ForkConfig(), 3, policy=pol, rollout=RolloutConfig()).run(run.rank, run.world_size)


def test_ranks_left_from_a_larger_world_size_are_named(tmp_path):
    for rank in (0, 1):
        _sample_rank(tmp_path, rank)
    run = _run(tmp_path, rank=0, world_size=1, redo=True)
    stage = StageDir.of(run.runs_dir, "t", 1, "sample")
    run_rank(stage, "rollout", run, StageInputs([run], 3, 1), _compute([]))
    with pytest.raises(FileNotFoundError, match="different world sizes"):
        read_stage(stage, "rollout", 1)


# --- 5. a half-written checkpoint: tests/test_faults_train.py, with the train stage's other faults ---------


# --- 6. bad values in every recipe section ---------------------------------------------------------------


@pytest.mark.parametrize(
    "args, key",
    [
        (["--sample_k", "-2"], "sample_k"),
        (["--max_env_steps", "-5"], "max_env_steps"),
        (["--sample_max_tasks", "-3"], "sample_max_tasks"),
        (["--fork_k_invoke", "-1", "--fork_k_skip", "-1"], "fork_k_invoke"),
        (["--label_kinds", "nope"], "label_kinds"),
        (["--games_size", "huge"], "games_size"),
        (["--init_layers", "0"], "init_layers"),
        (["--eval_splits", "valid_sene"], "eval_splits"),
        (["--branch_score_m", "0"], "branch_score_m"),
        (["--policy_dtype", "fp8"], "policy_dtype"),
    ],
)
def test_bad_values_are_refused_naming_the_key_and_the_fix(tmp_path, capsys, args, key):
    assert _inproc("sample", ROOT / "recipes" / "tiny.yaml", *args, runs_dir=tmp_path) == 2
    err = capsys.readouterr().err
    assert f"{key} must be" in err and f"--{key}" in err and "in the recipe" in err
    assert not (tmp_path / "tiny").exists()  # nothing written: no empty shard, no marker


def test_a_wrong_type_prints_the_one_line_that_matters(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("exp: t\nsample_k: abc\n")
    r = subprocess.run(
        [sys.executable, str(ROOT / "pipelines" / "sample.py"), "--config", str(bad)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and "--sample_k" in r.stderr and "invalid int value: 'abc'" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 3, r.stderr  # not ~218 lines of usage first


# --- 7. model errors that name the input -----------------------------------------------------------------


def test_model_errors_name_the_input_and_the_fix(tmp_path, monkeypatch):
    empty = tmp_path / "empty_model"
    empty.mkdir()
    run = RunConfig(exp="t", runs_dir=str(tmp_path))
    with pytest.raises(
        FileNotFoundError, match=rf"model_name_or_path {empty} is not a saved model.*the directory is empty"
    ):
        resolve_round_policy(run, PolicyConfig(model_name_or_path=str(empty)))
    (empty / "tokenizer.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"no config.json and no weights"):
        check_model_source(str(empty), "the policy")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = "selskill-tests/not-in-any-cache"
    with pytest.raises(FileNotFoundError) as err:
        resolve_round_policy(run, PolicyConfig(model_name_or_path=hub))
    assert hub in str(err.value) and "HF_HUB_OFFLINE=1" in str(err.value) and "hf download" in str(err.value)

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    with pytest.raises(
        FileNotFoundError, match=r"model_name_or_path models/tiny does not exist \(a local path"
    ):
        resolve_round_policy(run, PolicyConfig(model_name_or_path="models/tiny"))


def test_loading_an_empty_policy_directory_names_it(tmp_path):
    from selskill.config.rollout import RolloutConfig
    from selskill.stages.policy_source import load_policy

    with pytest.raises(FileNotFoundError, match=rf"the policy {tmp_path} is not a saved model"):
        load_policy(PolicyConfig(), str(tmp_path), RolloutConfig())


# --- 8. unreadable game files -------------------------------------------------------------------------


def test_an_unreadable_game_is_counted_in_the_stats_and_said(tmp_path, small_games, capsys):
    games = tmp_path / "games"
    shutil.copytree(small_games, games)
    broken = sorted(games.rglob("game.tw-pddl"))[0]
    broken.write_text("{ not json")
    stats = StageStats()
    run = RunConfig()
    run.benchmark_settings = AlfworldConfig(games_dir=str(games))
    tasks, index = task_list(run, "train", 0, stats)
    assert len(tasks) == 5 and stats.extra["games_skipped"] == {"unreadable_game_file": 1}
    assert "skipped: unreadable_game_file=1" in capsys.readouterr().err
    stage = StageDir(tmp_path / "sample")
    stage.stats.mkdir(parents=True)
    stage.stats_file(0).write_text(json.dumps(stats.to_dict()))
    from selskill.stages.round import format_summary

    total = collect_stats(stage)
    assert total["games_skipped"] == {"unreadable_game_file": 1}
    summary = {
        "round": 1,
        "exp": "t",
        "dir": "d",
        "stages": {"sample": total},
        "pairs_by_kind": {},
        "benchmark": "alfworld",
    }
    assert "games_skipped={'unreadable_game_file': 1}" in format_summary(summary)


# --- 9. the smaller ones ---------------------------------------------------------------------------------


def test_round_0_says_what_round_0_is():
    with pytest.raises(FileNotFoundError) as err:
        resolve_round_policy(RunConfig(round=0), PolicyConfig())
    assert "round_-1" not in str(err.value) and "rounds start at 1" in str(err.value)


def test_a_mistyped_recipe_is_named_without_a_stray_sed_error(capsys):
    assert _inproc("sample", ROOT / "recipes" / "tny.yaml") == 2
    assert "recipes/tny.yaml does not exist; recipes in" in capsys.readouterr().err
    if shutil.which("make"):
        r = subprocess.run(
            ["make", "-n", "round", "RECIPE=recipes/tny.yaml"], cwd=ROOT, capture_output=True, text=True
        )
        assert "sed:" not in r.stderr


def test_an_init_built_with_other_settings_names_them(tmp_path):
    from selskill.benchmarks.alfworld import init_policy as init_build
    from selskill.sft import build as sft

    out = tmp_path / "round_0" / "train" / "model"
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    (out.parent / sft.COMPLETED).write_text("{}")
    (out.parent / sft.MANIFEST).write_text(json.dumps({"settings": {"lr": 1.0}}))
    with pytest.raises(FileExistsError, match=r"built with other settings: .*lr: 1\.0 -> 0\.004.*--redo"):
        init_build.build_init_policy(out, games_dir=tmp_path / "games", progress=False)
    assert changed_settings({"arch": {"layers": 2}, "lr": 1}, {"arch": {"layers": 4}, "lr": 1}) == [
        "arch.layers: 2 -> 4"
    ]
