"""The typed records mirror the pyarrow schemas field for field, and rows survive them unchanged."""

import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from selskill.data.layout import StageDir
from selskill.data.records import RECORDS, BranchPoint, Fork, Pair, Rollout, Turn
from selskill.data.schema import _TURN, SCHEMAS, SchemaError, validate_table
from selskill.data.shards import ShardError, read_shard, write_shard


def _names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_each_record_has_its_schemas_fields_in_order(kind):
    assert _names(RECORDS[kind]) == SCHEMAS[kind].names


def test_turn_mirrors_the_turn_struct():
    assert _names(Turn) == [_TURN.field(i).name for i in range(_TURN.num_fields)]
    for kind in ("rollout", "fork"):
        assert SCHEMAS[kind].field("turns").type == pa.list_(_TURN)


@pytest.fixture(scope="module")
def fixture_rows(tmp_path_factory):
    from fixtures_run import write_fixture_run

    run = write_fixture_run(tmp_path_factory.mktemp("runs"))
    return {
        stage: pq.read_table(StageDir(run / "round_1" / stage).shard(0)).to_pylist()
        for stage in ("sample", "branch", "fork", "label")
    }


@pytest.mark.parametrize(
    ("stage", "cls"), [("sample", Rollout), ("branch", BranchPoint), ("fork", Fork), ("label", Pair)]
)
def test_rows_read_from_a_shard_round_trip(fixture_rows, stage, cls):
    rows = fixture_rows[stage]
    assert rows
    for row in rows:
        record = cls.from_row(row)
        assert record.to_row() == row
    if "turns" in rows[0]:
        assert all(isinstance(t, Turn) for t in cls.from_row(rows[0]).turns)


def test_a_row_without_a_column_is_refused_by_the_record(fixture_rows):
    turn = dict(fixture_rows["sample"][0]["turns"][0])
    del turn["decision"]
    with pytest.raises(KeyError, match="decision"):
        Turn.from_row(turn)


def test_a_shard_of_an_older_schema_names_the_stage_to_rerun(fixture_rows, tmp_path):
    old_turn = pa.struct([f for f in _TURN if f.name not in ("decision", "message_index")])
    old = pa.schema(
        [
            pa.field("turns", pa.list_(old_turn)) if f.name == "turns" else f
            for f in SCHEMAS["rollout"]
            if f.name != "split"
        ]
    )
    rows = [
        {
            **{k: v for k, v in r.items() if k != "split"},
            "turns": [
                {k: v for k, v in t.items() if k not in ("decision", "message_index")} for t in r["turns"]
            ],
        }
        for r in fixture_rows["sample"]
    ]
    table = pa.Table.from_pylist(rows, schema=old)
    with pytest.raises(SchemaError, match=r"missing: \['split'\].*of another type: \['turns'\]"):
        validate_table(table, "rollout")
    stage = StageDir(tmp_path / "round_1" / "sample")
    stage.shards.mkdir(parents=True)
    pq.write_table(table, stage.shard(0))
    with pytest.raises(ShardError, match=r"rerun the sample stage .*round_1/sample\) with --redo"):
        read_shard(stage.shard(0), "rollout", "sample")
    write_shard(fixture_rows["sample"], stage.shard(1), "rollout")  # the current rows pass


WHICH_ROLLOUT = ("rollout_id", "run", "round", "task_id", "task_type", "sample_idx", "policy_id", "seed")


def test_a_rollout_row_is_its_episode_plus_which_episode_it_was(fixture_rows):
    from selskill.data.records import Episode

    assert _names(Episode) == [n for n in SCHEMAS["rollout"].names if n not in WHICH_ROLLOUT]
    row = fixture_rows["sample"][0]
    episode = Episode.from_row(row)
    which = {k: row[k] for k in WHICH_ROLLOUT}
    assert Rollout.of_episode(episode, **which).to_row() == row
    with pytest.raises(TypeError, match="sample_idx"):  # a field neither side gives
        Rollout.of_episode(episode, **{k: v for k, v in which.items() if k != "sample_idx"})
    with pytest.raises(TypeError, match="sample_id"):  # a misspelt one
        Rollout.of_episode(episode, **which, sample_id=0)


def test_a_fork_row_is_its_episode_plus_its_branch_point_arm_and_after_branch_counts(fixture_rows):
    from selskill.data.records import Episode

    row = fixture_rows["fork"][0]
    episode = Episode.from_row(row | {"n_prompt_tokens": 7})  # not a fork column
    which = {k: v for k, v in row.items() if k not in _names(Episode)}
    assert Fork.of_episode(episode, **which).to_row() == row


def test_the_schemas_are_the_records_fields_with_their_arrow_types():
    """One definition of each column: the widths the records name, every column nullable, no metadata."""
    rollout = SCHEMAS["rollout"]
    assert rollout.field("seed").type == pa.int64() and rollout.field("n_prompt_tokens").type == pa.int32()
    assert rollout.field("role").type == pa.list_(pa.int8()) and rollout.field("turn").type == pa.list_(
        pa.int16()
    )
    assert rollout.field("logprob").type == pa.list_(pa.float32())
    assert _TURN.field("exec_precise").type == pa.bool_() and _TURN.field("commands").type == pa.list_(
        pa.string()
    )
    assert SCHEMAS["pair"].field("chosen_role").type == pa.list_(pa.int8())
    assert SCHEMAS["branch"].field("score").type == pa.float32()
    for schema in SCHEMAS.values():
        assert schema.metadata is None and all(f.nullable for f in schema)
