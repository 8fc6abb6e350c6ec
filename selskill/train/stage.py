"""The train stage: round r's pair shards -> DPO -> runs/<exp>/round_<r>/train/{checkpoint-*, model/, COMPLETED}.

The policy trained (and the reference) is round r-1's `train/model` (round 1: the recipe's
`model_name_or_path`, else the run's init policy at round_0/train/model). Train follows the
stage contract (docs/design.md, "The stage contract"): its main process holds
`train/locks/00000.lock`, so a second train of the round is refused naming the holder; the
label shards are read through the verified reader every stage uses; `COMPLETED` and every
checkpoint record the run's inputs (`selskill.train.inputs`). A round with `COMPLETED` is
skipped when they equal this run's and refused naming the keys that differ when not (`--redo`
trains again). Rerunning resumes from the last complete checkpoint (`selskill.train.checkpoints`).
Every input is checked before `--redo` removes anything. `model/` holds the weights and the
tokenizer; `COMPLETED` is written last. After a resume, its `train_loss` is the mean loss of
the steps this process ran (`train_loss_steps`, after `resumed_at_step`), as the Trainer
computes it; `logged_losses` covers the whole run.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from contextlib import nullcontext
from pathlib import Path

from selskill.data.contract import check_stage, hold_lock
from selskill.data.inputs import fingerprint
from selskill.data.layout import StageDir, check_model_source, resolve_round_policy
from selskill.data.shards import write_json_atomic, write_text_atomic
from selskill.train.args import training_args
from selskill.train.checkpoints import Resume, checkpoint_dirs, record_inputs, resume_point
from selskill.train.dataset import DATASET_DIR, STATS_FILE, load_train_dataset
from selskill.train.inputs import refuse_changed, train_inputs
from selskill.train.wandb_run import WANDB_ID_FILE, finish_wandb, setup_wandb

logger = logging.getLogger(__name__)

COMPLETED = "COMPLETED"
MODEL_DIR = "model"


def run_train(run, policy, cfg) -> Path:
    """Train round `run.round` in this process (under `accelerate launch`, in every process): its directory.

    `cfg` is the recipe's train section; the trainer runs with the DPOConfig built from it and the run
    (`selskill.train.args`), built first: TRL sets up the distributed state from it."""
    from accelerate import PartialState

    stage = StageDir.of(run.runs_dir, run.exp, run.round, "train")
    args = training_args(run, policy, cfg, output_dir=str(stage.path))
    state = PartialState()
    # the main process holds the round; the others follow it (a refused main process ends the launch)
    lock = (
        hold_lock(stage.lock(0), f"train: round {run.round} of {run.exp!r}")
        if state.is_main_process
        else None
    )
    with lock or nullcontext():
        _train_locked(run, policy, args, state, stage)
    return stage.path


def _train_locked(run, policy, cfg, state, stage: StageDir) -> None:
    """Every input is verified (in every process: each reaches the same verdict) before anything is removed."""
    from transformers import AutoTokenizer

    from selskill.train.lora import describe, peft_config
    from selskill.train.trainer import SelSkillDPOTrainer

    model_path, source = resolve_round_policy(run, policy)
    label = StageDir.of(run.runs_dir, run.exp, run.round, "label")
    check_stage(label, run.world_size, "pair")
    check_model_source(model_path, f"the policy round {run.round} trains")
    inputs = train_inputs(cfg, model_path)
    record = inputs.record(stage)
    if _reuse_completed(run, stage, inputs, record, state.is_main_process):
        return
    if state.is_main_process:
        if run.redo:
            _remove_outputs(stage.path)
        stage.path.mkdir(parents=True, exist_ok=True)
    state.wait_for_everyone()
    resume = resume_point(stage.path, inputs, record, state)

    peft = peft_config(cfg)
    if state.is_main_process:
        write_resolved_config(stage.config, run, policy, cfg)
        logger.info(f"train: round {run.round} of {run.exp!r} from {model_path} ({source}) -> {stage.path}")
        if peft is not None:
            logger.info(f"train: {describe(peft)}")

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=policy.trust_remote_code)
    dataset = load_train_dataset(run, cfg, label, record["label shards"], tokenizer, state, stage.path)
    setup_wandb(run, cfg, stage.path, state.is_main_process)

    start = time.time()
    recorded = {"fingerprint": fingerprint(record), "inputs": record}
    trainer = SelSkillDPOTrainer(
        model_path, args=cfg, train_dataset=dataset, processing_class=tokenizer, peft_config=peft
    )
    trainer.add_callback(record_inputs(recorded))
    checkpoint = resume.checkpoint
    result = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    _refuse_diverged(trainer, result)

    lora = peft is not None
    _save_model(trainer, tokenizer, state, stage.path, model_path, policy.trust_remote_code, lora)
    if state.is_main_process:
        done = stage.path / COMPLETED
        summary = _summary(trainer, result, state, stage.path, model_path, lora, resume, len(dataset), start)
        write_json_atomic({**summary, **recorded}, done)
        logger.info(f"train: wrote {stage.path / MODEL_DIR} and {done}")
    state.wait_for_everyone()
    finish_wandb(cfg, state.is_main_process)


def _refuse_diverged(trainer, result) -> None:
    """Fail, in every process alike, when the trained weights or the mean loss are not finite: `COMPLETED`
    would hand a model that computes nan to every later stage (the loss is checked at every step too)."""
    import math

    import torch

    from selskill.train.trainer import DIVERGED_FIX, TrainDiverged

    bad = trainer.nonfinite_weights()
    count = torch.tensor([len(bad)], device=trainer.accelerator.device)
    total = int(trainer.accelerator.reduce(count, reduction="sum").item())
    if total:
        named = f" ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})" if bad else ""
        raise TrainDiverged(
            f"train: {total} trained parameter tensor{'s' if total > 1 else ''} hold nan or inf after step "
            f"{trainer.state.global_step}{named}: the training diverged; {DIVERGED_FIX}"
        )
    if not math.isfinite(result.training_loss):
        raise TrainDiverged(f"train: the mean training loss is {result.training_loss}: {DIVERGED_FIX}")


def _reuse_completed(run, stage: StageDir, inputs, record: dict, is_main: bool) -> bool:
    """Whether the round is complete for this run (its recorded inputs equal this run's); refused when it
    recorded others. With `--redo`, never: the round trains again."""
    done = stage.path / COMPLETED
    if not done.exists() or run.redo:
        return False
    before = json.loads(done.read_text() or "{}").get("inputs")
    if before is None:
        if is_main:
            logger.info(f"train: {done} predates recorded inputs: reused unchecked (--redo trains again)")
    else:
        refuse_changed(
            f"round {run.round}",
            inputs.changes(before, record),
            done,
            "Rerun with --redo to train again (its model and checkpoints are replaced)",
        )
    if is_main:
        logger.info(f"train: {stage.path} is complete ({COMPLETED} exists); rerun with --redo to train again")
    return True


def _remove_outputs(stage_path: Path) -> None:
    """What a `--redo` replaces: the marker, the model and adapter, the dataset, the wandb run, the checkpoints."""
    from selskill.train.lora import ADAPTER_DIR

    old = [
        stage_path / COMPLETED,
        stage_path / MODEL_DIR,
        stage_path / ADAPTER_DIR,
        stage_path / DATASET_DIR,
        stage_path / STATS_FILE,
        stage_path / WANDB_ID_FILE,
    ]
    for p in [*old, *checkpoint_dirs(stage_path)]:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def _save_model(
    trainer, tokenizer, state, stage_path: Path, model_path: str, trust_remote_code: bool, lora: bool
) -> None:
    """`model/`: the trained weights and the tokenizer (with LoRA: `adapter/`, and the base with it merged
    in as `model/`), written under a temporary name and renamed once whole."""
    from selskill.train.lora import ADAPTER_DIR, merge_adapter

    tmp = stage_path / f"{MODEL_DIR}.tmp"
    saved = stage_path / f"{ADAPTER_DIR}.tmp" if lora else tmp  # what the Trainer saves
    if state.is_main_process:
        for p in {tmp, saved}:
            shutil.rmtree(p, ignore_errors=True)  # left by a save that crashed
    state.wait_for_everyone()
    trainer.save_model(str(saved))  # every rank: ZeRO-3 gathers the weights (with LoRA, the adapter's)
    state.wait_for_everyone()
    if not state.is_main_process:
        return
    tokenizer.save_pretrained(str(saved))
    if lora:
        base_dtype = trainer.accelerator.unwrap_model(trainer.model).get_base_model().dtype
        merge_adapter(model_path, saved, tmp, base_dtype, trust_remote_code)
        tokenizer.save_pretrained(str(tmp))  # with LoRA, model/ is the base with the adapter merged in
        shutil.rmtree(stage_path / ADAPTER_DIR, ignore_errors=True)
        saved.rename(stage_path / ADAPTER_DIR)
    final = stage_path / MODEL_DIR
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)


def _summary(
    trainer,
    result,
    state,
    stage_path: Path,
    model_path: str,
    lora: bool,
    resume: Resume,
    pairs: int,
    start: float,
) -> dict:
    """What `COMPLETED` says about the training (besides its inputs)."""
    from selskill.train.lora import ADAPTER_DIR

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {
        "model": str(stage_path / MODEL_DIR),
        "adapter": str(stage_path / ADAPTER_DIR) if lora else None,
        "policy_source": model_path,
        "global_step": trainer.state.global_step,
        "train_loss": result.training_loss,  # mean over train_loss_steps (this process's steps)
        "train_loss_steps": trainer.state.global_step - resume.step,
        "resumed_from": str(resume.checkpoint) if resume.checkpoint else None,
        "resumed_at_step": resume.step,
        "first_logged_loss": losses[0] if losses else None,
        "last_logged_loss": losses[-1] if losses else None,
        "logged_losses": losses,
        "pairs": pairs,
        "world_size": state.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type.value),
        "zero_stage": getattr(trainer.accelerator.state.deepspeed_plugin, "zero_stage", None),
        "seconds": round(time.time() - start, 1),
    }


def write_resolved_config(path: Path, *configs) -> None:
    """The sections a run resolved, flat, as `config.yaml` beside what they computed (of TRL's config, the
    fields that are keys of the train section: the others are keys of the sections beside it, or none)."""
    import dataclasses

    import yaml

    flat: dict = {}
    for c in configs:
        values = c.to_dict() if hasattr(c, "to_dict") else dataclasses.asdict(c)
        flat.update({k: v for k, v in values.items() if k not in getattr(c, "_not_recipe_keys", ())})
    write_text_atomic(yaml.safe_dump(json.loads(json.dumps(flat, default=str)), sort_keys=True), path)
