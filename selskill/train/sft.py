"""Supervised fine-tuning on token rows with TRL's `SFTTrainer`: the one SFT of selskill.

Two callers hand it rows of `input_ids` and `assistant_masks` (1 = the token carries the
loss; TRL builds the labels from the mask, so its own `assistant_only_loss` stays off): the
init builder (`selskill.sft.build`, demonstrations rendered by the chat template) and the
train stage's `train_objective: sft_wins` (`selskill.train.wins`, a round's winning
episodes as the token ids the policy produced). It lives with training rather than with the
init builder because training may not import the builder's demonstration and environment code
(pyproject.toml's import contracts); the builder imports it from here.
"""

from __future__ import annotations

import time

ROW_COLUMNS = ("input_ids", "assistant_masks")

# DPOConfig keys SFTConfig also has but means something else by: DPO's loss names are not SFT's.
_NOT_SHARED = frozenset({"loss_type"})


def sft_args(cfg, **overrides):
    """TRL's `SFTConfig` holding every key the train section shares with it (TrainingArguments': learning
    rate, epochs, batch, seed, precision, schedule, saving, logging, reporting; and DPOConfig's
    `max_length`, `model_init_kwargs`, padding keys), so that SFT trains with the recipe's settings.

    Built the way TRL's `SFTTrainer` converts plain TrainingArguments (`to_dict`, the `*_token`
    values it hides restored, and the run's seed), but from the shared keys only: the section's DPO, LoRA and `train_*` keys are not
    SFT's. `overrides` are set last.
    """
    import dataclasses

    from trl import SFTConfig

    keys = {f.name for f in dataclasses.fields(SFTConfig) if f.init} - _NOT_SHARED
    values = {k: v for k, v in cfg.to_dict().items() if k in keys}
    values.update({k: getattr(cfg, k) for k in values if k.endswith("_token")})  # to_dict hides them
    # the keys another section owns (`seed`, `trust_remote_code`) are attributes, not fields, of the section
    values.update({k: getattr(cfg, k) for k in keys - set(values) if hasattr(cfg, k)})
    values.update(assistant_only_loss=False, completion_only_loss=None, packing=False)
    values.update(overrides)
    return SFTConfig(**values)


def rows_dataset(rows: list[dict]):
    """The `datasets.Dataset` of token rows that `fit` trains (columns `ROW_COLUMNS`)."""
    from datasets import Dataset

    missing = [c for c in ROW_COLUMNS if rows and c not in rows[0]]
    if missing:
        raise ValueError(f"SFT rows lack the columns {missing}: each row holds {', '.join(ROW_COLUMNS)}")
    return Dataset.from_list([{c: row[c] for c in ROW_COLUMNS} for row in rows])


def fit(model, tokenizer, dataset, args, *, resume_from_checkpoint: str | None = None, **trainer_kwargs):
    """SFT `model` (a model or a path TRL loads with `args.model_init_kwargs`) on `dataset`'s token rows.

    Returns the trainer and the training's stats (loss curve, steps, tokens, tokens/s);
    `trainer_kwargs` go to `SFTTrainer` (`peft_config`, `callbacks`).
    """
    from trl import SFTTrainer

    trainer = SFTTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, **trainer_kwargs
    )
    rows = trainer.train_dataset
    n_tokens = sum(len(ids) for ids in rows["input_ids"])
    n_trained = (
        sum(sum(1 for x in labels if x != -100) for labels in rows["labels"])
        if "labels" in rows.column_names
        else None
    )
    start = time.perf_counter()
    output = trainer.train(resume_from_checkpoint=resume_from_checkpoint)
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
