"""The init section: the offline init policy (round 0) that `selskill init` builds when a recipe
has no model, and the settings objects every builder takes (the tokenizer, the tiny model, the SFT).
With `init_sft` (the policy section's) the init is the recipe's `model_name_or_path` fine-tuned on
the same demonstrations: its SFT reads the schedule keys (`init_epochs`, `init_lr`,
`init_warmup_ratio`, `init_batch_size`, `init_max_length`, `init_logging_steps`,
`init_save_steps`); the tokenizer, model shape and first-phase keys describe a model built from
scratch and are not read.

Each group of `init_*` keys has a settings class here whose fields hold the defaults: the
recipe keys take theirs from it and `InitConfig.training` builds it, so a default is written
once and the recipe still loads none of the training code. A benchmark's own init keys (its
demonstrations) are in its plugin's recipe section.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from selskill.config.checks import check_above, check_at_least, check_share

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


@dataclass
class InitConfig:
    """Recipe keys of the init stage (`init_` prefix: they share one flat recipe with TRL's)."""

    # its heading in `--help`
    _argument_group_name = (
        "init (round 0: the offline init policy, or with init_sft the SFT of model_name_or_path)"
    )

    init_vocab_size: int = field(
        default=InitTraining.vocab_size, metadata={"help": "BPE vocabulary size of the local tokenizer"}
    )
    init_hidden_size: int = field(default=TinyArch.hidden_size, metadata={"help": "model width"})
    init_intermediate_size: int = field(default=TinyArch.intermediate_size, metadata={"help": "MLP width"})
    init_layers: int = field(default=TinyArch.num_hidden_layers, metadata={"help": "transformer layers"})
    init_heads: int = field(default=TinyArch.num_attention_heads, metadata={"help": "attention heads"})
    init_kv_heads: int = field(default=TinyArch.num_key_value_heads, metadata={"help": "key/value heads"})
    init_head_dim: int = field(default=TinyArch.head_dim, metadata={"help": "attention head size"})
    init_pretrain_epochs: float = field(
        default=SftSchedule.pretrain_epochs,
        metadata={
            "help": "first phase: epochs with every token in the loss, no system prompt (0 = skip); the offline "
            "build only (init_sft trains the assistant tokens)"
        },
    )
    init_epochs: float = field(
        default=SftSchedule.epochs, metadata={"help": "second phase: epochs on assistant tokens only"}
    )
    init_lr: float = field(
        default=SftSchedule.lr, metadata={"help": "peak learning rate (AdamW, cosine, warmup)"}
    )
    init_warmup_ratio: float = field(
        default=SftSchedule.warmup_ratio, metadata={"help": "warmup share of the SFT steps"}
    )
    init_batch_size: int = field(
        default=SftSchedule.batch_size, metadata={"help": "demonstrations per optimizer step"}
    )
    init_max_length: int = field(
        default=SftSchedule.max_length, metadata={"help": "longer demonstrations are dropped"}
    )
    init_logging_steps: int = field(
        default=SftSchedule.logging_steps, metadata={"help": "loss is logged every this many steps"}
    )
    init_save_steps: int = field(
        default=SftSchedule.save_steps,
        metadata={
            "help": "init_sft: a checkpoint every this many steps, which a rerun after a kill resumes from "
            "(0 = none; the offline build does not checkpoint)"
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

    # --- the settings object of the keys above: the one place a builder's training settings come from ---

    def training(self) -> InitTraining:
        return InitTraining(
            vocab_size=self.init_vocab_size,
            arch=TinyArch(
                hidden_size=self.init_hidden_size,
                intermediate_size=self.init_intermediate_size,
                num_hidden_layers=self.init_layers,
                num_attention_heads=self.init_heads,
                num_key_value_heads=self.init_kv_heads,
                head_dim=self.init_head_dim,
            ),
            sft=SftSchedule(
                pretrain_epochs=self.init_pretrain_epochs,
                epochs=self.init_epochs,
                lr=self.init_lr,
                warmup_ratio=self.init_warmup_ratio,
                batch_size=self.init_batch_size,
                max_length=self.init_max_length,
                logging_steps=self.init_logging_steps,
                save_steps=self.init_save_steps,
            ),
        )
