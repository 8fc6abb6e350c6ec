"""The DPOConfig the trainer runs with: the recipe's train section, completed by the run and this machine.

The train section (`selskill.config.train.TrainConfig`) holds TRL's keys as the recipe gives
them, on any machine. What TRL also reads from its config but the section does not decide is
set here, when the train stage (or its dry run) starts: the run-wide `report_to`,
`log_level` and `seed` and the policy's `trust_remote_code` (`OWNED_ELSEWHERE`), and what
depends on the machine: bf16 where the recipe leaves it unset, TRL's check that this machine
supports bf16 (a dry run defers it to the machine that trains, and says so), and a
multi-process launch on a machine without accelerators (the processes form one gloo group).
"""

from __future__ import annotations

import dataclasses
import os

from selskill.config.train import OWNED_ELSEWHERE, TrainConfig


def bf16_available() -> bool:
    """True where bf16 mixed precision can run on an accelerator (CPU-only machines: False)."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def cpu_only_launch() -> bool:
    """True in a process started by a multi-process launcher on a machine without accelerators."""
    if "LOCAL_RANK" not in os.environ:
        return False
    import torch

    accel = getattr(torch, "accelerator", None)
    return not (torch.cuda.is_available() or (accel is not None and accel.is_available()))


def deepspeed_launch() -> bool:
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


class TrainingArgs(TrainConfig):
    """The train section as the trainer runs it: TRL's checks of this machine run when it is built."""

    _checks_machine = True


def training_args(run, policy, cfg: TrainConfig, **changes) -> TrainingArgs:
    """The DPOConfig the train stage trains (or dry-runs) with: `cfg` plus the run's and policy's keys it
    holds (`OWNED_ELSEWHERE`), this machine's settings, and `changes` (e.g. `output_dir`).

    A dry run (`run.dry_run`) of a bf16 recipe on a machine without bf16 builds it with bf16 off and
    keeps `bf16` as asked, with `bf16_deferred` set: the machine that trains checks it.
    """
    owners = {"RunConfig": run, "PolicyConfig": policy}
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}
    values |= {key: getattr(owners[owner], key) for key, owner in OWNED_ELSEWHERE.items()}
    values |= changes
    if values["bf16"] is None:  # unset: on where an accelerator supports it
        values["bf16"] = bool(not values["fp16"] and bf16_available())
    if cpu_only_launch():
        # An accelerate config written for GPUs, launched on a machine without accelerators: accelerate
        # finds no backend and every process would train alone as rank 0. Make them one gloo group.
        if deepspeed_launch():
            values["ddp_backend"] = (
                values["ddp_backend"] or "gloo"
            )  # use_cpu would silently turn DeepSpeed off
        else:
            values["use_cpu"] = True
    deferred = bool(run.dry_run and values["bf16"] and not values["use_cpu"] and not bf16_available())
    if deferred:
        values["bf16"] = False
    args = TrainingArgs(**values)
    if deferred:
        args.bf16 = True
    args.bf16_deferred = deferred
    return args
