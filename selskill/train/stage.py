"""The train stage: round r's pair shards -> DPO -> runs/<exp>/round_<r>/train/{checkpoint-*, model/, COMPLETED}.

With `train_objective: sft_wins` it reads the round's sample shards instead and fine-tunes on
their winning episodes (`selskill.train.wins`, through the init's SFT in `selskill.train.sft`),
writing the same outputs under the same contract; its counts go to `wins_stats.json`.

The policy trained (and the reference) is round r-1's `train/model` (round 1: the recipe's
`model_name_or_path`, else the run's init policy at round_0/train/model). Train follows the
stage contract (docs/design.md, "The stage contract"): its main process holds
`train/locks/00000.lock`, so a second train of the round is refused naming the holder; the
label (or sample) shards are read through the verified reader every stage uses; `COMPLETED` and every
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
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from pathlib import Path

from selskill.data.contract import check_stage, hold_lock
from selskill.data.inputs import fingerprint
from selskill.data.layout import StageDir, check_model_source, resolve_round_policy
from selskill.data.removal import finish_removals, remove_outputs, replace_output
from selskill.data.shards import write_json_atomic, write_text_atomic
from selskill.errors import ExplainedError, is_disk_full
from selskill.train.args import training_args
from selskill.train.checkpoints import Resume, checkpoint_dirs, record_inputs, resume_point
from selskill.train.dataset import DATASET_DIR, STATS_FILE, load_train_dataset
from selskill.train.inputs import refuse_changed, train_inputs, upstream_of
from selskill.train.wandb_run import WANDB_ID_FILE, finish_wandb, setup_wandb
from selskill.train.wins import WINS_STATS_FILE, load_win_dataset

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

    model_path, source = resolve_round_policy(run, policy)
    name, kind = upstream_of(cfg)
    upstream = StageDir.of(run.runs_dir, run.exp, run.round, name)
    check_stage(upstream, run.world_size, kind)
    check_model_source(model_path, f"the policy round {run.round} trains")
    inputs = train_inputs(cfg, model_path)
    record = inputs.record(stage)
    if state.is_main_process:  # a `--redo` killed while it removed the outputs is finished first
        finish_removals(stage.path, lambda line: logger.info(f"train: {line}"))
    state.wait_for_everyone()
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
        logger.info(
            f"train ({cfg.train_objective}): round {run.round} of {run.exp!r} from {model_path} ({source}) -> {stage.path}"
        )
        if peft is not None:
            logger.info(f"train: {describe(peft, reference=cfg.train_objective == 'dpo')}")

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=policy.trust_remote_code)
    with _naming_a_full_disk(lambda: stage.path / f"{DATASET_DIR}.tmp"):
        if cfg.train_objective == "sft_wins":
            dataset = load_win_dataset(run, cfg, upstream, state.is_main_process, stage.path)
            trained = {"episodes": len(dataset)}
        else:
            dataset = load_train_dataset(
                run, cfg, upstream, record["label shards"], tokenizer, state, stage.path
            )
            trained = {"pairs": len(dataset)}
    setup_wandb(run, cfg, stage.path, state.is_main_process)

    start = time.time()
    recorded = {"fingerprint": fingerprint(record), "inputs": record}
    checkpoint = str(resume.checkpoint) if resume.checkpoint else None
    with _naming_a_full_disk(lambda: _newest_checkpoint(stage.path)):
        trainer, loss = _fit(cfg, model_path, dataset, tokenizer, peft, record_inputs(recorded), checkpoint)
    _refuse_diverged(trainer, loss)

    lora = peft is not None
    with _naming_a_full_disk(lambda: stage.path / f"{MODEL_DIR}.tmp"):
        _save_model(trainer, tokenizer, state, stage.path, model_path, policy.trust_remote_code, lora)
    if state.is_main_process:
        done = stage.path / COMPLETED
        summary = _summary(trainer, loss, state, stage.path, model_path, lora, resume, start)
        write_json_atomic({**summary, "objective": cfg.train_objective, **trained, **recorded}, done)
        logger.info(f"train: wrote {stage.path / MODEL_DIR} and {done}")
    state.wait_for_everyone()
    finish_wandb(cfg, state.is_main_process)


def _fit(cfg, model_path: str, dataset, tokenizer, peft, callback, checkpoint: str | None) -> tuple:
    """(the trainer, its mean training loss) of the section's objective, resumed from `checkpoint` if one."""
    if cfg.train_objective == "sft_wins":
        from selskill.train.sft import fit, sft_args

        trainer, stats = fit(
            model_path, tokenizer, dataset, sft_args(cfg), resume_from_checkpoint=checkpoint,
            peft_config=peft, callbacks=[callback],
        )  # fmt: skip
        return trainer, stats["final_train_loss"]
    from selskill.train.trainer import SelSkillDPOTrainer

    trainer = SelSkillDPOTrainer(
        model_path, args=cfg, train_dataset=dataset, processing_class=tokenizer, peft_config=peft
    )
    trainer.add_callback(callback)
    return trainer, trainer.train(resume_from_checkpoint=checkpoint).training_loss


def _refuse_diverged(trainer, loss: float) -> None:
    """Fail, in every process alike, when the trained weights or the mean loss are not finite: `COMPLETED`
    would hand a model that computes nan to every later stage (the DPO loss is checked at every step too)."""
    import math

    import torch

    from selskill.train.trainer import DIVERGED_FIX, TrainDiverged, nonfinite_weights

    bad = nonfinite_weights(trainer.model)
    count = torch.tensor([len(bad)], device=trainer.accelerator.device)
    total = int(trainer.accelerator.reduce(count, reduction="sum").item())
    if total:
        named = f" ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})" if bad else ""
        raise TrainDiverged(
            f"train: {total} trained parameter tensor{'s' if total > 1 else ''} hold nan or inf after step "
            f"{trainer.state.global_step}{named}: the training diverged; {DIVERGED_FIX}"
        )
    if not math.isfinite(loss):
        raise TrainDiverged(f"train: the mean training loss is {loss}: {DIVERGED_FIX}")


def _newest_checkpoint(stage_path: Path) -> Path:
    """The checkpoint folder the Trainer was writing (it makes the folder before the files)."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    steps = [p for p in stage_path.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if p.name.rsplit("-", 1)[1].isdigit()]
    return max(
        steps, key=lambda p: int(p.name.rsplit("-", 1)[1]), default=stage_path / f"{PREFIX_CHECKPOINT_DIR}-*"
    )


@contextmanager
def _naming_a_full_disk(writing: Callable[[], Path]):
    """A full disk while train writes `writing()` ends on one line naming it and the fix: safetensors' and
    torch's errors name no file, and the Trainer's traceback buries them under fifty lines."""
    try:
        yield
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ExplainedError(
            f"{writing()}: cannot write: No space left on device ({type(exc).__name__}: {said}). Free space on "
            "that filesystem (older rounds' checkpoint-* folders can go; save_total_limit keeps fewer), or move "
            "runs_dir to one with room and pass --runs_dir; then rerun: train resumes from its last complete "
            "checkpoint",
            status=1,
        ) from exc


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
    """What a `--redo` replaces: the marker (first), the model and adapter, the dataset, the wandb run, the
    checkpoints; all set aside at once, so a kill leaves them in place or half-removed, which the next run
    finishes (`selskill.data.removal`)."""
    from selskill.train.lora import ADAPTER_DIR

    old = [
        stage_path / COMPLETED,
        stage_path / MODEL_DIR,
        stage_path / ADAPTER_DIR,
        stage_path / DATASET_DIR,
        stage_path / STATS_FILE,
        stage_path / WINS_STATS_FILE,
        stage_path / WANDB_ID_FILE,
    ]
    remove_outputs([*old, *checkpoint_dirs(stage_path)], "redo")


def _save_model(
    trainer, tokenizer, state, stage_path: Path, model_path: str, trust_remote_code: bool, lora: bool
) -> None:
    """`model/`: the trained weights and the tokenizer (with LoRA: `adapter/`, and the base with it merged
    in as `model/`), written under a temporary name and renamed once whole."""
    from selskill.train.lora import ADAPTER_DIR, merge_adapter

    tmp = stage_path / f"{MODEL_DIR}.tmp"
    saved = stage_path / f"{ADAPTER_DIR}.tmp" if lora else tmp  # what the Trainer saves
    if state.is_main_process:
        remove_outputs(sorted({tmp, saved}), "save")  # left by a save that crashed
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
        replace_output(saved, stage_path / ADAPTER_DIR, "save")
    replace_output(tmp, stage_path / MODEL_DIR, "save")


def _summary(
    trainer,
    loss: float,
    state,
    stage_path: Path,
    model_path: str,
    lora: bool,
    resume: Resume,
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
        "train_loss": loss,  # mean over train_loss_steps (this process's steps)
        "train_loss_steps": trainer.state.global_step - resume.step,
        "resumed_from": str(resume.checkpoint) if resume.checkpoint else None,
        "resumed_at_step": resume.step,
        "first_logged_loss": losses[0] if losses else None,
        "last_logged_loss": losses[-1] if losses else None,
        "logged_losses": losses,
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
