"""The init section: the offline init policy (round 0) that `selskill init` builds when a recipe
has no model, and the settings objects every builder takes (the tokenizer, the tiny model, the SFT).
With `init_sft` (the policy section's) the init is the recipe's `model_name_or_path` fine-tuned on
the same demonstrations: its SFT reads the schedule keys (`init_epochs`, `init_lr`,
`init_warmup_ratio`, `init_batch_size`, `init_max_length`, `init_logging_steps`,
`init_save_steps`); the tokenizer, model shape and first-phase keys describe a model built from
scratch and are not read.

The settings classes here hold the defaults: each `init_*` key names the settings field it sets
(`selskill.config.keys.KeysOf`) and takes its type and default from it, and `InitConfig.training`
builds them from the keys, so a setting is written once and the recipe still loads none of the
training code. A benchmark's own init keys (its demonstrations) are in its plugin's recipe section.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from selskill.config.checks import check_above, check_at_least, check_share
from selskill.config.keys import KeysOf, recipe_section, settings_of

# --- what every init build trains ------------------------------------------------------------


@dataclass(frozen=True)
class TinyArch:
    """Architecture of the offline policy; defaults are ~3-5M parameters, fast on 2 CPU cores."""

    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 8192
    rope_theta: float = 10000.0


@dataclass(frozen=True)
class SftSchedule:
    """The init's TRL SFT: `pretrain_epochs` with every token in the loss, then `epochs` on the
    assistant tokens, over the same demonstrations (`selskill.sft.build`)."""

    pretrain_epochs: float = 4.0
    epochs: float = 8.0
    lr: float = 4e-3
    warmup_ratio: float = 0.05
    batch_size: int = 2
    max_length: int = 4096  # longer demonstrations are dropped, not truncated
    logging_steps: int = 10
    # the SFT warm start of a given model (`init_sft`) checkpoints every this many steps, and a rerun
    # resumes from the last checkpoint (0: none); the offline build's phases are short and do not
    save_steps: int = 50


@dataclass(frozen=True)
class InitTraining:
    """The tokenizer, model and SFT of a build: what both benchmarks' builders share."""

    vocab_size: int = 2048
    arch: TinyArch = field(default_factory=TinyArch)
    sft: SftSchedule = field(default_factory=SftSchedule)


# --- the recipe section ------------------------------------------------------------------------


@recipe_section
class InitConfig:
    """Recipe keys of the init stage (`init_` prefix: they share one flat recipe with TRL's)."""

    # its heading in `--help`
    _argument_group_name = (
        "init (round 0: the offline init policy, or with init_sft the SFT of model_name_or_path)"
    )

    _training = KeysOf(
        InitTraining, "init_", {"init_vocab_size": "BPE vocabulary size of the local tokenizer"}
    )
    _arch = KeysOf(
        TinyArch,
        "init_",
        {
            "init_hidden_size": "model width",
            "init_intermediate_size": "MLP width",
            "init_layers": "transformer layers",
            "init_heads": "attention heads",
            "init_kv_heads": "key/value heads",
            "init_head_dim": "attention head size",
        },
        renamed={
            "init_layers": "num_hidden_layers",
            "init_heads": "num_attention_heads",
            "init_kv_heads": "num_key_value_heads",
        },
    )
    _sft = KeysOf(
        SftSchedule,
        "init_",
        {
            "init_pretrain_epochs": "first phase: epochs with every token in the loss, no system prompt (0 = skip); "
            "the offline build only (init_sft trains the assistant tokens)",
            "init_epochs": "second phase: epochs on assistant tokens only",
            "init_lr": "peak learning rate (AdamW, cosine, warmup)",
            "init_warmup_ratio": "warmup share of the SFT steps",
            "init_batch_size": "demonstrations per optimizer step",
            "init_max_length": "longer demonstrations are dropped",
            "init_logging_steps": "loss is logged every this many steps",
            "init_save_steps": "init_sft: a checkpoint every this many steps, which a rerun after a kill resumes "
            "from (0 = none; the offline build does not checkpoint)",
        },
    )

    def __post_init__(self):
        check_at_least(
            self,
            1,
            "init_vocab_size",
            "init_hidden_size",
            "init_intermediate_size",
            "init_layers",
            "init_heads",
            "init_kv_heads",
            "init_head_dim",
            "init_batch_size",
            "init_max_length",
            "init_logging_steps",
        )
        check_at_least(self, 0, "init_pretrain_epochs", "init_epochs", "init_save_steps")
        check_share(self, "init_warmup_ratio", why="a share")
        check_above(self, 0, "init_lr", why="a learning rate")

    def training(self) -> InitTraining:
        """The settings object of the keys above: the one place a builder's training settings come from."""
        return settings_of(
            self, InitTraining, arch=settings_of(self, TinyArch), sft=settings_of(self, SftSchedule)
        )
