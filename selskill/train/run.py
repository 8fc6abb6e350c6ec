"""The train stage: round r's pair shards -> DPO -> runs/<exp>/round_<r>/train/{checkpoint-*, model/, COMPLETED}.

    python -m selskill.train.run --config recipes/tiny.yaml --round 1          (one process)
    accelerate launch --config_file recipes/accelerate/zero3.yaml pipelines/train_dpo.py \\
        --config recipes/dpo_8b.yaml --round 1                                (many)
    selskill train --config recipes/dpo_8b.yaml --round 1   (relaunches under train_accelerate_config)

The policy trained (and the reference) is round r-1's `train/model` (round 1: the recipe's
`model_name_or_path`, else the run's init policy at round_0/train/model). Train follows the
stage contract (docs/design.md, "The stage contract"): its main process holds
`train/locks/00000.lock`, so a second train of the round is refused naming the holder; the
label shards are read through the verified reader every stage uses; `COMPLETED` and every
checkpoint record the run's inputs (the label shards' and the policy's fingerprints, the
material train keys, the seed, `CODE_VERSION`). A round with `COMPLETED` is skipped when
they equal this run's and refused naming the keys that differ when not (`--redo` trains
again). Rerunning resumes from the last *complete* checkpoint: a newer one that a crash left
half-written (a truncated weights or optimizer file, no trainer_state.json or inputs file)
is moved aside to `incomplete-checkpoint-N` with a message naming it and the file, and one
that recorded other inputs is refused, never resumed. Every input is checked before
`--redo` removes anything. `model/` holds the weights and the tokenizer; `COMPLETED` is
written last. After a resume, its `train_loss` is the mean loss of the steps this process
ran (`train_loss_steps`, after `resumed_at_step`), as the Trainer computes it;
`logged_losses` covers the whole run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

from selskill.data.contract import StageRefused, changed_inputs, check_stage, hold_lock, read_stage
from selskill.data.inputs import StageInputs, fingerprint
from selskill.data.layout import StageDir, check_model_source, resolve_round_policy
from selskill.data.shards import ShardError, write_json_atomic, write_text_atomic

logger = logging.getLogger(__name__)

CODE_VERSION = 1  # bump when a change alters what training computes (a complete round is then refused)
COMPLETED = "COMPLETED"
DATASET_DIR = "dataset"
STATS_FILE = "pairs_stats.json"
INPUTS_FILE = "selskill_inputs.json"  # in each checkpoint: the inputs of the run that wrote it

# Train keys that say where training writes, how it logs, saves, evaluates or reports, and how fast or on
# what it runs, not what it computes (memory and speed knobs change the model only at float rounding, as
# batching does for the episode stages): left out of the recorded inputs, by name or by prefix.
NOT_INPUT_KEYS = frozenset(
    {
        "output_dir",
        "run_name",
        "project",
        "report_to",
        "disable_tqdm",
        "push_to_hub",
        "resume_from_checkpoint",
        "overwrite_output_dir",
        "dry_run",
        "train_accelerate_config",
        "local_rank",
        "use_cpu",
        "skip_memory_metrics",
        "per_device_eval_batch_size",
        "bf16_full_eval",
        "fp16_full_eval",
        "batch_eval_metrics",
        "prediction_loss_only",
        "include_for_metrics",
        "include_num_input_tokens_seen",
        "metric_for_best_model",
        "greater_is_better",
        "load_best_model_at_end",
        "dataset_num_proc",
        "restore_callback_states_from_checkpoint",
        "enable_jit_checkpoint",
        "debug",
        "torch_empty_cache_steps",
        "deepspeed",
        "fsdp",
        "fsdp_config",
        "parallelism_config",
        "activation_offloading",
        "auto_find_batch_size",
        "use_liger_kernel",
        "liger_kernel_config",
        "padding_free",
        "pad_to_multiple_of",
        "tf32",
    }
)
NOT_INPUT_PREFIXES = (
    "logging_",
    "log_",
    "save_",
    "hub_",
    "trackio_",
    "eval_",
    "do_",
    "dataloader_",
    "ddp_",
    "torch_compile",
    "gradient_checkpointing",
    "precompute_ref_",
)


class NoTrainablePairs(ValueError):
    """The round's label stage left nothing to train on: the user's data, not a bug (the
    replication skips an ablation variant that ends here instead of stopping the benchmark)."""


# --- inputs ---------------------------------------------------------------------------------------------


def train_inputs(cfg, model_path: str) -> StageInputs:
    """What the trained model depends on: the label shards, the policy, the material train keys, the seed."""
    keys = {f.name for f in dataclasses.fields(cfg)}
    not_inputs = NOT_INPUT_KEYS | {k for k in keys if k.startswith(NOT_INPUT_PREFIXES)}
    return StageInputs(
        [cfg],
        cfg.seed,
        CODE_VERSION,
        policy=model_path,
        upstream=("label",),
        not_inputs=frozenset(not_inputs),
    )


def _under_launcher() -> bool:
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


# --- dataset --------------------------------------------------------------------------------------------


def _dataset_key(label_fingerprint: str, cfg) -> str:
    """What the cached pair dataset depends on: the label shards' content, every `train_*` key, max_length, seed.

    The keys are taken from the config class, not listed by hand: a hand list once left out
    `train_branch_pools` and `train_max_pairs`, and a resumed run with either changed trained
    on the old dataset. A key that does not change the pairs only costs a rebuild.
    """
    knobs = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name.startswith("train_")}
    knobs.update(max_length=cfg.max_length, seed=cfg.seed, label=label_fingerprint)
    return hashlib.sha256(json.dumps(knobs, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_train_dataset(
    label: StageDir, key: str, cfg, tokenizer, out_dir: Path, is_main: bool, world_size: int
):
    """The label stage's pairs -> token rows saved under out_dir (built once by the main process, reused on resume).

    The dataset lives on disk so that every process sees the same files, which is what TRL's
    `precompute_ref_log_probs` cache needs with several processes
    (docs/design.md, "The train dataset is a directory").
    """
    from datasets import load_from_disk

    from selskill.train.pairs import build_from_config, examples_to_dataset

    stamp = out_dir / "build.json"
    if is_main and not (stamp.is_file() and json.loads(stamp.read_text()).get("key") == key):
        table = read_stage(label, "pair", world_size)
        examples, stats = build_from_config(table, cfg, tokenizer)
        logger.info(stats.report())
        if not examples:
            raise ValueError(
                f"no trainable pairs in the label stage at {label.shards} "
                f"(train_pair_kinds={cfg.train_pair_kinds}, max_length={cfg.max_length}): see the counts above"
            )
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        examples_to_dataset(examples).save_to_disk(str(tmp))
        write_json_atomic({"key": key, "stats": stats.to_dict()}, tmp / "build.json")
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
        write_json_atomic(stats.to_dict(), out_dir.parent / STATS_FILE)
    return load_from_disk(str(out_dir))


# --- wandb ----------------------------------------------------------------------------------------------


def setup_wandb(run, cfg, stage_path: Path, is_main: bool) -> None:
    """wandb run with group=<exp>, job_type=train, like every stage's (`selskill.tracking`): offline unless
    WANDB_MODE says otherwise; off when WANDB_MODE=disabled."""
    from selskill.tracking import offline_by_default, wandb_wanted

    if not wandb_wanted(cfg.report_to):
        cfg.report_to = [r for r in cfg.report_to or [] if r != "wandb"]
        return
    offline_by_default()
    os.environ.setdefault("WANDB_PROJECT", run.wandb_project)
    if not is_main:
        return
    import wandb

    id_file = stage_path / "wandb_id"
    run_id = (
        id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(8)
    )  # resumes keep the run
    id_file.write_text(run_id + "\n")
    wandb.init(
        project=run.wandb_project,
        group=run.exp,
        job_type="train",
        name=f"{run.exp}-round{run.round}-train",
        id=run_id,
        resume="allow",
        dir=str(stage_path),
        # the seed is the run section's key (TRL's field is not a recipe key, so to_dict() lacks it)
        config={"round": run.round, "exp": run.exp, **_jsonable(cfg.to_dict()), "seed": cfg.seed},
    )


def _jsonable(d: dict) -> dict:
    return json.loads(json.dumps(d, default=str))


# --- the stage ------------------------------------------------------------------------------------------


def write_resolved_config(path: Path, *configs) -> None:
    import dataclasses

    import yaml

    flat: dict = {}
    for c in configs:
        flat.update(c.to_dict() if hasattr(c, "to_dict") else dataclasses.asdict(c))
    write_text_atomic(yaml.safe_dump(_jsonable(flat), sort_keys=True), path)


# --- checkpoints ----------------------------------------------------------------------------------------

INCOMPLETE_PREFIX = "incomplete-"  # not `checkpoint-*`: the Trainer neither resumes from nor rotates it


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{path.name} is truncated ({size} bytes)"
        n = int.from_bytes(head, "little")
        if 8 + n > size:
            return f"{path.name} is truncated ({size} bytes, its header alone needs {8 + n})"
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return f"{path.name} has an unreadable header"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        return f"{path.name} is truncated ({size} of {8 + n + end} bytes)"
    return None


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why `ckpt` cannot be resumed from (None: it can): a file the save never finished.

    trainer_state.json is the last file the Trainer writes, and the inputs file is written
    after it (`record_inputs`); every weights, optimizer and state file must also be whole
    (safetensors by its header, torch pickles by their zip directory, JSON by parsing).
    """
    import zipfile

    if not (ckpt / "trainer_state.json").is_file():
        return "it has no trainer_state.json (the save did not finish)"
    if not (ckpt / INPUTS_FILE).is_file():
        return f"it has no {INPUTS_FILE} (the save did not finish, or a selskill that did not record inputs wrote it)"
    for f in sorted(p for p in ckpt.rglob("*") if p.is_file()):
        rel = f.relative_to(ckpt)
        if f.suffix == ".safetensors":
            problem = _safetensors_problem(f)
            if problem:
                return problem.replace(f.name, str(rel), 1)
        elif f.suffix in (".pt", ".pth", ".bin"):
            try:
                zipfile.ZipFile(f).close()
            except (zipfile.BadZipFile, OSError) as exc:
                return f"{rel} is truncated or corrupt ({exc})"
        elif f.suffix == ".json":
            try:
                json.loads(f.read_text())
            except (ValueError, OSError) as exc:
                return f"{rel} is unreadable ({exc})"
    return None


def resumable_checkpoint(stage_path: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the newest complete checkpoint-N, the newer incomplete ones with why)."""
    import re

    found = [
        (int(m.group(1)), p)
        for p in (stage_path.iterdir() if stage_path.is_dir() else ())
        if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name))
    ]
    broken = []
    for _, ckpt in sorted(found, reverse=True):
        problem = checkpoint_problem(ckpt)
        if problem is None:
            return ckpt, broken
        broken.append((ckpt, problem))
    return None, broken


def record_inputs(recorded: dict):
    """A Trainer callback writing `recorded` into every checkpoint once it is saved: a rerun resumes only a
    checkpoint of its own run (same inputs), and one without the file counts as unfinished."""
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    class RecordInputs(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                ckpt = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
                write_json_atomic(recorded, ckpt / INPUTS_FILE)

    return RecordInputs()


def set_aside(ckpt: Path) -> Path:
    dest = ckpt.with_name(INCOMPLETE_PREFIX + ckpt.name)
    n = 1
    while dest.exists():
        n += 1
        dest = ckpt.with_name(f"{INCOMPLETE_PREFIX}{ckpt.name}.{n}")
    ckpt.rename(dest)
    return dest


def run_train(run, policy, cfg) -> Path:
    """Train round `run.round`; returns the train stage directory.

    Refused (`StageRefused`): another process trains the round, or without `run.redo` its
    `COMPLETED` or the checkpoint it would resume recorded other inputs than this run's.
    """
    from accelerate import PartialState

    state = PartialState()
    stage = StageDir.of(run.runs_dir, run.exp, run.round, "train")
    # the main process holds the round; the others follow it (a refused main process ends the launch)
    lock = (
        hold_lock(stage.lock(0), f"train: round {run.round} of {run.exp!r}")
        if state.is_main_process
        else None
    )
    with lock or nullcontext():
        _train_locked(run, policy, cfg, state, stage)
    return stage.path


def _refuse_changed(what: str, changes: list[str], recorded_in: Path, fix: str) -> None:
    if changes:
        raise changed_inputs(f"train: {what}", changes, recorded_in, fix)


def _train_locked(run, policy, cfg, state, stage: StageDir) -> None:
    """Every input is verified (in every process: each reaches the same verdict) before anything is removed."""
    from transformers import AutoTokenizer

    from selskill.train.lora import ADAPTER_DIR, describe, merge_adapter, peft_config
    from selskill.train.trainer import SelSkillDPOTrainer

    model_path, source = resolve_round_policy(run, policy)
    label = StageDir.of(run.runs_dir, run.exp, run.round, "label")
    check_stage(label, run.world_size, "pair")
    check_model_source(model_path, f"the policy round {run.round} trains")
    inputs = train_inputs(cfg, model_path)
    record = inputs.record(stage)
    recorded = {"fingerprint": fingerprint(record), "inputs": record}
    done = stage.path / COMPLETED
    if done.exists() and not run.redo:
        before = json.loads(done.read_text() or "{}").get("inputs")
        if before is None:
            if state.is_main_process:
                logger.info(f"train: {done} predates recorded inputs: reused unchecked (--redo trains again)")
        else:
            _refuse_changed(
                f"round {run.round}",
                inputs.changes(before, record),
                done,
                "Rerun with --redo to train again (its model and checkpoints are replaced)",
            )
        if state.is_main_process:
            logger.info(
                f"train: {stage.path} is complete ({COMPLETED} exists); rerun with --redo to train again"
            )
        return
    if state.is_main_process:
        if run.redo:
            old = [
                done,
                stage.path / "model",
                stage.path / ADAPTER_DIR,
                stage.path / DATASET_DIR,
                stage.path / STATS_FILE,
                stage.path / "wandb_id",
            ]
            for p in [
                *old,
                *stage.path.glob("checkpoint-*"),
                *stage.path.glob(INCOMPLETE_PREFIX + "checkpoint-*"),
            ]:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        stage.path.mkdir(parents=True, exist_ok=True)
    state.wait_for_everyone()

    last, broken = resumable_checkpoint(stage.path)
    if last is not None:
        own = json.loads((last / INPUTS_FILE).read_text()).get("inputs") or {}
        _refuse_changed(
            f"{last}",
            inputs.changes(own, record),
            last / INPUTS_FILE,
            "It is not resumed: rerun with --redo to train from the start (the round's checkpoints are deleted)",
        )
    state.wait_for_everyone()  # every process has chosen before the main one moves anything
    if state.is_main_process:
        for ckpt, problem in broken:
            logger.warning(f"train: skipping {ckpt}: {problem}; moved it to {set_aside(ckpt)}")
        if last:
            logger.info(f"train: resuming from {last}")
        elif broken:
            logger.info("train: no complete checkpoint left: training from the start")

    cfg.output_dir = str(stage.path)
    cfg.trust_remote_code = policy.trust_remote_code
    peft = peft_config(cfg)
    if state.is_main_process:
        write_resolved_config(stage.config, run, policy, cfg)
        logger.info(f"train: round {run.round} of {run.exp!r} from {model_path} ({source}) -> {stage.path}")
        if peft is not None:
            logger.info(f"train: {describe(peft)}")

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=policy.trust_remote_code)
    key = _dataset_key(record["label shards"], cfg)
    with state.main_process_first():
        dataset = build_train_dataset(
            label, key, cfg, tokenizer, stage.path / DATASET_DIR, state.is_main_process, run.world_size
        )
    if len(dataset) == 0:
        raise NoTrainablePairs(
            f"round {run.round} has no trainable pairs (see the discard reasons in {label.stats}): local pairs need "
            "a successful continuation at a branch point and episode pairs a success among a task's samples. Sample "
            "more (sample_k, sample_max_tasks, fork_k_*), give episodes more steps (max_decisions), or start from a "
            "stronger policy"
        )
    setup_wandb(run, cfg, stage.path, state.is_main_process)

    start = time.time()
    trainer = SelSkillDPOTrainer(
        model_path, args=cfg, train_dataset=dataset, processing_class=tokenizer, peft_config=peft
    )
    trainer.add_callback(record_inputs(recorded))
    resumed_at = json.loads((last / "trainer_state.json").read_text())["global_step"] if last else 0
    result = trainer.train(resume_from_checkpoint=str(last) if last else None)

    tmp = stage.path / "model.tmp"
    saved = stage.path / f"{ADAPTER_DIR}.tmp" if peft is not None else tmp  # what the Trainer saves
    if state.is_main_process:
        for p in {tmp, saved}:
            shutil.rmtree(p, ignore_errors=True)  # left by a save that crashed
    state.wait_for_everyone()
    trainer.save_model(str(saved))  # every rank: ZeRO-3 gathers the weights (with LoRA, the adapter's)
    state.wait_for_everyone()
    if state.is_main_process:
        tokenizer.save_pretrained(str(saved))
        if peft is not None:
            base_dtype = trainer.accelerator.unwrap_model(trainer.model).get_base_model().dtype
            merge_adapter(model_path, saved, tmp, base_dtype, policy.trust_remote_code)
            tokenizer.save_pretrained(str(tmp))  # with LoRA, model/ is the base with the adapter merged in
            shutil.rmtree(stage.path / ADAPTER_DIR, ignore_errors=True)
            saved.rename(stage.path / ADAPTER_DIR)
        final = stage.path / "model"
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        write_json_atomic(
            {
                "model": str(final),
                "adapter": str(stage.path / ADAPTER_DIR) if peft is not None else None,
                "policy_source": model_path,
                "global_step": trainer.state.global_step,
                "train_loss": result.training_loss,  # mean over train_loss_steps (this process's steps)
                "train_loss_steps": trainer.state.global_step - resumed_at,
                "resumed_from": str(last) if last else None,
                "resumed_at_step": resumed_at,
                "first_logged_loss": losses[0] if losses else None,
                "last_logged_loss": losses[-1] if losses else None,
                "logged_losses": losses,
                "pairs": len(dataset),
                "world_size": state.num_processes,
                "distributed_type": str(trainer.accelerator.distributed_type.value),
                "zero_stage": getattr(trainer.accelerator.state.deepspeed_plugin, "zero_stage", None),
                "seconds": round(time.time() - start, 1),
                **recorded,
            },
            done,
        )
        logger.info(f"train: wrote {final} and {done}")
    state.wait_for_everyone()
    if "wandb" in (cfg.report_to or []) and state.is_main_process:
        import wandb

        wandb.finish()


# --- dry run --------------------------------------------------------------------------------------------


def count_steps(pairs: int, cfg, world_size: int) -> int:
    """Optimizer steps the Trainer will take for `pairs` rows (its own formula, even batches per rank)."""
    if cfg.max_steps > 0:
        return cfg.max_steps
    batches = math.ceil(pairs / (cfg.per_device_train_batch_size * world_size))
    per_epoch = max(math.ceil(batches / cfg.gradient_accumulation_steps), 1)
    return math.ceil(cfg.num_train_epochs * per_epoch)


def dry_run(run, policy, cfg, out=print) -> dict:
    """Resolve files, count pairs when shards exist, print batch size and steps. Loads no weights."""
    info: dict = {}
    world = int(os.environ.get("WORLD_SIZE", "0")) if _under_launcher() else 0
    if cfg.train_accelerate_config:
        conf = read_accelerate_config(cfg.train_accelerate_config)
        info["accelerate"] = {
            "config": cfg.train_accelerate_config,
            "distributed_type": conf.get("distributed_type"),
            "num_processes": conf.get("num_processes", 1),
            "zero_stage": (conf.get("deepspeed_config") or {}).get("zero_stage"),
            "mixed_precision": conf.get("mixed_precision"),
        }
        world = world or int(conf.get("num_processes", 1))
    world = world or 1
    eff = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * world
    info.update(world_size=world, effective_batch_size=eff)
    try:
        model_path, source = resolve_round_policy(run, policy)
        info["policy"] = f"{model_path} ({source})"
    except FileNotFoundError as exc:
        model_path, info["policy"] = None, f"not available yet: {exc}"
    label = StageDir.of(run.runs_dir, run.exp, run.round, "label")
    info["pairs"] = table = None
    if label.shard_files() or label.completed_ranks():
        try:  # the pairs training would read: through the same verified reader
            table = read_stage(label, "pair", run.world_size)
        except (FileNotFoundError, ShardError, StageRefused) as exc:
            info["label_problem"] = str(exc)
    if table is not None:
        from selskill.train.pairs import build_from_config

        tokenizer = None
        if model_path and Path(model_path).is_dir():
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path)
        examples, stats = build_from_config(table, cfg, tokenizer)
        info["pairs"] = len(examples)
        info["pair_report"] = stats.report()
    n = info["pairs"]
    steps = count_steps(n, cfg, world) if n else (cfg.max_steps if cfg.max_steps > 0 else None)
    info["steps"] = steps
    info["warmup_steps"] = cfg.get_warmup_steps(steps) if steps else None
    from selskill.train.lora import describe, peft_config

    info["peft"] = peft_config(cfg)  # builds peft's LoraConfig: its own checks run here too

    out(
        f"dry run: {run.exp} round {run.round} -> {StageDir.of(run.runs_dir, run.exp, run.round, 'train').path}"
    )
    out(f"  policy: {info['policy']}")
    if "accelerate" in info:
        a = info["accelerate"]
        out(
            f"  launch: {a['config']} ({a['distributed_type']}, {a['num_processes']} processes, "
            f"zero stage {a['zero_stage']}, mixed precision {a['mixed_precision']})"
        )
    out(
        f"  effective batch size: {eff} = {cfg.per_device_train_batch_size} per device x "
        f"{cfg.gradient_accumulation_steps} accumulation x {world} processes"
    )
    out(
        f"  loss: {'+'.join(cfg.loss_type)} beta={cfg.beta}, lr={cfg.learning_rate} {cfg.lr_scheduler_type.value}, "
        f"warmup {cfg.warmup_steps}, epochs {cfg.num_train_epochs}, max_length {cfg.max_length}, "
        f"pairs {cfg.train_pair_kinds}, window n={cfg.train_window_n}, bf16 {cfg.bf16}"
        + (
            " (not supported on this machine: checked when training)"
            if getattr(cfg, "bf16_deferred", False)
            else ""
        )
        + f", gradient checkpointing {cfg.gradient_checkpointing}, precompute_ref_log_probs {cfg.precompute_ref_log_probs}"
        + f", prefix sharing {cfg.train_prefix_sharing}"
    )
    out(f"  peft: {describe(info['peft'])}")
    if n is None:
        examples = ", ".join(f"{p} pairs -> {count_steps(p, cfg, world)}" for p in (500, 2000, 10000))
        why = (
            f"the label stage is not complete: {info['label_problem']}"
            if "label_problem" in info
            else (f"no shards at {label.shards} yet")
        )
        out(f"  pairs: {why}; steps: {examples}")
    else:
        out("  " + info["pair_report"].replace("\n", "\n  "))
        out(f"  steps: {steps} (warmup {info['warmup_steps']})")
    return info


# --- entry points ---------------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None = None):
    """(RunConfig, PolicyConfig, TrainConfig) of a recipe plus command-line overrides.

    Only the sections training reads are built: the other sections' keys are accepted
    unchecked, so training loads none of the stage, environment or init code.
    """
    from selskill.config import PolicyConfig, RunConfig, parse_sections
    from selskill.config.train import TrainConfig

    init_cpu_deepspeed()  # before the configs: TrainingArguments sets up the distributed state
    return parse_sections(argv, (RunConfig, PolicyConfig, TrainConfig))


def main(argv: Sequence[str] | None = None) -> int:
    """Train (or dry-run) in this process; under `accelerate launch`, in every process.
    An error ends it with its one line, as every other entry point (`selskill.errors`)."""
    from selskill.errors import run_main

    def train() -> int:
        run, policy, cfg = parse(argv)
        if cfg.dry_run:
            dry_run(run, policy, cfg)
        else:
            run_train(run, policy, cfg)
        return 0

    return run_main(train)


def launch(argv: Sequence[str]) -> int:
    """`selskill train`: relaunch under the recipe's accelerate config, or train here when none is set."""
    argv = list(argv)
    return launch_parsed(*parse(argv), argv)


def launch_parsed(run, policy, cfg, argv: Sequence[str] | None) -> int:
    """`launch` on configs already parsed (a round's train stage).

    `argv` is the command line they were parsed from: the processes `accelerate launch`
    starts must build their configs themselves, after the distributed state exists.
    """
    if cfg.dry_run or not cfg.train_accelerate_config or _under_launcher():
        if cfg.dry_run:
            dry_run(run, policy, cfg)
            return 0
        run_train(run, policy, cfg)
        return 0
    if argv is None:
        raise ValueError(
            "train_accelerate_config relaunches the train stage from the recipe's command line, and this recipe "
            "was built in code: build it with load_recipe([...])"
        )
    argv = list(argv)
    read_accelerate_config(cfg.train_accelerate_config)
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        cfg.train_accelerate_config,
        "-m",
        "selskill.train.run",
        *argv,
    ]
    logger.info(f"selskill train: {shlex.join(cmd)}")
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
