"""2-process CPU launches train to the same loss as one process (`make test-multiproc`, slow).

Exactly as a user types it: `accelerate launch --config_file recipes/accelerate/<cfg>.yaml
pipelines/train_dpo.py --config recipes/tiny.yaml ...`, with only the process count and mixed
precision overridden for a CPU machine. One process with batch 4 and two with batch 2 each
see the same 4 pairs per step, so their losses must agree step by step.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
STEPS = 4
TOL = 1e-4


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from train_helpers import fixture_rows, micro_model, micro_tokenizer, write_label_stage

    root = tmp_path_factory.mktemp("runs")
    tok = micro_tokenizer()
    init = root / "base" / "round_0" / "train" / "model"
    tok.save_pretrained(init)
    micro_model(tok, seed=0).save_pretrained(init)
    rows = fixture_rows(tok, 16)
    write_label_stage(root, "base", 1, [rows[:8], rows[8:]])
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(root: Path, exp: str, launcher: list[str], *extra: str) -> dict:
    shutil.copytree(root / "base", root / exp)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    args = [
        "pipelines/train_dpo.py", "--config", "recipes/tiny.yaml", "--runs_dir", str(root), "--exp", exp,
        "--round", "1", "--max_steps", str(STEPS), "--learning_rate", "1e-3", "--logging_steps", "1",
        "--save_strategy", "no", "--seed", "0",
        # plain DPO: TRL's sft term averages chosen tokens per process, which sharding changes
        "--loss_type", "sigmoid",
        *extra,
    ]  # fmt: skip
    out = subprocess.run([*launcher, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    return json.loads((root / exp / "round_1" / "train" / "COMPLETED").read_text())


def _accelerate(config: str) -> list[str]:
    return [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", f"recipes/accelerate/{config}.yaml",
        "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(_free_port()),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def one_process(base):
    return _train(
        base,
        "one",
        [sys.executable],
        "--per_device_train_batch_size",
        "4",
        "--precompute_ref_log_probs",
        "false",
    )


@pytest.mark.parametrize(
    "config,precompute,dist,stage",
    [
        ("ddp", "true", "MULTI_CPU", None),
        ("zero2", "false", "DEEPSPEED", 2),
        ("zero3", "true", "DEEPSPEED", 3),
    ],
)
def test_two_processes_train_to_the_one_process_loss(base, one_process, config, precompute, dist, stage):
    from transformers import AutoModelForCausalLM

    done = _train(
        base,
        config,
        _accelerate(config),
        "--per_device_train_batch_size",
        "2",
        "--precompute_ref_log_probs",
        precompute,
    )
    assert done["world_size"] == 2 and done["distributed_type"] == dist and done["zero_stage"] == stage
    assert done["global_step"] == STEPS and len(done["logged_losses"]) == STEPS
    ref = one_process["logged_losses"]
    assert ref[-1] < ref[0] - 0.2  # it trained
    for a, b in zip(done["logged_losses"], ref, strict=True):
        assert abs(a - b) < TOL, (done["logged_losses"], ref)
    assert abs(done["train_loss"] - one_process["train_loss"]) < TOL
    # model/ holds the full weights (ZeRO-3 gathers them on save), close to the one-process result
    two = AutoModelForCausalLM.from_pretrained(base / config / "round_1" / "train" / "model")
    one = AutoModelForCausalLM.from_pretrained(base / "one" / "round_1" / "train" / "model")
    start = AutoModelForCausalLM.from_pretrained(base / "base" / "round_0" / "train" / "model")
    moved = drift = 0.0
    for p2, p1, p0 in zip(two.parameters(), one.parameters(), start.parameters(), strict=True):
        assert p2.shape == p1.shape and p2.numel() > 0
        moved += (p1 - p0).abs().sum().item()
        drift += (p2 - p1).abs().sum().item()
    assert drift < 1e-3 * moved, (drift, moved)
    assert torch.isfinite(torch.tensor(drift))


LORA = ("--use_peft", "true", "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0",
        "--lora_target_modules", "all-linear", "--learning_rate", "1e-2")  # fmt: skip


def test_lora_under_zero3_trains_to_the_one_process_loss_and_merges(base):
    """ZeRO-3 shards the base and the adapter; the saved adapter is whole and the main process merges it
    into model/ alone (outside ZeRO-3's model init), as one process does."""
    from transformers import AutoModelForCausalLM

    one = _train(
        base, "lora-one", [sys.executable], "--per_device_train_batch_size", "4",
        "--precompute_ref_log_probs", "false", *LORA,
    )  # fmt: skip
    two = _train(
        base, "lora-zero3", _accelerate("zero3"), "--per_device_train_batch_size", "2",
        "--precompute_ref_log_probs", "true", *LORA,
    )  # fmt: skip
    assert two["world_size"] == 2 and two["zero_stage"] == 3 and two["adapter"]
    assert one["logged_losses"][-1] < one["logged_losses"][0] - 0.2  # it trained
    for a, b in zip(two["logged_losses"], one["logged_losses"], strict=True):
        assert abs(a - b) < TOL, (two["logged_losses"], one["logged_losses"])
    models = {
        name: AutoModelForCausalLM.from_pretrained(base / exp / f"round_{r}" / "train" / "model")
        for name, exp, r in (("two", "lora-zero3", 1), ("one", "lora-one", 1), ("start", "base", 0))
    }
    moved = drift = 0.0
    for p2, p1, p0 in zip(*(models[n].parameters() for n in ("two", "one", "start")), strict=True):
        moved += (p1 - p0).abs().sum().item()
        drift += (p2 - p1).abs().sum().item()
    assert moved > 0 and drift < 1e-3 * moved, (drift, moved)
