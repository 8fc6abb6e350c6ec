"""export-pairs: a round's pairs in TRL's conversational format that stock trl.DPOTrainer trains on, and
stage folders (0-row ranks included) that `datasets.load_dataset("parquet")` reads."""

import json

import pyarrow as pa
import pytest
from fixtures_run import write_fixture_run
from train_helpers import BAD, GOOD, SYSTEM, TASK, micro_model, micro_tokenizer, pair_row

import selskill
from selskill.cli import main
from selskill.data.contract import read_stage
from selskill.data.layout import StageDir
from selskill.data.schema import PAIR_SCHEMA
from selskill.data.shards import read_shards, shard_digest, write_json_atomic, write_shard
from selskill.outputs.export import EXPORT_SCHEMA, conversational_row, export_table


@pytest.fixture(scope="module")
def tok():
    return micro_tokenizer()


def _hand_made(tok):
    return [
        pair_row(tok, "local-0", "local", [SYSTEM, TASK], GOOD, BAD),
        pair_row(tok, "episode-0", "episode", [SYSTEM, TASK], GOOD, BAD),
    ]


def _finish(stage: StageDir, rank: int, rows: list[dict]) -> None:
    """A completed rank as run_rank leaves it: its shard and a marker recording the shard's digest."""
    write_shard(rows, stage.shard(rank), "pair")
    write_json_atomic({**shard_digest(stage.shard(rank)), "finished": 0.0}, stage.marker(rank))


def test_a_pair_becomes_prompt_chosen_rejected_messages_with_standard_roles(tok):
    local, episode = (conversational_row(p, 1) for p in _hand_made(tok))
    assert local["prompt"] == [{"role": "system", "content": SYSTEM[1]}, {"role": "user", "content": TASK[1]}]
    # a skill's return is a tool message, between the call and the next observation
    assert [m["role"] for m in local["chosen"][:4]] == ["assistant", "tool", "user", "assistant"]
    assert local["chosen"][1]["content"] == GOOD[1][1]
    assert local["rejected"] == [{"role": who, "content": text} for who, text in BAD]
    # the loss window as assistant-turn indices: local pairs the first n turns, episode pairs every turn
    assert local["chosen_window_turns"] == local["rejected_window_turns"] == [0]
    assert episode["chosen_window_turns"] == [0, 1, 2, 3] and episode["rejected_window_turns"] == [0, 1, 2, 3]
    assert conversational_row(_hand_made(tok)[0], None)["chosen_window_turns"] == [0, 1, 2, 3]
    assert (local["kind"], local["chosen_arm"], local["rejected_arm"], local["candidate_skill"]) == (
        "local",
        "invoke",
        "skip",
        "heat_object",
    )
    table = export_table(pa.Table.from_pylist(_hand_made(tok), schema=PAIR_SCHEMA), 3)
    assert table.schema == EXPORT_SCHEMA and table.column("pair_id").to_pylist() == ["local-0", "episode-0"]


def test_a_message_with_a_role_no_chat_template_knows_is_refused(tok):
    row = _hand_made(tok)[0] | {"chosen_messages": json.dumps([{"role": "skill", "content": "x"}])}
    with pytest.raises(ValueError, match="'local-0'.*chosen_messages.*system, user, assistant, tool"):
        conversational_row(row, 3)


def test_label_stores_the_prompt_messages_and_only_the_completions(tmp_path):
    exp = write_fixture_run(tmp_path / "runs")
    pairs = selskill.load_pairs(exp, 1).to_list()
    forks = {f["fork_id"]: f for f in selskill.load_forks(exp, 1).to_list()}
    branches = {b["branch_id"]: b for b in selskill.load_branches(exp, 1).to_list()}
    local = next(p for p in pairs if p["kind"] == "local")
    src, turn = forks[local["chosen_source"]], branches[local["branch_id"]]["turn_index"]
    messages, cut = json.loads(src["messages"]), src["turns"][turn]["message_index"]
    assert json.loads(local["prompt_messages"]) == messages[:cut]
    chosen = json.loads(local["chosen_messages"])
    # from the branch turn's assistant message through the last one: the final reply was never tokenized
    assert (
        chosen[0]["role"] == chosen[-1]["role"] == "assistant" and chosen == messages[cut : cut + len(chosen)]
    )
    assert sum(m["role"] == "assistant" for m in chosen) == max(local["chosen_turn"]) + 1
    episode = next(p for p in pairs if p["kind"] == "episode")
    assert [m["role"] for m in json.loads(episode["prompt_messages"])] == ["system", "user"]


def test_export_pairs_writes_parquet_and_a_card_that_datasets_loads(tmp_path):
    from datasets import load_dataset

    exp = write_fixture_run(tmp_path / "runs")
    out = selskill.export_pairs(exp, 1, tmp_path / "export", window_n=2, recipe="recipes/tiny.yaml")
    ds = load_dataset("parquet", data_files=str(out.data_file), split="train", cache_dir=str(tmp_path / "hf"))
    pairs = selskill.load_pairs(exp, 1)
    assert len(ds) == out.rows == len(pairs) and ds.column_names == EXPORT_SCHEMA.names
    assert all(
        m["role"] in ("system", "user", "assistant", "tool") for r in ds for m in r["prompt"] + r["chosen"]
    )
    card = out.card.read_text()
    kinds = {k: pairs["kind"].count(k) for k in set(pairs["kind"])}
    for kind, n in kinds.items():
        assert f"| {kind} | {n} |" in card
    assert "`recipes/tiny.yaml`" in card and "selskill commit:" in card and "train_window_n): 2" in card


def test_the_cli_exports_and_names_a_missing_stage(tmp_path, capsys):
    exp = write_fixture_run(tmp_path / "runs")
    assert main(["export-pairs", "--exp", str(exp), "--round", "1", "--out", str(tmp_path / "e")]) == 0
    assert "dataset card" in capsys.readouterr().out and (tmp_path / "e" / "README.md").is_file()
    assert main(["export-pairs", "--exp", str(exp), "--round", "2", "--out", str(tmp_path / "e2")]) == 2
    assert "no label stage" in capsys.readouterr().err


def test_an_export_refuses_a_folder_that_holds_files_unless_overwrite(tmp_path, capsys):
    exp = write_fixture_run(tmp_path / "runs")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "README.md").write_text("my notes\n")
    argv = ["export-pairs", "--exp", str(exp), "--round", "1", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"export folder {out} is not empty (it holds README.md)" in err
    assert "--overwrite" in err and (out / "README.md").read_text() == "my notes\n"
    assert not (out / "data").exists()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        selskill.export_pairs(exp, 1, out)
    assert (out / "README.md").read_text() == "my notes\n"
    assert main([*argv, "--overwrite"]) == 0 and "my notes" not in (out / "README.md").read_text()
    again = selskill.export_pairs(exp, 1, out, overwrite=True)
    assert again.data_file.is_file() and again.rows > 0
    (tmp_path / "empty").mkdir()
    assert selskill.export_pairs(exp, 1, tmp_path / "empty").rows == again.rows  # an empty folder is fine


def test_datasets_loads_a_stage_folder_with_an_empty_rank(tmp_path, tok):
    from datasets import load_dataset

    stage = StageDir.of(tmp_path / "runs", "x", 1, "label")
    _finish(stage, 0, _hand_made(tok))
    _finish(stage, 1, [])  # a rank that kept no pairs
    ds = load_dataset(
        "parquet", data_files=str(stage.shards / "*.parquet"), split="train", cache_dir=str(tmp_path)
    )
    assert ds.column_names == PAIR_SCHEMA.names and ds["pair_id"] == ["local-0", "episode-0"]
    # selskill's own readers still verify every rank against its marker and the schema
    assert read_stage(stage, "pair", 2).num_rows == 2
    assert read_shards([stage.shard(1)], "pair").schema.equals(PAIR_SCHEMA)


def test_stock_trl_dpo_trainer_trains_on_an_export(tmp_path, tok):
    from datasets import load_dataset
    from trl import DPOConfig, DPOTrainer

    stage = StageDir.of(tmp_path / "runs", "x", 1, "label")
    _finish(stage, 0, _hand_made(tok))
    tok.save_pretrained(tmp_path / "runs" / "x" / "round_0" / "train" / "model")
    out = selskill.export_pairs(tmp_path / "runs" / "x", 1, tmp_path / "export")
    ds = load_dataset("parquet", data_files=str(out.data_file), split="train", cache_dir=str(tmp_path / "hf"))
    args = DPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        max_steps=2,
        learning_rate=1e-3,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        max_length=out.lengths.max_length,  # what the dataset card tells a TRL user to set
        seed=0,
    )
    # the micro tokenizer carries a minimal ChatML template (selskill.policy.bootstrap.CHAT_TEMPLATE)
    trainer = DPOTrainer(
        micro_model(tok, seed=0),
        ref_model=micro_model(
            tok, seed=1
        ),  # in memory: a model with no hub name cannot be reloaded as its own ref
        args=args,
        train_dataset=ds,
        processing_class=tok,
    )
    result = trainer.train()
    assert trainer.state.global_step == 2 and result.training_loss > 0


def _trl_lengths(trainer) -> list[tuple[int, int]]:
    """(prompt tokens, prompt + longer completion tokens) of each pair trl.DPOTrainer kept, as it tokenized it."""
    return [
        (len(r["prompt_ids"]), len(r["prompt_ids"]) + max(len(r["chosen_ids"]), len(r["rejected_ids"])))
        for r in trainer.train_dataset
    ]


def _stock_trainer(tmp_path, tok, ds, **config):
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(
        output_dir=str(tmp_path / "out"), report_to="none", bf16=False, disable_tqdm=True, seed=0, **config
    )
    return DPOTrainer(
        micro_model(tok), ref_model=micro_model(tok), args=args, train_dataset=ds, processing_class=tok
    )


def test_the_card_states_the_max_length_stock_trl_needs_and_it_keeps_every_pair(tmp_path, tok):
    """TRL's default max_length drops a pair whose prompt fills it, silently: the card measures the pairs with
    the round's tokenizer as TRL renders them and names the DPOConfig setting that keeps every pair whole."""
    import re

    from datasets import load_dataset
    from trl import DPOConfig

    from selskill.outputs.export import TRL_DEFAULT_MAX_LENGTH

    assert DPOConfig.__dataclass_fields__["max_length"].default == TRL_DEFAULT_MAX_LENGTH
    long_prompt = [("system", " ".join([SYSTEM[1]] * 60)), TASK]
    stage = StageDir.of(tmp_path / "runs", "x", 1, "label")
    _finish(stage, 0, [*_hand_made(tok), pair_row(tok, "long-0", "episode", long_prompt, GOOD, BAD)])
    tok.save_pretrained(
        tmp_path / "runs" / "x" / "round_0" / "train" / "model"
    )  # the policy that sampled round 1
    out = selskill.export_pairs(tmp_path / "runs" / "x", 1, tmp_path / "export")
    card = out.card.read_text()
    assert out.lengths.unit == "tokens" and "round_0/train/model" in card
    need = int(re.search(r"DPOConfig\(max_length=(\d+)", card).group(1))
    longest_prompt = int(re.search(r"the longest prompt is (\d+) tokens", card).group(1))
    dropped, pairs = map(int, re.search(r"it drops (\d+) of these (\d+) pairs", card).groups())
    assert pairs == out.rows == 3 and dropped == 1 and longest_prompt >= TRL_DEFAULT_MAX_LENGTH

    ds = load_dataset("parquet", data_files=str(out.data_file), split="train", cache_dir=str(tmp_path / "hf"))
    # TRL's defaults: the long-prompt pair is gone, as the card says
    assert len(_stock_trainer(tmp_path, tok, ds).train_dataset) == pairs - dropped
    # the card's setting: every pair kept, none cut, and the card's numbers are TRL's own token counts
    kept = _trl_lengths(_stock_trainer(tmp_path, tok, ds, max_length=need))
    assert len(kept) == pairs
    assert max(s for _, s in kept) == need and max(p for p, _ in kept) == longest_prompt
    assert sorted(p for p, _ in kept) == sorted(out.lengths.prompt)
    assert f"| prompt | {min(out.lengths.prompt)} |" in card


def test_without_a_tokenizer_the_card_gives_characters_and_says_so(tmp_path, tok):
    stage = StageDir.of(tmp_path / "runs", "x", 1, "label")
    _finish(stage, 0, _hand_made(tok))
    out = selskill.export_pairs(tmp_path / "runs" / "x", 1, tmp_path / "export")
    card = out.card.read_text()
    assert out.lengths.unit == "characters" and "max (characters)" in card
    assert "no tokenizer in" in card and "DPOConfig(max_length=None)" in card
    import pyarrow.parquet as pq

    rows = pq.read_table(out.data_file).to_pylist()
    assert out.lengths.prompt == [sum(len(m["content"]) for m in r["prompt"]) for r in rows]
    assert out.lengths.rejected == [sum(len(m["content"]) for m in r["rejected"]) for r in rows]


def test_push_to_hub_uploads_the_card_with_the_data(tmp_path, tok, monkeypatch):
    """One commit holds the data file and README.md, a DatasetCard whose metadata the hub reads."""
    import fnmatch

    import huggingface_hub
    from huggingface_hub import DatasetCard

    calls = []
    monkeypatch.setattr(
        huggingface_hub.HfApi, "create_repo", lambda self, *a, **k: calls.append(("create", a, k))
    )
    monkeypatch.setattr(
        huggingface_hub.HfApi, "upload_folder", lambda self, **k: calls.append(("upload", (), k))
    )
    stage = StageDir.of(tmp_path / "runs", "x", 1, "label")
    _finish(stage, 0, _hand_made(tok))
    out = selskill.export_pairs(tmp_path / "runs" / "x", 1, tmp_path / "export", push_to_hub="me/pairs")
    (create, args, kw), (upload, _, up) = calls
    assert create == "create" and args == ("me/pairs",) and kw["repo_type"] == "dataset"
    assert upload == "upload" and up["repo_id"] == "me/pairs" and up["repo_type"] == "dataset"
    folder = tmp_path / "export"
    assert up["folder_path"] == str(folder)
    sent = sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file()
        and any(fnmatch.fnmatch(str(p.relative_to(folder)), pat) for pat in up["allow_patterns"])
    )
    assert sent == ["README.md", "data/train-00000-of-00001.parquet"]
    card = DatasetCard.load(out.card)
    assert card.data.license == "mit"  # the default benchmark's data (ALFWorld)
    assert card.data.task_categories == ["text-generation"] and "dpo" in card.data.tags
    assert card.data.configs == [
        {
            "config_name": "default",
            "data_files": [{"split": "train", "path": "data/train-00000-of-00001.parquet"}],
        }
    ]
    assert "## Lengths" in card.text
    licensed = selskill.export_pairs(tmp_path / "runs" / "x", 1, tmp_path / "e2", license="cc-by-4.0")
    assert DatasetCard.load(licensed.card).data.license == "cc-by-4.0"
