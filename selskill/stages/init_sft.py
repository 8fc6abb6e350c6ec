"""The init stage's SFT of a given chat model (`init_sft`): round 1's starting policy for any model.

The paper's policy, and every agent-DPO recipe, starts from a model fine-tuned on expert
trajectories; a pretrained chat model used as it is rarely wins a household, so its round finds
no pair to train on. With `model_name_or_path` and `init_sft: true` the init stage fine-tunes
that model on the benchmark's own demonstrations (the plugin's `init_demos`: the ones its
offline init trains on, in the rounds' prompts) and writes it where the offline init goes,
`runs/<exp>/round_0/train/model`; round 0's eval and round 1 then take it as they take the
built init (`selskill.data.layout.resolve_round_policy`).

The SFT is the offline build's (`selskill.sft.build`: `sft_config`, `sft_train`, `TrainedDemos`)
with the model's own tokenizer and chat template: only the assistant tokens are trained, the
decisions and their end-of-turn token, as the rounds tokenize them (a template without
generation markers is tokenized turn by turn, `selskill.sft.build.turn_tokens`). The train
section's `use_peft`/`lora_*` keys train a LoRA adapter instead of every weight (`adapter/`
beside `model/`, which holds the base with it merged in, as a LoRA round writes), and its
`model_init_kwargs`, `bf16` and `gradient_checkpointing` load and run the model as the train
stage does.

The contract is the offline init's (`reuse_or_start`, `save_init_policy`): the settings (the
model's fingerprint, the demonstrations' settings, the schedule, LoRA, the seed) are recorded in
`init_manifest.json`; a complete init with the same settings is reused, one with other settings
is refused naming them unless `redo`. The SFT checkpoints every `init_save_steps` steps into
`round_0/train/sft/`, each recording the settings (`selskill.train.checkpoints`: the train
stage's own checks); a rerun after a kill resumes the newest complete checkpoint of the same
settings, sets a half-written one aside, and refuses one of other settings unless `redo`.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from pathlib import Path

from selskill.config.init import SftSchedule
from selskill.data.inputs import changed_settings, config_values, fingerprint, policy_fingerprint
from selskill.sft.build import (
    TrainedDemos,
    has_assistant_mask,
    init_device,
    reuse_or_start,
    save_init_policy,
    settings_record,
    sft_config,
    sft_train,
    timed,
)
from selskill.sft.demos import DemoSource

logger = logging.getLogger(__name__)

VERSION = 1  # bump when a change alters what the SFT computes (a complete init is then refused)
WORK = "sft"  # round_0/train/sft: the SFT's checkpoints, removed once the model is saved
ADAPTER = "adapter"
LORA_KEYS = ("use_rslora", "use_dora")  # besides `lora_*`: the train section's keys that shape the adapter


def sft_settings(
    base: str, source: DemoSource, schedule: SftSchedule, *, seed: int, lora: dict | None,
    chat_template_kwargs: dict | None, bf16: bool, model_init_kwargs: dict | None, runs_dir: str | Path,
) -> dict:  # fmt: skip
    """What the fine-tuned model depends on: the given model (by content), the demonstrations' settings,
    the schedule (not its logging and checkpoint intervals), LoRA, the seed, how the model is loaded
    and run. Equal settings reuse a complete init and resume a checkpoint; others are refused."""
    return settings_record(
        version=VERSION,
        init_sft=True,
        base=policy_fingerprint(base, runs_dir),
        demos=source.settings,
        sft={
            "epochs": schedule.epochs,
            "lr": schedule.lr,
            "warmup_ratio": schedule.warmup_ratio,
            "batch_size": schedule.batch_size,
            "max_length": schedule.max_length,
        },
        seed=seed,
        lora=lora,
        chat_template_kwargs=chat_template_kwargs or {},
        bf16=bf16,
        model_init_kwargs=model_init_kwargs or {},
    )


def _resume_point(work: Path, settings: dict) -> tuple[Path | None, int]:
    """The checkpoint the SFT resumes (None: from the start) and its step. One of other settings is
    refused before anything is moved; the newer half-written ones are then set aside."""
    from selskill.train.checkpoints import INPUTS_FILE, resumable_checkpoint, set_aside

    last, broken = resumable_checkpoint(work)
    if last is not None:
        own = json.loads((last / INPUTS_FILE).read_text()).get("inputs") or {}
        differ = changed_settings(own, settings)
        if differ:
            raise FileExistsError(
                f"{last} is a checkpoint of an init SFT with other settings: {'; '.join(differ)} (checkpoint -> "
                f"asked; {last / INPUTS_FILE}). Pass the settings it was trained with to resume it, or --redo to "
                "start the SFT over (its checkpoints are deleted)"
            )
    for ckpt, problem in broken:
        logger.warning(f"init: skipping {ckpt}: {problem}; moved it to {set_aside(ckpt)}")
    if last is None:
        return None, 0
    logger.info(f"init: resuming the SFT from {last}")
    return last, json.loads((last / "trainer_state.json").read_text())["global_step"]


def _save_adapter(model, stage_dir: Path) -> None:
    """`adapter/` (the LoRA adapter alone, for serving or sharing), written aside and renamed once whole."""
    tmp = stage_dir / f"{ADAPTER}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    shutil.rmtree(stage_dir / ADAPTER, ignore_errors=True)
    tmp.rename(stage_dir / ADAPTER)


def build_sft_init(
    out_dir: str | Path, *, base: str, source: DemoSource, schedule: SftSchedule, seed: int,
    peft=None, lora: dict | None = None, chat_template_kwargs: dict | None = None, bf16: bool = False,
    gradient_checkpointing: bool = False, model_init_kwargs: dict | None = None,
    trust_remote_code: bool = False, progress: bool = True, redo: bool = False,
    runs_dir: str | Path | None = None,
) -> Path:  # fmt: skip
    """Fine-tune `base` (a model directory or hub id) on `source`'s demonstrations into `out_dir` (or reuse
    it); returns `out_dir`. `peft`: a LoRA config (`lora`: the recipe keys it came from, recorded);
    `chat_template_kwargs`: the rounds' (`enable_thinking`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selskill.train.checkpoints import record_inputs

    out_dir = Path(out_dir)
    stage_dir, work = out_dir.parent, out_dir.parent / WORK
    # the hashes of the base's files are cached under runs_dir (the stage's folder where none is given)
    settings = sft_settings(base, source, schedule, seed=seed, lora=lora, bf16=bf16,
                            chat_template_kwargs=chat_template_kwargs, model_init_kwargs=model_init_kwargs,
                            runs_dir=runs_dir if runs_dir is not None else stage_dir)  # fmt: skip
    if reuse_or_start(out_dir, stage_dir, settings, redo):
        logger.info(f"init: {out_dir} is complete (the SFT of {base} with these settings): reused")
        return out_dir
    if redo:
        shutil.rmtree(work, ignore_errors=True)
    checkpoint, step = _resume_point(work, settings)
    timings: dict[str, float] = {}
    t_all = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(base, trust_remote_code=trust_remote_code)
    has_assistant_mask(tokenizer)  # a model without a chat template fails here, before the demonstrations
    report = source.play(progress, timings)
    trained = TrainedDemos.of(report, tokenizer, schedule.max_length, chat_template_kwargs)
    if not trained.kept:
        raise ValueError(
            f"every demonstration is longer than init_max_length={schedule.max_length} tokens of {base}'s "
            "tokenizer: raise init_max_length"
        )
    logger.info(
        f"init: fine-tuning {base} on {len(trained.kept)} demonstrations ({trained.too_long} longer than "
        f"init_max_length dropped){', LoRA' if peft is not None else ''} -> {out_dir}"
    )
    with timed(timings, "train_seconds"):
        model = AutoModelForCausalLM.from_pretrained(
            base, trust_remote_code=trust_remote_code, **(model_init_kwargs or {})
        )
        args = sft_config(work, schedule, epochs=schedule.epochs, seed=seed, progress=progress,
                          save_steps=schedule.save_steps, bf16=bf16, gradient_checkpointing=gradient_checkpointing)  # fmt: skip
        recorded = {"fingerprint": fingerprint(settings), "inputs": settings}
        trainer, stats = sft_train(
            model, tokenizer, trained.kept, args, chat_template_kwargs=chat_template_kwargs, peft_config=peft,
            resume_from_checkpoint=checkpoint, callbacks=[record_inputs(recorded)],
        )  # fmt: skip
    if not math.isfinite(stats["final_train_loss"]):
        raise RuntimeError(
            f"init: the SFT of {base} ended with loss {stats['final_train_loss']}: it diverged; lower init_lr "
            "and rerun with --redo"
        )
    stats["resumed_from"], stats["resumed_at_step"] = (str(checkpoint) if checkpoint else None), step
    model = trainer.model
    if peft is not None:
        _save_adapter(model, stage_dir)
        model = model.merge_and_unload()
    extra = {
        "base": str(base),
        "lora": lora,
        "adapter": str(stage_dir / ADAPTER) if peft is not None else None,
    }
    return save_init_policy(out_dir, model, tokenizer, work=work, demos=trained, settings=settings, train=stats,
                            timings=timings, t_all=t_all, extra=extra)  # fmt: skip


def lora_keys(train) -> dict | None:
    """The train section's keys that shape a LoRA adapter (None without `use_peft`): what the init records."""
    if not train.use_peft:
        return None
    values = config_values([train])
    return {k: v for k, v in sorted(values.items()) if k.startswith("lora_") or k in LORA_KEYS}


def sft_from_recipe(recipe, out: Path, base: str, source: DemoSource) -> Path:
    """The SFT init the recipe asks for: `base` (model_name_or_path, a GGUF source as converted) on
    `source`, with the init section's schedule, the train section's LoRA, loading and precision keys,
    and the rollout's chat template arguments; `--redo` trains it again."""
    from selskill.registry import benchmark
    from selskill.train.lora import peft_config

    train = recipe.train
    spec = benchmark(recipe.run.benchmark)
    return build_sft_init(
        out,
        base=base,
        source=source,
        schedule=recipe.init.training().sft,
        seed=recipe.seed,
        peft=peft_config(train),
        lora=lora_keys(train),
        chat_template_kwargs=recipe.rollout.chat_template_kwargs(spec.states_thinking),
        bf16=bool(train.bf16 and init_device() == "cuda"),  # the train section's, where a GPU trains
        gradient_checkpointing=bool(train.gradient_checkpointing),
        model_init_kwargs=dict(train.model_init_kwargs or {}),
        trust_remote_code=recipe.policy.trust_remote_code,
        redo=recipe.run.redo,
        runs_dir=recipe.run.runs_dir,
    )
