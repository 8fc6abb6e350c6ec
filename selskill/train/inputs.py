"""What a trained model depends on, as the train stage records it in `COMPLETED` and every checkpoint.

The record is a `StageInputs` (`selskill.data.inputs`): the fingerprints of the shards trained on
(the label stage's pairs, or with `train_objective: sft_wins` the sample stage's episodes) and of
the policy, the seed, `CODE_VERSION`, and every train key that changes what training computes,
`train_objective` included (a switch retrains).
A rerun compares its own record with the recorded one: equal, the work is reused; different, it
is refused naming each key that differs (docs/design.md, "The train stage").
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from selskill.data.contract import changed_inputs
from selskill.data.inputs import StageInputs

# the stage each train_objective trains from, and the kind of its rows
UPSTREAM = {"dpo": ("label", "pair"), "sft_wins": ("sample", "rollout")}

CODE_VERSION = 1  # bump when a change alters what training computes (a complete round is then refused)

# Train keys that say where training writes, how it logs, saves, evaluates or reports, and how fast or on
# what it runs, not what it computes (memory and speed knobs change the model only at float rounding, as
# batching does for the episode stages): left out of the recorded inputs, by name or by prefix.
NOT_INPUT_KEYS = frozenset(
    {
        "output_dir",
        "run_name",
        "project",
        "disable_tqdm",
        "push_to_hub",
        "resume_from_checkpoint",
        "overwrite_output_dir",
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


def upstream_of(cfg) -> tuple[str, str]:
    """(the stage the round's training reads, the kind of its rows) for the section's `train_objective`."""
    return UPSTREAM[cfg.train_objective]


def train_inputs(cfg, model_path: str) -> StageInputs:
    """What the trained model depends on: the shards trained on, the policy, the material train keys, the seed
    (TRL's fields that are no train keys are left out: the seed is recorded as such, the others say how it
    reports or what the policy section owns)."""
    keys = {f.name for f in dataclasses.fields(cfg)}
    not_inputs = NOT_INPUT_KEYS | {k for k in keys if k.startswith(NOT_INPUT_PREFIXES)} | cfg._not_recipe_keys
    return StageInputs(
        [cfg],
        cfg.seed,
        CODE_VERSION,
        policy=model_path,
        upstream=(upstream_of(cfg)[0],),
        not_inputs=frozenset(not_inputs),
    )


def refuse_changed(what: str, changes: list[str], recorded_in: Path, fix: str) -> None:
    """Refuse (naming each changed key) work recorded in `recorded_in` with other inputs than this run's."""
    if changes:
        raise changed_inputs(f"train: {what}", changes, recorded_in, fix)
