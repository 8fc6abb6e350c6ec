"""Fault injection on the train stage, which follows the stage contract like the episode stages.

Two trains of one round at once, a label stage with a missing, unmarked, corrupt or stray
shard, label shards or train keys changed after training, a checkpoint of another run, a
half-written checkpoint, and a `--redo` that cannot compute (it must keep every marker).
Training runs for real on the tiny offline model: a few steps take seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_faults import _run, _sample_rank
from train_helpers import fixture_rows, micro_model, micro_tokenizer, write_label_stage

from selskill.cli import main as selskill
from selskill.config import PolicyConfig
from selskill.data.contract import StageRefused
from selskill.data.layout import StageDir
from selskill.data.shards import ShardError
from selskill.train.checkpoints import INPUTS_FILE, resumable_checkpoint
from selskill.train.dry_run import dry_run
from selskill.train.run import parse
from selskill.train.stage import run_train

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}


@pytest.fixture(scope="module")
def tok():
    return micro_tokenizer()


@pytest.fixture
def runs(tok, tmp_path):
    """A round 1 ready to train: the init policy, and a label stage of 8 pairs in 2 ranks."""
    init = tmp_path / "t" / "round_0" / "train" / "model"
    tok.save_pretrained(init)
    micro_model(tok).save_pretrained(init)
    rows = fixture_rows(tok, 8)
    write_label_stage(tmp_path, "t", 1, [rows[:4], rows[4:]])
    return tmp_path


def _argv(root: Path, *extra: str) -> list[str]:
    return [
        "--config", str(ROOT / "recipes" / "tiny.yaml"), "--runs_dir", str(root), "--exp", "t", "--round", "1",
        "--max_steps", "2", "--save_steps", "1", "--learning_rate", "1e-3", "--report_to", "none",
        "--logging_steps", "1", "--disable_tqdm", "true", *extra,
    ]  # fmt: skip


def _train(root: Path, *extra: str) -> Path:
    return run_train(*parse(_argv(root, *extra)))


def _cli_train(root: Path, capsys, *extra: str) -> tuple[int, str]:
    """`selskill train` as a user types it: its exit status and its stderr (stdout stays in `capsys`)."""
    capsys.readouterr()
    rc = selskill(["train", *_argv(root, *extra)])
    out, err = capsys.readouterr()
    print(out, end="")
    return rc, err


def _completed(root: Path) -> dict:
    return json.loads((root / "t" / "round_1" / "train" / "COMPLETED").read_text())


# --- two trains of one round ------------------------------------------------------------------------------

PAUSED = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import selskill.train.stage as stage
    from selskill.train.run import cli_main

    real = stage._train_locked

    def paused(*args, **kwargs):  # holds the round's lock until released (or killed)
        Path({started!r}).write_text("x")
        while not Path({release!r}).exists():
            time.sleep(0.05)
        return real(*args, **kwargs)

    stage._train_locked = paused
    sys.exit(cli_main({argv!r}))
    """
)


def _paused_train(root: Path, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    started, release = tmp_path / "started", tmp_path / "release"
    started.unlink(missing_ok=True)
    code = PAUSED.format(started=str(started), release=str(release), argv=_argv(root))
    proc = subprocess.Popen([sys.executable, "-c", code], env=ENV, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not started.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert started.exists(), (
        proc.stderr.read() if proc.poll() is not None else "the first train did not start"
    )
    return proc, release


def test_a_second_train_of_the_round_is_refused_naming_the_holder_and_a_dead_holder_blocks_nothing(
    runs, tmp_path, capsys
):
    first, release = _paused_train(runs, tmp_path)
    try:
        rc, err = _cli_train(runs, capsys)
        lock = runs / "t" / "round_1" / "train" / "locks" / "00000.lock"
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert f"train: round 1 of 't' is being computed by another process (pid {first.pid} on " in err
        assert socket.gethostname() in err and str(lock) in err
        assert not (runs / "t" / "round_1" / "train" / "dataset").exists()  # the refused one touched nothing
        # the holder dies without releasing anything: its lock file stays, naming it, and blocks nobody
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
        assert f"pid {first.pid} " in lock.read_text()
        _train(runs)
        assert _completed(runs)["global_step"] == 2 and f"pid {os.getpid()} " in lock.read_text()
    finally:
        release.write_text("x")
        if first.poll() is None:
            first.kill()
        first.wait(timeout=60)


# --- the label shards, read through the verified reader --------------------------------------------------


def _missing(label: StageDir) -> str:
    label.shard(1).unlink()
    label.marker(1).unlink()
    return f"label: rank 1 of world size 2 has not finished (no completion marker in {label.completions})"


def _unmarked(label: StageDir) -> str:
    label.marker(1).unlink()
    return f"label shards {label.shard(1)} have no completion marker"


def _corrupt(label: StageDir) -> str:
    data = bytearray(label.shard(0).read_bytes())
    data[len(data) // 2] ^= 1  # same size, other bytes
    label.shard(0).write_bytes(bytes(data))
    return f"shard {label.shard(0)} does not match the sha256 its marker records"


def _stray(label: StageDir) -> str:
    shutil.copy(label.shard(0), label.shards / "00002.parquet")
    return f"{label.shards / '00002.parquet'} is not a shard of its world size 2"


@pytest.mark.parametrize("fault", [_missing, _unmarked, _corrupt, _stray], ids=lambda f: f.__name__[1:])
def test_a_label_stage_that_does_not_verify_is_refused_naming_the_file(runs, capsys, fault):
    expected = fault(StageDir.of(runs, "t", 1, "label"))
    rc, err = _cli_train(runs, capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and expected in err, err
    train = runs / "t" / "round_1" / "train"
    assert not (train / "dataset").exists() and not (train / "COMPLETED").exists()
    lines = []
    info = dry_run(*parse(_argv(runs, "--dry_run")), out=lines.append)  # counts no unverified pair
    assert info["pairs"] is None and any(expected in line and "not complete" in line for line in lines)


# --- inputs changed after training ------------------------------------------------------------------------


def test_changed_labels_or_train_keys_after_training_are_refused_and_redo_retrains(runs, tok, capsys):
    _train(runs)
    first = _completed(runs)
    assert first["inputs"]["label shards"] != "missing" and first["inputs"]["learning_rate"] == 1e-3
    done = runs / "t" / "round_1" / "train" / "COMPLETED"

    rc, err = _cli_train(runs, capsys, "--learning_rate", "2e-3")
    assert rc == 2 and "learning_rate: 0.001 -> 0.002" in err and "--redo" in err and str(done) in err

    rows = fixture_rows(tok, 12)  # the label stage recomputed with more pairs
    write_label_stage(runs, "t", 1, [rows[:6], rows[6:]], redo=True)
    rc, err = _cli_train(runs, capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"label shards: '{first['inputs']['label shards']}' -> '" in err and "Rerun with --redo" in err
    assert _completed(runs) == first  # refused: the model and its record stay

    _train(runs, "--redo", "true")
    again = _completed(runs)
    assert again["pairs"] == 12 and again["resumed_from"] is None
    assert again["inputs"]["label shards"] != first["inputs"]["label shards"]
    rc, err = _cli_train(runs, capsys)
    assert rc == 0 and "is complete" in capsys.readouterr().out + err


# --- checkpoints: only this run's, only complete ones -----------------------------------------------------


def test_a_checkpoint_of_another_run_is_not_resumed(runs, capsys):
    train = _train(runs, "--max_steps", "4", "--save_steps", "2")
    ckpt = train / "checkpoint-4"
    own = json.loads((ckpt / INPUTS_FILE).read_text())
    assert own == {"fingerprint": _completed(runs)["fingerprint"], "inputs": _completed(runs)["inputs"]}
    (train / "COMPLETED").unlink()  # interrupted after its last checkpoint
    shutil.rmtree(train / "model")

    rc, err = _cli_train(runs, capsys, "--max_steps", "4", "--save_steps", "2", "--learning_rate", "5e-4")
    assert rc == 2 and f"train: {ckpt} was computed with other inputs" in err, err
    assert "learning_rate: 0.001 -> 0.0005" in err and "It is not resumed: rerun with --redo" in err
    assert ckpt.is_dir() and not (train / "COMPLETED").exists()

    capsys.readouterr()
    _train(runs, "--max_steps", "4", "--save_steps", "2")  # its own run: resumed
    assert f"resuming from {ckpt}" in capsys.readouterr().err
    assert _completed(runs)["resumed_at_step"] == 4

    _train(runs, "--max_steps", "4", "--save_steps", "2", "--learning_rate", "5e-4", "--redo", "true")
    done = _completed(runs)
    assert done["resumed_from"] is None and done["inputs"]["learning_rate"] == 5e-4
    assert json.loads((ckpt / INPUTS_FILE).read_text())["inputs"]["learning_rate"] == 5e-4


def _checkpoint(path: Path, step: int) -> Path:
    import torch
    from safetensors.torch import save_file

    ckpt = path / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    save_file({"w": torch.ones(64, 64)}, ckpt / "model.safetensors")
    torch.save({"state": {0: torch.ones(64)}}, ckpt / "optimizer.pt")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    (ckpt / INPUTS_FILE).write_text(json.dumps({"fingerprint": "f", "inputs": {}}))
    return ckpt


def test_a_half_written_checkpoint_is_skipped_for_the_last_complete_one(tmp_path):
    good = _checkpoint(tmp_path, 3)
    bad = _checkpoint(tmp_path, 6)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # the header alone needs more: "incomplete metadata"
    last, broken = resumable_checkpoint(tmp_path)
    assert (
        last == good and [b[0] for b in broken] == [bad] and "model.safetensors is truncated" in broken[0][1]
    )
    _checkpoint(tmp_path, 9)
    (tmp_path / "checkpoint-9" / "trainer_state.json").unlink()  # the save never reached its last file
    _checkpoint(tmp_path, 12)
    (tmp_path / "checkpoint-12" / INPUTS_FILE).unlink()  # saved, but the inputs were never written into it
    opt = good / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[:-200])
    last, broken = resumable_checkpoint(tmp_path)
    assert last is None
    assert [b[0].name for b in broken] == ["checkpoint-12", "checkpoint-9", "checkpoint-6", "checkpoint-3"]
    assert INPUTS_FILE in broken[0][1] and "trainer_state.json" in broken[1][1]
    assert "optimizer.pt is truncated" in broken[3][1]


def test_the_train_stage_resumes_from_the_last_complete_checkpoint(runs, capsys):
    train = _train(runs, "--max_steps", "6", "--save_steps", "3")
    whole = _completed(runs)
    bad = train / "checkpoint-6"
    (bad / "model.safetensors").write_bytes((bad / "model.safetensors").read_bytes()[:50])
    (train / "COMPLETED").unlink()
    shutil.rmtree(train / "model")
    capsys.readouterr()
    _train(runs, "--max_steps", "6", "--save_steps", "3")
    out = capsys.readouterr().err
    assert (
        f"skipping {bad}: model.safetensors is truncated" in out
        and f"resuming from {train}/checkpoint-3" in out
    )
    assert (train / "incomplete-checkpoint-6").is_dir()  # set aside, not deleted
    done = _completed(runs)
    assert done["resumed_from"].endswith("checkpoint-3") and done["resumed_at_step"] == 3
    assert done["train_loss_steps"] == 3 and done["global_step"] == 6
    assert done["logged_losses"] == pytest.approx(whole["logged_losses"], abs=1e-6)


# --- a --redo that cannot compute removes nothing --------------------------------------------------------


def _markers(stage: StageDir) -> dict[int, str]:
    return {r: stage.marker(r).read_text() for r in stage.completed_ranks()}


def test_a_redo_with_a_missing_upstream_rank_keeps_every_marker(tmp_path, tiny_model_dir, capsys):
    from selskill.config.rollout import RolloutConfig
    from selskill.stages.branch import BranchConfig, BranchStep
    from selskill.stages.label import LabelConfig, LabelStep

    pol = PolicyConfig(model_name_or_path=str(tiny_model_dir))
    for rank in (0, 1):
        _sample_rank(tmp_path, rank)
    for rank in (0, 1):
        run = _run(tmp_path, rank=rank, world_size=2)
        BranchStep(run, BranchConfig(), 3, policy=pol, rollout=RolloutConfig()).run(run.rank, run.world_size)
        LabelStep(run, LabelConfig(label_kinds="episode"), 3).run(run.rank, run.world_size)
    sample = StageDir.of(tmp_path / "runs", "t", 1, "sample")
    branch, label = (StageDir.of(tmp_path / "runs", "t", 1, s) for s in ("branch", "label"))
    before = {"branch": _markers(branch), "label": _markers(label)}
    assert set(before["branch"]) == set(before["label"]) == {0, 1}
    sample.shard(1).unlink()
    sample.marker(1).unlink()

    redo = _run(tmp_path, rank=0, world_size=2, redo=True)
    with pytest.raises(FileNotFoundError, match=r"sample: rank 1 of world size 2 has not finished"):
        BranchStep(redo, BranchConfig(), 3, policy=pol, rollout=RolloutConfig()).run(
            redo.rank, redo.world_size
        )
    with pytest.raises(FileNotFoundError, match=r"sample: rank 1 of world size 2 has not finished"):
        LabelStep(redo, LabelConfig(label_kinds="episode"), 3).run(redo.rank, redo.world_size)
    assert {"branch": _markers(branch), "label": _markers(label)} == before
    assert all(s.is_complete(r) for s in (branch, label) for r in (0, 1))


def test_a_train_redo_with_a_missing_label_rank_keeps_the_trained_round(runs, capsys):
    train = _train(runs)
    first = _completed(runs)
    label = StageDir.of(runs, "t", 1, "label")
    expected = _missing(label)
    rc, err = _cli_train(runs, capsys, "--redo", "true")
    assert rc == 2 and expected in err, err
    assert _completed(runs) == first and (train / "model").is_dir() and (train / "checkpoint-2").is_dir()


def _forged(stage: StageDir, rank: int = 1) -> str:
    """Cut rank `rank`'s shard in half and rewrite its marker's size and checksum to match: the marker
    verifies, the shard does not read."""
    from selskill.data.shards import file_sha256

    shard, marker = stage.shard(rank), json.loads(stage.marker(rank).read_text())
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    marker.update(bytes=shard.stat().st_size, sha256=file_sha256(shard))
    stage.marker(rank).write_text(json.dumps(marker))
    return f"shard {shard} is unreadable"


def test_a_redo_over_a_forged_upstream_marker_fails_before_removing_anything(tmp_path, capsys):
    from selskill.stages.label import LabelConfig, LabelStep

    for rank in (0, 1):
        _sample_rank(tmp_path, rank)
    for rank in (0, 1):
        run = _run(tmp_path, rank=rank, world_size=2)
        LabelStep(run, LabelConfig(label_kinds="episode"), 3).run(run.rank, run.world_size)
    sample, label = (StageDir.of(tmp_path / "runs", "t", 1, s) for s in ("sample", "label"))
    before = _markers(label)
    expected = _forged(sample)
    redo = _run(tmp_path, rank=0, world_size=2, redo=True)
    with pytest.raises(ShardError, match=re.escape(expected)):
        LabelStep(redo, LabelConfig(label_kinds="episode"), 3).run(redo.rank, redo.world_size)
    assert _markers(label) == before and all(label.is_complete(r) for r in (0, 1))


def test_a_train_redo_over_a_forged_label_marker_keeps_the_trained_round(runs, capsys):
    train = _train(runs)
    first = _completed(runs)
    expected = _forged(StageDir.of(runs, "t", 1, "label"))
    rc, err = _cli_train(runs, capsys, "--redo", "true")
    assert rc == 2 and expected in err, err
    assert _completed(runs) == first and (train / "model").is_dir() and (train / "checkpoint-2").is_dir()


def test_a_refusal_is_a_stage_refused(runs):
    """In code (the round's train stage, a notebook) the refusals are the contract's exception, not a crash."""
    _train(runs)
    with pytest.raises(StageRefused, match="learning_rate"):
        _train(runs, "--learning_rate", "3e-3")


# --- a training that goes non-finite is never marked complete --------------------------------------------


@pytest.mark.parametrize(
    "lr, steps, cause",
    [
        # step 1 moves every weight by ~1e30, step 2's gradients are nan, step 3's loss: the loss check
        ("1e30", "3", r"the loss is nan at step 3 \(beta 0.1, learning_rate 1e\+30\)"),
        # one step by 1e39 (inf in float32) leaves inf weights and no loss to show it: the weights check
        ("1e39", "1", r"trained parameter tensors hold nan or inf after step 1 \(model\."),
    ],
    ids=["loss", "weights"],
)
def test_a_training_that_goes_nonfinite_fails_naming_the_cause_and_writes_no_completed(
    runs, capsys, lr, steps, cause
):
    rc, err = _cli_train(runs, capsys, "--learning_rate", lr, "--max_steps", steps, "--warmup_steps", "0")
    assert rc == 1, err
    last = err.strip().splitlines()[-1]  # the lines above are the stage's log
    assert last.startswith("error: train: ") and "Traceback" not in err, err
    assert re.search(cause, last) and "the training diverged" in last, err
    train = runs / "t" / "round_1" / "train"
    assert not (train / "COMPLETED").exists() and not (train / "model").exists()


@pytest.mark.parametrize(
    "key, value", [("beta", "nan"), ("beta", "inf"), ("beta", "-1"), ("learning_rate", "nan")]
)
def test_a_nonfinite_or_inverted_train_value_is_refused_before_anything_is_written(runs, capsys, key, value):
    rc, err = _cli_train(runs, capsys, f"--{key}", value)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err  # before the stage logs anything
    assert f"{key} must be" in err and f"got {float(value)!r}" in err and f"--{key}" in err, err
    assert not (runs / "t" / "round_1" / "train").exists()


# --- a removal killed midway is finished by the next run --------------------------------------------------


class Killed(BaseException):
    """What a SIGKILL is to the code it stops: nothing after it runs (no `except Exception` catches it)."""


def _kill_at(monkeypatch, name: str, call: str) -> None:
    """The next `os.<call>` of a file or folder called `name` is the process's last (a delete does its work)."""
    real = getattr(os, call)

    def killed(src, *args, **kwargs):
        if Path(src).name != name:
            return real(src, *args, **kwargs)
        monkeypatch.setattr(os, call, real)
        if call == "unlink":
            real(src, *args, **kwargs)
        raise Killed(f"killed at {call}({src})")

    monkeypatch.setattr(os, call, killed)


@pytest.mark.parametrize(
    "at", [("dataset", "replace"), ("dataset_info.json", "unlink")], ids=["moving", "deleting"]
)
def test_a_redo_killed_while_it_removes_the_outputs_is_finished_by_the_next_run(
    runs, capsys, monkeypatch, at
):
    train = _train(runs)
    _kill_at(monkeypatch, *at)
    with pytest.raises(Killed):
        _train(runs, "--redo", "true")
    monkeypatch.undo()
    assert not (train / "COMPLETED").exists()
    capsys.readouterr()
    _train(runs)  # without --redo: the rerun a person types after the kill
    err = capsys.readouterr().err
    finished = [line for line in err.splitlines() if "finished removing" in line]
    assert len(finished) == 1 and "dataset" in finished[0] and "checkpoint-2" in finished[0], err
    done = _completed(runs)
    assert done["resumed_from"] is None and done["global_step"] == 2  # the redo's fresh start
    assert not list(train.glob(".trash-*")) and (train / "model").is_dir()


def test_a_half_deleted_dataset_is_built_again_with_one_line(runs, capsys):
    train = _train(runs)
    (train / "COMPLETED").unlink()
    (train / "dataset" / "state.json").unlink()  # what deleting it file by file left when killed
    capsys.readouterr()
    _train(runs)  # was: "Directory .../dataset is neither a Dataset directory nor a DatasetDict directory"
    err = capsys.readouterr().err
    assert f"train: {train / 'dataset'} is incomplete (no readable state.json;" in err, err
    assert _completed(runs)["pairs"] == 8


# --- a full disk names what it was writing ----------------------------------------------------------------


def test_a_full_disk_during_a_checkpoint_save_is_one_line_naming_the_folder(runs, capsys, monkeypatch):
    import transformers.modeling_utils as modeling
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(modeling, "safe_save_file", full)
    rc, err = _cli_train(runs, capsys)  # was: 58 lines ending in the SafetensorError
    ckpt = runs / "t" / "round_1" / "train" / "checkpoint-1"
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 1 and "Traceback" not in err and err.strip().splitlines()[-1:] == errors, err
    assert errors[0].startswith(f"error: {ckpt}: cannot write: No space left on device (SafetensorError: "), (
        err
    )
    assert ". Free space on that filesystem" in errors[0]
    assert "--runs_dir" in errors[0]
