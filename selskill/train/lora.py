"""LoRA in the train stage: which adapter the recipe asks for, and the merged model a round hands on.

The adapter comes from the train section's `use_peft`/`lora_*` keys through `trl.get_peft_config`
(the section is a TRL `ModelConfig`), and TRL's DPOTrainer wraps the policy in it; with no
`ref_model`, TRL computes the reference with the adapter disabled, so the base is held once.

A LoRA round writes `train/adapter/` (what the Trainer saved) and `train/model/`, the base with
the adapter merged in. The next round starts from `model/`: its sample, fork and eval stages load
it with transformers or vLLM as any checkpoint, and its train stage puts a fresh adapter on it, so
that round's reference (adapter disabled) is this round's policy, the one that sampled its pairs,
as with a full fine-tune. Chaining adapters instead would make every stage of every round load
the first base plus a stack of adapters.

The merge reloads the base from `base` on the CPU rather than merging the trained model in
place: under ZeRO-3 each process holds a shard of the weights, while the saved adapter is whole
on every launch, and the merged weights are then exactly what loading `adapter/` on the base
gives anyone else.
"""

from __future__ import annotations

from pathlib import Path

ADAPTER_DIR = "adapter"


def peft_config(cfg):
    """The train section's LoRA config (a `peft.LoraConfig`), or None without `use_peft`."""
    from trl import get_peft_config

    return get_peft_config(cfg)


def describe(peft, reference: bool = True) -> str:
    """One line for the dry run and the log (`reference`: the objective has a reference model, as DPO does)."""
    if peft is None:
        return "off (full fine-tune)"
    targets = peft.target_modules
    targets = ",".join(sorted(targets)) if isinstance(targets, (set, list, tuple)) else targets
    extras = [name for name in ("use_rslora", "use_dora") if getattr(peft, name)]
    return (
        f"LoRA r={peft.r} alpha={peft.lora_alpha} dropout={peft.lora_dropout} targets={targets or 'default'}"
        + (f" ({', '.join(extras)})" if extras else "")
        + f"{', modules_to_save=' + ','.join(peft.modules_to_save) if peft.modules_to_save else ''}; "
        + ("the reference is the starting policy with the adapter disabled; " if reference else "")
        + "model/ gets the merged weights"
    )


def merge_adapter(
    base: str, adapter_dir: Path, out_dir: Path, dtype, trust_remote_code: bool = False
) -> None:
    """Save `base` + the adapter at `adapter_dir`, merged, as a plain checkpoint at `out_dir` (no tokenizer).

    Run by one process once training is over. Under ZeRO-3 it first turns transformers' ZeRO-3
    model init off for the rest of the process: that init partitions every model loaded across all
    processes, and would wait forever for the ones not loading it.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from transformers.integrations import is_deepspeed_zero3_enabled, unset_hf_deepspeed_config

    if is_deepspeed_zero3_enabled():
        unset_hf_deepspeed_config()

    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype, trust_remote_code=trust_remote_code)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(str(out_dir))
