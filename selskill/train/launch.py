"""How training processes start: one process, or several under `accelerate launch`.

`selskill train` and a round's train stage relaunch the script (`python -m selskill.train.run`)
under the recipe's `train_accelerate_config`, from the recipe's command line: each launched
process must build its configs itself, after the distributed state exists. DeepSpeed on CPU
processes (the multi-process tests) needs the gloo backend set up before any config is built,
so every process that may run under DeepSpeed calls `init_cpu_deepspeed` first.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

SCRIPT = "selskill.train.run"  # the module `accelerate launch -m` runs in every process


def under_launcher() -> bool:
    """Whether this process is one of a launch (`accelerate launch`, torchrun): it trains, never relaunches."""
    return "LOCAL_RANK" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_cpu_deepspeed() -> None:
    """DeepSpeed on CPU processes needs the gloo backend before anything sets up the distributed state."""
    if (
        os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true"
        or "LOCAL_RANK" not in os.environ
    ):
        return
    import torch

    if torch.cuda.is_available():
        return
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)


def read_accelerate_config(path: str) -> dict:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(
            f"train_accelerate_config {path} does not exist: use one of recipes/accelerate/{{ddp,zero2,zero3}}.yaml "
            f"(paths are relative to the directory you run from)"
        )
    conf = yaml.safe_load(p.read_text()) or {}
    ds = conf.get("deepspeed_config") or {}
    ds_file = ds.get("deepspeed_config_file")
    if ds_file and not Path(ds_file).is_file():
        raise FileNotFoundError(f"{path} names deepspeed_config_file {ds_file}, which does not exist")
    return conf


def relaunch(accelerate_config: str, argv: Sequence[str] | None) -> int:
    """The exit status of the script run under `accelerate launch --config_file accelerate_config` on `argv`."""
    if argv is None:
        raise ValueError(
            "train_accelerate_config relaunches the train stage from the recipe's command line, and this recipe "
            "was built in code: build it with load_recipe([...])"
        )
    read_accelerate_config(accelerate_config)
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        accelerate_config,
        "-m",
        SCRIPT,
        *argv,
    ]
    logger.info(f"selskill train: {shlex.join(cmd)}")
    return subprocess.call(cmd)
