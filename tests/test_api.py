"""selskill.load_*: a run's stages as datasets, empty shards included, and errors that say what to run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from fixtures_run import write_fixture_run

import selskill
from selskill import api
from selskill.data.layout import StageDir
from selskill.data.schema import SCHEMAS
from selskill.data.shards import ShardError, write_shard

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def run(tmp_path):
    return write_fixture_run(tmp_path / "runs", "fixture")


def _shard_rows(run, round_, stage):
    return [r for f in StageDir.of(run.parent, run.name, round_, stage).shard_files()
            for r in pq.read_table(f).to_pylist()]  # fmt: skip


@pytest.mark.parametrize(
    "load, stage, kind",
    [
        (lambda d: selskill.load_rollouts(d, 1), "sample", "rollout"),
        (lambda d: selskill.load_branches(d, 1), "branch", "branch"),
        (lambda d: selskill.load_forks(d, 1), "fork", "fork"),
        (lambda d: selskill.load_pairs(d, 1), "label", "pair"),
        (lambda d: selskill.load_eval(d, 1), "eval", "rollout"),
        (lambda d: selskill.load_rollouts(d, 1, stage="eval"), "eval", "rollout"),
    ],
)
def test_each_stage_loads_as_its_rows(run, load, stage, kind):
    ds = load(run)
    assert ds.column_names == SCHEMAS[kind].names
    assert ds.to_list() == _shard_rows(run, 1, stage)


def test_a_zero_row_shard_adds_nothing(run):
    before = selskill.load_pairs(run, 1)
    label = StageDir.of(run.parent, run.name, 1, "label")
    write_shard([], label.shard(1), "pair")  # a rank that kept no pairs
    label.marker(1).write_text(json.dumps({"rows": 0}) + "\n")
    after = selskill.load_pairs(run, 1)
    assert len(after) == len(before) > 0 and after.to_list() == before.to_list()


def test_a_stage_with_only_empty_shards_is_an_empty_dataset(run):
    label = StageDir.of(run.parent, run.name, 1, "label")
    write_shard([], label.shard(0), "pair")
    label.marker(0).write_text(json.dumps({"rows": 0}) + "\n")
    ds = selskill.load_pairs(run, 1)
    assert len(ds) == 0 and ds.column_names == SCHEMAS["pair"].names


def test_rounds_and_the_rounds_that_have_a_stage(run):
    assert selskill.rounds(run) == [0, 1, 2]
    assert selskill.rounds(run, "label") == [1]
    assert selskill.rounds(run, "eval") == [0, 1, 2]
    with pytest.raises(ValueError, match="unknown stage 'train'"):
        selskill.rounds(run, "train")


def test_a_missing_stage_names_its_path_and_how_to_produce_it(run):
    path = run / "round_2" / "label"
    with pytest.raises(FileNotFoundError, match="no label stage at") as err:
        selskill.load_pairs(run, 2)
    assert str(path) in str(err.value)
    assert "python -m selskill.stages label --config RECIPE --round 2" in str(err.value)
    assert "selskill round --config RECIPE --round 2" in str(err.value) and "pipelines/" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="rounds here: 0, 1, 2"):
        selskill.load_forks(run, 7)
    with pytest.raises(
        FileNotFoundError, match=r"selskill.stages eval --config RECIPE --round 7`, once per rank"
    ):
        selskill.load_eval(run, 7)


def test_a_wrong_run_dir_says_what_run_dir_is(tmp_path, run):
    with pytest.raises(FileNotFoundError, match=r"runs/<exp>"):
        selskill.load_pairs(tmp_path / "nope", 1)
    with pytest.raises(FileNotFoundError, match=r"no round_<r>/ here at all: run_dir is runs/<exp>"):
        selskill.load_pairs(run.parent, 1)  # runs_dir instead of runs/<exp>


def test_an_unfinished_or_corrupt_stage_fails_naming_the_file(run):
    fork = StageDir.of(run.parent, run.name, 1, "fork")
    write_shard([], fork.shard(3), "fork")  # a shard whose rank never wrote its marker
    with pytest.raises(FileNotFoundError, match="00003.parquet.*no completion marker"):
        selskill.load_forks(run, 1)
    sample = StageDir.of(run.parent, run.name, 1, "sample")
    data = sample.shard(0).read_bytes()
    sample.shard(0).write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardError, match=str(sample.shard(0))):
        selskill.load_rollouts(run, 1)


def test_bad_arguments():
    with pytest.raises(ValueError, match="sample or eval"):
        selskill.load_rollouts("runs/x", 1, stage="label")
    with pytest.raises(ValueError, match="unknown stage"):
        selskill.load_stage("runs/x", 1, "train")


def test_the_loaders_are_exported_lazily_and_import_selskill_stays_cheap():
    assert selskill.load_pairs is api.load_pairs and "load_pairs" in dir(selskill)
    with pytest.raises(AttributeError):
        selskill.no_such_thing  # noqa: B018
    code = (
        "import sys, selskill; "
        "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'pyarrow', 'trl') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
