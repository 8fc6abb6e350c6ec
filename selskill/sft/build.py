"""What both offline init builders share: TRL SFT on demonstrations, and the build's contract.

Training is TRL's `SFTTrainer` on demonstrations tokenized by the chat template
(`sft_dataset`: input ids + a loss mask), through the train stage's SFT (`selskill.train.sft`,
which also trains a round's wins). Which tokens carry the loss is the mask's
business: the chat template's assistant mask (the decisions and `<|im_end|>`), or every
token (a builder's first phase), minus each `Demo.untrained_turns` turn (injected wrong
moves are context, never targets). A template without `{% generation %}` markers (most
pretrained chat models') has no assistant mask: its rows are the tokens the rounds feed the
policy (`selskill.agent.chat_tokens.ChatTokens`: the opening, then each decision and its
end-of-turn token, then each later message's segment), so the decisions are known token by
token. bf16/fp16 and gradient checkpointing are off unless a caller turns them on (the CPU
builds never do).

The contract (`reuse_or_start`, `save_init_policy`): a build writes its model to
`<stage>/model`, then `init_manifest.json` (settings, demo statistics, loss curve,
timings), then `COMPLETED`. A second call with the same settings finds both and returns
at once; a call with other settings refuses to overwrite unless `redo=True`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from selskill.agent.listings import DecisionListings
from selskill.config.init import InitTraining, SftSchedule
from selskill.data.inputs import changed_settings
from selskill.data.removal import finish_removals, remove_outputs, replace_output
from selskill.policy.bootstrap import build_model
from selskill.sft.demos import Demo, DemoPrompts, DemoReport
from selskill.skills import SkillLibrary

COMPLETED = "COMPLETED"
MANIFEST = "init_manifest.json"


# --- SFT --------------------------------------------------------------------------------


def has_assistant_mask(tokenizer) -> bool:
    """Whether the tokenizer's chat template marks assistant turns (`{% generation %}`), which
    `return_assistant_tokens_mask` needs; without them the rows are built turn by turn (`turn_tokens`)."""
    from trl.chat_template_utils import has_generation_markers

    template = tokenizer.chat_template
    if not template:
        raise ValueError(
            f"the tokenizer of {getattr(tokenizer, 'name_or_path', '') or 'the model'} has no chat template: "
            "an init SFT trains on chat messages; use a chat (instruct) model, or give its tokenizer a chat_template"
        )
    return has_generation_markers(template)


def turn_tokens(chat, messages: list[dict]) -> tuple[list[int], list[int]]:
    """(input ids, assistant mask) of `messages` as the rounds feed them to the policy (`chat`, a
    `ChatTokens`): the opening up to the first generation prompt, then each decision's tokens and the
    end-of-turn token (the mask's ones), each later message's segment between them. Ends with the last
    decision: what follows it trains nothing."""
    roles = [m["role"] for m in messages]
    if "assistant" not in roles:
        raise ValueError("a demonstration without an assistant turn has nothing to train")
    first = roles.index("assistant")
    last = len(roles) - 1 - roles[::-1].index("assistant")
    ids = chat.opening(messages[:first])
    mask = [0] * len(ids)
    for i in range(first, last + 1):
        m = messages[i]
        if (m["role"] == "assistant") == (roles[i - 1] == "assistant"):
            raise ValueError(
                f"message {i} ({m['role']}) follows a {roles[i - 1]} message: the rounds alternate a decision "
                "and one reply"
            )
        part = (
            chat.encode(m["content"]) + [chat.end_of_turn_id] if m["role"] == "assistant" else chat.segment(m)
        )
        ids += part
        mask += [int(m["role"] == "assistant")] * len(part)
    return ids, mask


def _rendered(tokenizer, messages: list[dict], chat_template_kwargs: dict | None, chat=None):
    """(input ids, assistant mask) of `messages`: the template's own mask where it marks assistant turns,
    else `turn_tokens` (`chat`: the `ChatTokens` to build them with)."""
    if chat is None:
        enc = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True, **(chat_template_kwargs or {}))  # fmt: skip
        return list(enc["input_ids"]), list(enc["assistant_masks"])
    return turn_tokens(chat, messages)


def _chat_tokens(tokenizer, chat_template_kwargs: dict | None):
    """The `ChatTokens` rows are built with, or None where the template marks assistant turns itself."""
    if has_assistant_mask(tokenizer):
        return None
    from selskill.agent.chat_tokens import ChatTokens

    return ChatTokens(tokenizer, chat_template_kwargs)


def demo_token_lengths(tokenizer, demos: list[Demo], chat_template_kwargs: dict | None = None) -> list[int]:
    chat = _chat_tokens(tokenizer, chat_template_kwargs)
    if chat is not None:
        return [len(turn_tokens(chat, d.messages)[0]) for d in demos]
    return [len(tokenizer.apply_chat_template(d.messages, tokenize=True, return_dict=True,
                                              **(chat_template_kwargs or {}))["input_ids"])
            for d in demos]  # fmt: skip


def sft_dataset(
    demos: list[Demo], tokenizer, drop_system: bool = False, assistant_only: bool = True,
    chat_template_kwargs: dict | None = None,
):  # fmt: skip
    """Tokenized rows (`input_ids`, `assistant_masks`) that TRL's SFTTrainer trains as they are.

    The mask is the chat template's assistant mask (`assistant_only`; `turn_tokens` where the
    template marks no assistant turn) or all ones, minus every `Demo.untrained_turns` assistant
    turn (injected mistakes: context, not targets). `drop_system` leaves out the system prompt
    (phase 1: it is the same in every demonstration, a large share of its tokens, and teaches
    nothing about the game). `chat_template_kwargs`: the rounds' (`enable_thinking`).
    """
    from selskill.train.sft import rows_dataset

    chat = _chat_tokens(tokenizer, chat_template_kwargs)
    rows = []
    for d in demos:
        messages = [m for m in d.messages if not (drop_system and m["role"] == "system")]
        ids, turn_mask = _rendered(tokenizer, messages, chat_template_kwargs, chat)
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
    return rows_dataset(rows)


def init_device() -> str:
    """Where the init build trains and plays its DAgger episodes: the GPU when there is one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def sft_config(
    output_dir: str | Path,
    schedule: SftSchedule,
    *,
    epochs: float,
    seed: int,
    progress: bool = True,
    use_cpu: bool | None = None,
    save_steps: int = 0,
    bf16: bool = False,
    gradient_checkpointing: bool = False,
):
    """TRL SFT arguments of one phase (`epochs` of `schedule`) for the CPU-friendly init training.

    Which tokens carry the loss is decided by `sft_dataset`'s `assistant_masks` column (TRL
    builds the labels from it), so TRL's own `assistant_only_loss` stays off. `save_steps` > 0
    saves a checkpoint every so many steps into `output_dir` (a killed SFT resumes from it);
    `bf16` and `gradient_checkpointing` are for a pretrained model on a GPU.
    """
    from trl import SFTConfig

    if use_cpu is None:
        use_cpu = init_device() == "cpu"
    return SFTConfig(
        output_dir=str(output_dir),
        num_train_epochs=epochs,
        learning_rate=schedule.lr,
        lr_scheduler_type="cosine",
        warmup_steps=schedule.warmup_ratio,
        weight_decay=0.0,
        per_device_train_batch_size=schedule.batch_size,
        gradient_accumulation_steps=1,
        max_length=schedule.max_length,
        assistant_only_loss=False,
        packing=False,
        # similar lengths in one batch: less padding, which is pure waste on a CPU
        train_sampling_strategy="group_by_length",
        bf16=bf16,
        fp16=False,
        gradient_checkpointing=gradient_checkpointing,
        use_cpu=use_cpu,
        seed=seed,
        data_seed=seed,
        logging_steps=schedule.logging_steps,
        save_strategy="steps" if save_steps > 0 else "no",
        save_steps=save_steps if save_steps > 0 else 500,
        save_total_limit=2,  # the newest and the one before it: a save cut short leaves one to resume
        report_to="none",
        disable_tqdm=not progress,
        dataloader_num_workers=0,
    )


def sft_train(
    model, tokenizer, demos: list[Demo], args, drop_system: bool = False, assistant_only: bool = True,
    *, chat_template_kwargs: dict | None = None, peft_config=None, resume_from_checkpoint=None,
    callbacks=None,
) -> tuple[object, dict]:  # fmt: skip
    """SFT `model` on `demos`; returns the trainer and training stats (loss curve, tokens/s). The training is
    the train stage's own SFT (`selskill.train.sft.fit`, which `train_objective: sft_wins` runs too).

    `peft_config`: a LoRA adapter (TRL wraps the model in it); `resume_from_checkpoint`: a
    checkpoint of this same SFT under `args.output_dir` to continue from; `callbacks`: the
    Trainer's, added to its own."""
    from selskill.train.sft import fit

    dataset = sft_dataset(demos, tokenizer, drop_system=drop_system, assistant_only=assistant_only,
                          chat_template_kwargs=chat_template_kwargs)  # fmt: skip
    return fit(
        model, tokenizer, dataset, args,
        resume_from_checkpoint=str(resume_from_checkpoint) if resume_from_checkpoint else None,
        peft_config=peft_config, callbacks=callbacks,
    )  # fmt: skip


def train_init_model(
    tokenizer, demos: list[Demo], training: InitTraining, work: Path, *, seed: int, progress: bool,
    drop_system: bool,
) -> tuple[object, dict]:  # fmt: skip
    """A fresh model of `training.arch`, SFT'd in the schedule's two phases: `pretrain_epochs` with
    every token in the loss (`drop_system`: without the system prompt), then `epochs` on the
    assistant tokens. Returns the model and each phase's stats (None for a skipped phase 1)."""
    sft = training.sft
    model = build_model(tokenizer, training.arch, seed=seed)
    stats: dict = {"pretrain": None, "sft": None}
    if sft.pretrain_epochs > 0:
        args = sft_config(work / "pretrain", sft, epochs=sft.pretrain_epochs, seed=seed, progress=progress)
        trainer, stats["pretrain"] = sft_train(
            model, tokenizer, demos, args, drop_system=drop_system, assistant_only=False
        )
        model = trainer.model
    args = sft_config(work / "sft", sft, epochs=sft.epochs, seed=seed, progress=progress)
    trainer, stats["sft"] = sft_train(model, tokenizer, demos, args)
    return trainer.model, stats


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


def training_record(training: InitTraining) -> dict:
    """The manifest keys of `training` (top-level beside the build's others): the vocabulary, the
    model shape and the SFT schedule but its logging and checkpoint intervals, which change no weight."""
    sft = dataclasses.asdict(training.sft)
    del sft["logging_steps"], sft["save_steps"]
    return {"vocab_size": training.vocab_size, "arch": training.arch, **sft}


def build_listings(settings: dict, own: SkillLibrary, prompts: DemoPrompts) -> DecisionListings:
    """The build's listing rules (the prompts' library, default `own`, and retriever), recorded in
    `settings` where they are not `own` all listed: builds without retrieval keep their settings and
    stay reusable."""
    listings = prompts.listings(own)
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


@contextmanager
def timed(timings: dict, key: str) -> Iterator[None]:
    """Record the block's wall time in `timings[key]` (seconds, one decimal): the manifest's timings."""
    start = time.perf_counter()
    yield
    timings[key] = round(time.perf_counter() - start, 1)


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
    finish_removals(stage_dir, lambda line: print(f"init: {line}", flush=True))
    return False


@dataclass
class TrainedDemos:
    """The demonstrations a build trains on: `report`'s, but those longer than the SFT's
    `max_length` tokens (dropped, not truncated: a truncated demo teaches an unfinished episode)."""

    report: DemoReport
    kept: list[Demo]
    lengths: list[int]  # token lengths of `kept`

    @classmethod
    def of(
        cls, report: DemoReport, tokenizer, max_length: int, chat_template_kwargs: dict | None = None
    ) -> TrainedDemos:
        return cls(report, *fitting(tokenizer, report.demos, max_length, chat_template_kwargs))

    @property
    def too_long(self) -> int:
        return len(self.report.demos) - len(self.kept)


def fitting(
    tokenizer, demos: list[Demo], max_length: int, chat_template_kwargs: dict | None = None
) -> tuple[list[Demo], list[int]]:
    """The demonstrations at most `max_length` tokens long, and their lengths."""
    lengths = demo_token_lengths(tokenizer, demos, chat_template_kwargs)
    kept = [(d, n) for d, n in zip(demos, lengths, strict=True) if n <= max_length]
    return [d for d, _ in kept], [n for _, n in kept]


def save_init_policy(
    out_dir: Path, model, tokenizer, *, work: Path, demos: TrainedDemos, settings: dict, train: dict,
    timings: dict, t_all: float, extra: dict | None = None,
) -> Path:  # fmt: skip
    """Model (tmp + rename), then the manifest (`extra`: more keys of it), then COMPLETED: a crash
    leaves the init incomplete."""
    stage_dir = out_dir.parent
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    remove_outputs([tmp], "init")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    replace_output(tmp, out_dir, "init")
    remove_outputs([work], "init")
    timings["total_seconds"] = round(time.perf_counter() - t_all, 1)

    stats = demos.report.stats()
    stats["dropped"]["too_long"] = demos.too_long
    lengths = demos.lengths
    manifest = {
        "settings": settings,
        "model_dir": str(out_dir),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
        "demos": stats,
        "demo_tokens": {
            "mean": round(sum(lengths) / max(1, len(lengths)), 1),
            "max": max(lengths, default=0),
            "min": min(lengths, default=0),
            "total": sum(lengths),
        },
        "train": train,
        "timings": timings,
        "task_ids": [d.task_id for d in demos.kept],
        "demo_task_types": dict(Counter(d.task_type for d in demos.kept)),
        **(extra or {}),
    }
    (stage_dir / (MANIFEST + ".tmp")).write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(stage_dir / (MANIFEST + ".tmp"), stage_dir / MANIFEST)
    (stage_dir / COMPLETED).write_text(json.dumps({"seconds": timings["total_seconds"]}) + "\n")
    return out_dir
