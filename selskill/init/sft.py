"""What both offline init builders share: TRL SFT on demonstrations, and the build's contract.

Training is TRL's `SFTTrainer` on demonstrations tokenized by the chat template
(`sft_dataset`: input ids + a loss mask). Which tokens carry the loss is the mask's
business: the chat template's assistant mask (the decisions and `<|im_end|>`), or every
token (a builder's first phase), minus each `Demo.untrained_turns` turn (injected wrong
moves are context, never targets). bf16/fp16 and gradient checkpointing are off (CPU).

The contract (`reuse_or_start`, `save_init_policy`): a build writes its model to
`<stage>/model`, then `init_manifest.json` (settings, demo statistics, loss curve,
timings), then `COMPLETED`. A second call with the same settings finds both and returns
at once; a call with other settings refuses to overwrite unless `redo=True`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path

from selskill.agent.listings import DecisionListings
from selskill.data.inputs import changed_settings
from selskill.init.demos import Demo
from selskill.skills import SkillLibrary

COMPLETED = "COMPLETED"
MANIFEST = "init_manifest.json"


# --- SFT --------------------------------------------------------------------------------


def demo_token_lengths(tokenizer, demos: list[Demo]) -> list[int]:
    return [len(tokenizer.apply_chat_template(d.messages, tokenize=True, return_dict=True)["input_ids"])
            for d in demos]  # fmt: skip


def sft_dataset(demos: list[Demo], tokenizer, drop_system: bool = False, assistant_only: bool = True):
    """Tokenized rows (`input_ids`, `assistant_masks`) that TRL's SFTTrainer trains as they are.

    The mask is the chat template's assistant mask (`assistant_only`) or all ones, minus
    every `Demo.untrained_turns` assistant turn (injected mistakes: context, not targets).
    `drop_system` leaves out the system prompt (phase 1: it is the same in every
    demonstration, a large share of its tokens, and teaches nothing about the game).
    """
    from datasets import Dataset

    rows = []
    for d in demos:
        messages = [m for m in d.messages if not (drop_system and m["role"] == "system")]
        enc = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ids, turn_mask = list(enc["input_ids"]), list(enc["assistant_masks"])
        mask = list(turn_mask) if assistant_only else [1] * len(ids)
        skip = set(d.untrained_turns)
        turn, inside = -1, False
        for i, bit in enumerate(turn_mask):
            if bit and not inside:
                turn += 1
            inside = bool(bit)
            if bit and turn in skip:
                mask[i] = 0
        if skip and turn + 1 != sum(1 for m in messages if m["role"] == "assistant"):
            raise ValueError(f"{d.task_id}: the chat template's assistant mask does not match the turns")
        rows.append({"input_ids": ids, "assistant_masks": mask})
    return Dataset.from_list(rows)


def init_device() -> str:
    """Where the init build trains and plays its DAgger episodes: the GPU when there is one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def sft_config(
    output_dir: str | Path,
    *,
    seed: int,
    epochs: float,
    lr: float,
    batch_size: int,
    max_length: int,
    warmup_ratio: float = 0.05,
    logging_steps: int = 10,
    report_to: str | list[str] = "none",
    progress: bool = True,
    use_cpu: bool | None = None,
):
    """TRL SFT arguments for the CPU-friendly init training.

    Which tokens carry the loss is decided by `sft_dataset`'s `assistant_masks` column (TRL
    builds the labels from it), so TRL's own `assistant_only_loss` stays off.
    """
    from trl import SFTConfig

    if use_cpu is None:
        use_cpu = init_device() == "cpu"
    return SFTConfig(
        output_dir=str(output_dir),
        num_train_epochs=epochs,
        learning_rate=lr,
        lr_scheduler_type="cosine",
        warmup_steps=warmup_ratio,
        weight_decay=0.0,
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=1,
        max_length=max_length,
        assistant_only_loss=False,
        packing=False,
        # similar lengths in one batch: less padding, which is pure waste on a CPU
        train_sampling_strategy="group_by_length",
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=use_cpu,
        seed=seed,
        data_seed=seed,
        logging_steps=logging_steps,
        save_strategy="no",
        report_to=report_to,
        disable_tqdm=not progress,
        dataloader_num_workers=0,
    )


def sft_train(
    model, tokenizer, demos: list[Demo], args, drop_system: bool = False, assistant_only: bool = True
) -> tuple[object, dict]:
    """SFT `model` on `demos`; returns the trainer and training stats (loss curve, tokens/s)."""
    from trl import SFTTrainer

    dataset = sft_dataset(demos, tokenizer, drop_system=drop_system, assistant_only=assistant_only)
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    n_tokens = sum(len(ids) for ids in trainer.train_dataset["input_ids"])
    n_trained = sum(sum(1 for x in labels if x != -100) for labels in trainer.train_dataset["labels"]) \
        if "labels" in trainer.train_dataset.column_names else None  # fmt: skip
    start = time.perf_counter()
    output = trainer.train()
    seconds = time.perf_counter() - start
    epochs = float(args.num_train_epochs)
    losses = [
        {"step": e["step"], "epoch": round(e.get("epoch", 0.0), 3), "loss": e["loss"]}
        for e in trainer.state.log_history
        if "loss" in e
    ]
    stats = {
        "epochs": epochs,
        "train_seconds": round(seconds, 1),
        "steps": trainer.state.global_step,
        "final_train_loss": output.training_loss,
        "loss_curve": losses,
        "tokens_per_epoch": n_tokens,
        "assistant_tokens_per_epoch": n_trained,
        "tokens_per_second": round(n_tokens * epochs / seconds, 1) if seconds > 0 else None,
    }
    return trainer, stats


# --- the build's contract ------------------------------------------------------------------


def settings_record(**kwargs) -> dict:
    """Build settings as JSON values (dataclasses as dicts, paths as strings): what a manifest records."""
    out = {}
    for key, value in kwargs.items():
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        elif isinstance(value, Path):
            value = str(value)
        out[key] = value
    return json.loads(json.dumps(out, sort_keys=True))


def build_listings(settings: dict, own: SkillLibrary, library, retriever, style: str) -> DecisionListings:
    """The build's listing rules (`library`, default `own`, and `retriever`), recorded in `settings`
    where they are not `own` all listed: builds without retrieval keep their settings and stay reusable."""
    listings = DecisionListings(library or own, retriever, style)
    if listings.mode != "all" or len(listings.library) != len(own):
        ret = listings.retriever
        settings["retrieval"] = settings_record(
            r={
                "library_size": len(listings.library),
                "mode": listings.mode,
                **(ret.config.to_dict() if ret else {}),
            }
        )["r"]
    return listings


def read_manifest(out_dir: str | Path) -> dict | None:
    path = Path(out_dir).parent / MANIFEST
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def is_complete(out_dir: str | Path) -> bool:
    out_dir = Path(out_dir)
    return (out_dir.parent / COMPLETED).is_file() and (out_dir / "config.json").is_file()


def reuse_or_start(out_dir: Path, stage_dir: Path, settings: dict, redo: bool) -> bool:
    """True when `out_dir` holds a complete init built with `settings` (reuse it); a complete
    init built otherwise is refused naming what differs; else the stage is reset for a build."""
    if not redo and is_complete(out_dir):
        manifest = read_manifest(out_dir) or {}
        if manifest.get("settings") == settings:
            return True
        differ = changed_settings(manifest.get("settings") or {}, settings)
        raise FileExistsError(
            f"{out_dir} holds an init policy built with other settings: {'; '.join(differ)} (built -> asked; "
            f"{stage_dir / MANIFEST}). Pass the settings it was built with, --redo to rebuild it, or choose "
            "another experiment"
        )
    (stage_dir / COMPLETED).unlink(missing_ok=True)
    stage_dir.mkdir(parents=True, exist_ok=True)
    return False


def save_init_policy(
    out_dir: Path, model, tokenizer, *, work: Path, report, too_long: int, kept, kept_lengths,
    settings: dict, train: dict, timings: dict, t_all: float,
) -> Path:  # fmt: skip
    """Model (tmp + rename), then the manifest, then COMPLETED: a crash leaves the init incomplete."""
    stage_dir = out_dir.parent
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    shutil.rmtree(work, ignore_errors=True)
    timings["total_seconds"] = round(time.perf_counter() - t_all, 1)

    stats = report.stats()
    stats["dropped"]["too_long"] = too_long
    manifest = {
        "settings": settings,
        "model_dir": str(out_dir),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
        "demos": stats,
        "demo_tokens": {
            "mean": round(sum(kept_lengths) / max(1, len(kept_lengths)), 1),
            "max": max(kept_lengths, default=0),
            "min": min(kept_lengths, default=0),
            "total": sum(kept_lengths),
        },
        "train": train,
        "timings": timings,
        "task_ids": [d.task_id for d in kept],
        "demo_task_types": dict(Counter(d.task_type for d in kept)),
    }
    (stage_dir / (MANIFEST + ".tmp")).write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(stage_dir / (MANIFEST + ".tmp"), stage_dir / MANIFEST)
    (stage_dir / COMPLETED).write_text(json.dumps({"seconds": timings["total_seconds"]}) + "\n")
    return out_dir
