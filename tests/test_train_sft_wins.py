"""`train_objective: sft_wins`: the train stage fine-tunes on the round's clean winning samples, on their
assistant tokens only, with the DPO train's outputs and contract (selskill/train/wins.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from train_helpers import (
    BAD,
    CORPUS,
    GOOD,
    fixture_rows,
    micro_model,
    micro_tokenizer,
    rollout_row,
    write_label_stage,
    write_stage,
)

from selskill.data.schema import ROLE_ASSISTANT, ROLLOUT_SCHEMA

ROOT = Path(__file__).resolve().parents[1]

SHORT_WIN = [
    ("assistant", "<action>go to fridge 1</action>"),
    ("user", CORPUS[6]),
    ("assistant", "<action>put apple 1 in fridge 1</action>"),
    ("user", "You won."),  # the reply to the last turn: no loss reaches it
]
MALFORMED_WIN = [
    ("assistant", "<action>go to"),
    ("user", "Nothing happens."),
    ("assistant", "<action>put apple 1 in fridge 1</action>"),
]


@pytest.fixture(scope="module")
def tok():
    return micro_tokenizer()


def _episodes(tok) -> tuple[list[dict], list[dict]]:
    """(every sample row of the round, its clean wins): two tasks, three samples each; a failure and a malformed
    win among them."""
    a, b = "train/pick_heat_then_place_in_recep/a", "train/pick_heat_then_place_in_recep/b"
    rows = [
        rollout_row(tok, a, 0, GOOD, success=True),
        rollout_row(tok, a, 1, SHORT_WIN, success=True),
        rollout_row(tok, a, 2, BAD, success=False),
        rollout_row(tok, b, 0, MALFORMED_WIN, success=True, malformed=1),
        rollout_row(tok, b, 1, BAD[:3], success=False),
        rollout_row(tok, b, 2, SHORT_WIN[:3], success=True),
    ]
    return rows, [rows[i] for i in (0, 1, 5)]


def test_only_clean_wins_train_and_only_their_assistant_tokens(tok):
    from selskill.train.wins import win_rows

    rows, wins = _episodes(tok)
    out, stats = win_rows(pa.Table.from_pylist(rows, schema=ROLLOUT_SCHEMA), max_length=None)
    assert len(out) == 3
    for row, win in zip(out, wins, strict=True):
        end = len(row["input_ids"])
        assert row["input_ids"] == win["token_ids"][:end]  # the policy's own tokens, never re-tokenized
        assert row["assistant_masks"] == [int(r == ROLE_ASSISTANT) for r in win["role"][:end]]
        assert row["assistant_masks"][-1] == 1  # cut after the last assistant token
        trained = tok.decode([t for t, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if m])
        said = [text for who, text in _turns(win) if who == "assistant"]
        assert trained.replace(" ", "") == "".join(t + "<|im_end|>" for t in said).replace(" ", "")
    assert len(out[1]["input_ids"]) < len(wins[1]["token_ids"])  # "You won." was cut
    assert stats.to_dict() == {
        "episodes": 6,
        "failed": 2,
        "malformed": 1,
        "too_long": 0,
        "trained": 3,
        "tasks": 2,
        "tokens": sum(len(r["input_ids"]) for r in out),
        "assistant_tokens": sum(sum(r["assistant_masks"]) for r in out),
    }

    # a win longer than max_length is left out and counted (a cut episode teaches an unfinished one), or refused
    longest = max(len(r["input_ids"]) for r in out)
    table = pa.Table.from_pylist(rows, schema=ROLLOUT_SCHEMA)
    kept, stats = win_rows(table, max_length=longest - 1)
    assert len(kept) == 2 and stats.too_long == 1 and stats.trained == 2
    with pytest.raises(ValueError, match=r"winning episode r1/.*/a/0 has \d+ tokens .* max_length"):
        win_rows(table, max_length=longest - 1, overflow="error")


def _turns(row: dict) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in json.loads(row["messages"])]


def _setup(tok, root: Path, exp: str, rows: list[dict]) -> Path:
    init = root / exp / "round_0" / "train" / "model"
    tok.save_pretrained(init)
    micro_model(tok, seed=0).save_pretrained(init)
    half = len(rows) // 2
    write_stage(root, exp, 1, "sample", "rollout", [rows[:half], rows[half:]])
    return init


def _argv(root: Path, exp: str, *extra: str) -> list[str]:
    return [
        "--config", str(ROOT / "recipes" / "tiny.yaml"), "--runs_dir", str(root), "--exp", exp, "--round", "1",
        "--learning_rate", "1e-3", "--logging_steps", "1", "--seed", "0", "--report_to", "none",
        "--save_strategy", "no", *extra,
    ]  # fmt: skip


def test_sft_wins_trains_the_round_on_its_wins_with_the_train_stages_outputs(tok, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from selskill.data.contract import StageRefused
    from selskill.train.dry_run import dry_run
    from selskill.train.run import parse
    from selskill.train.stage import run_train

    rows, wins = _episodes(tok)
    init = _setup(tok, tmp_path, "t", rows)
    sft = ("--train_objective", "sft_wins")
    lines: list[str] = []
    info = dry_run(*parse(_argv(tmp_path, "t", *sft, "--dry_run")), out=lines.append)
    assert info["wins"] == 3 and info["steps"] == 2  # 3 rows, 4 per step, 2 epochs
    assert any("3 winning episodes of 2 tasks trained" in line for line in lines)

    run_train(*parse(_argv(tmp_path, "t", *sft, "--max_steps", "8")))  # no label stage: none is read
    train = tmp_path / "t" / "round_1" / "train"
    done = json.loads((train / "COMPLETED").read_text())
    assert done["objective"] == "sft_wins" and done["episodes"] == 3 and done["global_step"] == 8
    assert done["last_logged_loss"] < 0.9 * done["first_logged_loss"]
    assert "sample shards" in done["inputs"] and "label shards" not in done["inputs"]
    stats = json.loads((train / "wins_stats.json").read_text())
    assert (stats["trained"], stats["tasks"], stats["failed"], stats["malformed"]) == (3, 2, 2, 1)
    assert stats["tokens"] > stats["assistant_tokens"] > 0
    trained = AutoModelForCausalLM.from_pretrained(train / "model")
    start = AutoModelForCausalLM.from_pretrained(init)
    assert any((a - b).abs().max() > 0 for a, b in zip(trained.parameters(), start.parameters(), strict=True))

    # the objective is a recorded input: DPO on the same round is refused, naming it, until --redo
    write_label_stage(tmp_path, "t", 1, [fixture_rows(tok, 4)])
    with pytest.raises(StageRefused, match=r"train_objective: 'sft_wins' -> 'dpo'"):
        run_train(*parse(_argv(tmp_path, "t", "--max_steps", "1")))
    capsys.readouterr()
    run_train(*parse(_argv(tmp_path, "t", *sft, "--max_steps", "8")))  # the same objective: reused
    assert "is complete" in capsys.readouterr().err


def test_failed_and_malformed_episodes_contribute_nothing(tok, tmp_path):
    """The same wins with and without the round's failures and malformed wins train the same model."""
    import torch
    from transformers import AutoModelForCausalLM

    from selskill.train.run import parse
    from selskill.train.stage import run_train

    rows, wins = _episodes(tok)
    for exp, sample in (("wins", wins), ("all", rows)):
        _setup(tok, tmp_path, exp, sample)
        run_train(*parse(_argv(tmp_path, exp, "--train_objective", "sft_wins", "--max_steps", "3")))
    done = {
        exp: json.loads((tmp_path / exp / "round_1" / "train" / "COMPLETED").read_text())
        for exp in ("wins", "all")
    }
    assert done["wins"]["logged_losses"] == pytest.approx(done["all"]["logged_losses"], abs=1e-6)
    a, b = (AutoModelForCausalLM.from_pretrained(tmp_path / e / "round_1" / "train" / "model") for e in done)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_the_objective_changes_the_fingerprint_and_a_wins_round_makes_no_pairs(tmp_path):
    from selskill.config import load_recipe
    from selskill.data.inputs import fingerprint
    from selskill.data.layout import StageDir
    from selskill.stages.table import recipe_stages
    from selskill.train.inputs import train_inputs

    argv = ["--config", str(ROOT / "recipes" / "tiny.yaml"), "--runs_dir", str(tmp_path)]
    dpo, sft = load_recipe(argv), load_recipe([*argv, "--train_objective", "sft_wins"])
    stage = StageDir.of(tmp_path, "tiny", 1, "train")
    records = [train_inputs(r.train, "some/model").record(stage) for r in (dpo, sft)]
    assert fingerprint(records[0]) != fingerprint(records[1])
    assert [s.name for s in recipe_stages(sft)] == ["init", "sample", "train", "eval"]
    assert [s.name for s in recipe_stages(dpo)] == [
        "init",
        "sample",
        "branch",
        "fork",
        "label",
        "train",
        "eval",
    ]
    with pytest.raises(SystemExit):
        load_recipe([*argv, "--train_objective", "sft"])


def test_sft_trains_with_the_recipes_training_arguments(tmp_path):
    from selskill.train.run import parse
    from selskill.train.sft import sft_args

    cfg = parse(
        _argv(tmp_path, "t", "--train_objective", "sft_wins", "--num_train_epochs", "3", "--seed", "7")
        + ["--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "3", "--max_length", "512"]
        + ["--trust_remote_code", "true"]  # the policy section's key, as the seed is the run section's
    )[2]
    args = sft_args(cfg)
    got = {k: getattr(args, k) for k in ("learning_rate", "num_train_epochs", "per_device_train_batch_size")}
    assert got == {"learning_rate": 1e-3, "num_train_epochs": 3, "per_device_train_batch_size": 2}
    assert (args.gradient_accumulation_steps, args.seed, args.max_length) == (3, 7, 512)
    assert args.lr_scheduler_type == cfg.lr_scheduler_type and args.warmup_steps == cfg.warmup_steps
    assert args.pad_token is None and args.hub_token == cfg.hub_token  # to_dict's masks are not values
    assert args.trust_remote_code is True
    assert args.loss_type == "nll" and not args.assistant_only_loss and not args.packing  # the mask decides
