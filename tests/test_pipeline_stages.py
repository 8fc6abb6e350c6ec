"""Stage contract: resumable after SIGKILL, deterministic, clear errors for bad recipes and shards."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from selskill.data.layout import StageDir
from selskill.data.schema import validate_table
from selskill.data.shards import ShardError, read_shard

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def recipe(tmp_path, small_games, tiny_model_dir):
    path = tmp_path / "recipe.yaml"
    path.write_text(
        f"exp: t\nruns_dir: {tmp_path / 'runs'}\ngames_dir: {small_games}\nmodel_name_or_path: {tiny_model_dir}\n"
        "sample_k: 2\nsample_max_tasks: 4\nmax_env_steps: 4\nmax_new_tokens: 12\nconcurrent_episodes: 4\n"
        "policy_batch_size: 8\nseed: 3\n"
    )
    return path


def _stage(script, recipe, *args, runs_dir=None, wait=True):
    cmd = [sys.executable, str(ROOT / "pipelines" / f"{script}.py"), "--config", str(recipe), *args]
    if runs_dir:
        cmd += ["--runs_dir", str(runs_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    if not wait:
        return subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _inproc(script, recipe, *args, runs_dir=None):
    """The entry point's main() in this process (no interpreter start-up; same code path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"pipeline_{script}", ROOT / "pipelines" / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    argv = ["--config", str(recipe), *args] + (["--runs_dir", str(runs_dir)] if runs_dir else [])
    return mod.main(argv)


def _rows(runs_dir, stage="sample"):
    sd = StageDir.of(runs_dir, "t", 1, stage)
    rows = []
    for f in sd.shard_files():
        rows += pq.read_table(f).to_pylist()
    return rows


def test_sigkill_then_rerun_gives_exactly_the_uninterrupted_rows(recipe, tmp_path):
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "killed"
    for rank in ("0", "1"):
        assert _inproc("sample", recipe, "--world_size", "2", "--rank", rank, runs_dir=ref_dir) == 0
    assert _inproc("sample", recipe, "--world_size", "2", "--rank", "0", runs_dir=run_dir) == 0
    proc = _stage("sample", recipe, "--world_size", "2", "--rank", "1", runs_dir=run_dir, wait=False)
    stage = StageDir.of(run_dir, "t", 1, "sample")
    deadline = time.time() + 120
    while not (stage.path / "config.yaml").exists() and time.time() < deadline:
        time.sleep(0.2)  # the rank has parsed its recipe and started computing
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not stage.is_complete(1), "a killed rank must not look complete"
    assert _inproc("sample", recipe, "--world_size", "2", "--rank", "0", runs_dir=run_dir) == 0  # skipped
    assert _inproc("sample", recipe, "--world_size", "2", "--rank", "1", runs_dir=run_dir) == 0
    got, want = _rows(run_dir), _rows(ref_dir)
    key = lambda r: r["rollout_id"]  # noqa: E731
    assert len({r["rollout_id"] for r in got}) == len(got) == len(want) == 8
    assert sorted(got, key=key) == sorted(want, key=key)


def test_same_seed_identical_shards_and_schema(recipe, tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d in (a, b):
        assert _inproc("sample", recipe, runs_dir=d) == 0
    ta = pq.read_table(StageDir.of(a, "t", 1, "sample").shard(0))
    tb = pq.read_table(StageDir.of(b, "t", 1, "sample").shard(0))
    validate_table(ta, "rollout")
    assert ta.equals(tb)
    assert _inproc("sample", recipe, "--seed", "4", runs_dir=c) == 0
    tc = pq.read_table(StageDir.of(c, "t", 1, "sample").shard(0))
    assert tc.column("token_ids").to_pylist() != ta.column("token_ids").to_pylist()


def test_unknown_recipe_key_fails_naming_it(recipe, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(recipe.read_text() + "sample_kk: 3\n")
    r = _stage("sample", bad)
    assert r.returncode == 2 and "sample_kk" in r.stderr


def test_corrupted_shard_names_the_file_and_the_fix(recipe, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert _inproc("sample", recipe) == 0
    shard = StageDir.of(runs, "t", 1, "sample").shard(0)
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardError, match=str(shard)) as err:
        read_shard(shard, "rollout")
    assert "rerun" in str(err.value)
    capsys.readouterr()
    assert _inproc("branch", recipe) == 2  # the entry point prints the error's one line, not a traceback
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: sample rank 0: shard {shard} has ") and "Rerun the sample stage" in line
