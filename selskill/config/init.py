"""The init section: the offline init policy (round 0) that `selskill init` builds when a recipe
has no model (`selskill.init`).

The defaults of the `init_demo_*` and `init_bfcl_*` rates are those of `DemoMix` and
`BfclDemoMix` (a test holds them equal); the recipe states them here so that parsing a
recipe loads none of the demonstration code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from selskill.config.checks import bad_value, check_at_least, check_choice
from selskill.config.names import GAME_SIZES, SEARCH_ORDERS
from selskill.config.rollout import MAX_DECISIONS


@dataclass
class InitConfig:
    """Recipe keys of the init stage (`init_` prefix: they share one flat recipe with TRL's)."""

    _argument_group_name = "init (the offline init policy, round 0)"  # its heading in `--help`

    init_games_per_type: int = field(default=40, metadata={"help": "generated train games per task type"})
    init_game_size: str = field(
        default="small", metadata={"help": "generated scene size: tiny, small or real"}
    )
    init_max_decisions: int = field(
        default=MAX_DECISIONS,
        metadata={
            "help": "demonstrations not won within this many decisions (assistant turns, as max_decisions "
            "counts them) are dropped; DAgger's policy episodes play under it, and its expert gets as many "
            "decisions of its own after a relabelled point"
        },
    )
    init_max_env_steps: int = field(
        default=50,
        metadata={
            "help": "the demonstrations' command cap (not their budget): a demonstration whose environment "
            "commands (an executable skill's count) exceed it is dropped"
        },
    )
    init_vocab_size: int = field(
        default=2048, metadata={"help": "BPE vocabulary size of the local tokenizer"}
    )
    init_hidden_size: int = field(default=256, metadata={"help": "model width"})
    init_intermediate_size: int = field(default=768, metadata={"help": "MLP width"})
    init_layers: int = field(default=4, metadata={"help": "transformer layers"})
    init_heads: int = field(default=4, metadata={"help": "attention heads"})
    init_kv_heads: int = field(default=2, metadata={"help": "key/value heads"})
    init_head_dim: int = field(default=64, metadata={"help": "attention head size"})
    init_pretrain_epochs: float = field(
        default=4.0,
        metadata={"help": "first phase: epochs with every token in the loss, no system prompt (0 = skip)"},
    )
    init_epochs: float = field(
        default=8.0, metadata={"help": "second phase: epochs on assistant tokens only"}
    )
    init_lr: float = field(default=4e-3, metadata={"help": "peak learning rate (AdamW, cosine, warmup)"})
    init_warmup_ratio: float = field(default=0.05, metadata={"help": "warmup share of the SFT steps"})
    init_batch_size: int = field(default=2, metadata={"help": "demonstrations per optimizer step"})
    init_max_length: int = field(default=4096, metadata={"help": "longer demonstrations are dropped"})
    init_logging_steps: int = field(default=10, metadata={"help": "loss is logged every this many steps"})
    init_demo_opening_memory: float = field(default=0.6, metadata={"help": "see DemoMix"})
    init_demo_premature_start: float = field(default=0.6, metadata={"help": "see DemoMix"})
    init_demo_premature_seen: float = field(default=0.3, metadata={"help": "see DemoMix"})
    init_demo_repeat_failed: float = field(default=0.15, metadata={"help": "see DemoMix"})
    init_demo_after_failure_memory: float = field(default=0.3, metadata={"help": "see DemoMix"})
    init_demo_useful: float = field(default=0.8, metadata={"help": "see DemoMix"})
    init_demo_place_memory: float = field(default=0.15, metadata={"help": "see DemoMix"})
    init_demo_wrong_executable: float = field(default=0.15, metadata={"help": "see DemoMix"})
    init_demo_second_memory: float = field(default=0.6, metadata={"help": "see DemoMix"})
    init_demo_random_memory: float = field(default=0.03, metadata={"help": "see DemoMix"})
    init_demo_mistake: float = field(default=0.1, metadata={"help": "see DemoMix"})
    init_demo_false_take: float = field(default=0.0, metadata={"help": "see DemoMix"})
    init_demo_search: str = field(
        default="prior",
        metadata={
            "help": "expert search order: prior (likely places first) | sweep (every receptacle by name)"
        },
    )

    init_dagger_iters: int = field(
        default=0,
        metadata={
            "help": "DAgger iterations after SFT: play the policy on the train games, let the expert label "
            "the states it reached, SFT on all demonstrations so far (0 = off; selskill/init/dagger.py)"
        },
    )
    init_dagger_epochs: float = field(
        default=2.0, metadata={"help": "epochs per DAgger iteration over the aggregated demonstrations"}
    )
    init_dagger_lr: float = field(default=1e-3, metadata={"help": "peak learning rate of the DAgger SFT"})
    init_dagger_points: int = field(
        default=2, metadata={"help": "relabelled demonstrations per policy episode (from its disagreements)"}
    )
    init_dagger_env_steps: int = field(
        default=30,
        metadata={
            "help": "environment commands of a DAgger policy episode at most (and of the expert after it); "
            "the decision budget is init_max_decisions"
        },
    )
    init_dagger_temperature: float = field(
        default=0.0, metadata={"help": "sampling temperature of the DAgger policy episodes (0 = greedy)"}
    )
    init_dagger_fresh_games: bool = field(
        default=False,
        metadata={
            "help": "each DAgger iteration plays init_games_per_type new generated train games per type "
            "(false: the games of the demonstrations)"
        },
    )
    init_dagger_from: str = field(
        default="",
        metadata={
            "help": "start DAgger from this existing init model (built with the same settings, DAgger off) "
            "instead of training the base policy again"
        },
    )
    # benchmark bfcl (selskill/init/bfcl.py): demonstrations are the train split's ground truth
    init_bfcl_tasks: int = field(
        default=0,
        metadata={
            "help": "benchmark bfcl: train tasks demonstrated, the first N in the order the sample stage takes "
            "them (0 = every task of the train split)"
        },
    )
    init_bfcl_opening_memory: float = field(default=0.5, metadata={"help": "benchmark bfcl: see BfclDemoMix"})
    init_bfcl_useful: float = field(default=0.8, metadata={"help": "benchmark bfcl: see BfclDemoMix"})
    init_bfcl_reference_memory: float = field(
        default=0.15, metadata={"help": "benchmark bfcl: see BfclDemoMix"}
    )
    init_bfcl_wrong_executable: float = field(
        default=0.15, metadata={"help": "benchmark bfcl: see BfclDemoMix"}
    )
    init_bfcl_missing_function: float = field(
        default=0.8, metadata={"help": "benchmark bfcl: see BfclDemoMix"}
    )

    def __post_init__(self):
        check_choice(self, "init_game_size", GAME_SIZES)
        check_choice(self, "init_demo_search", SEARCH_ORDERS)
        check_at_least(
            self,
            1,
            "init_games_per_type",
            "init_max_decisions",
            "init_max_env_steps",
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
            "init_dagger_points",
            "init_dagger_env_steps",
        )
        check_at_least(
            self,
            0,
            "init_pretrain_epochs",
            "init_epochs",
            "init_dagger_iters",
            "init_dagger_epochs",
            "init_dagger_temperature",
        )
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if (
                f.name.startswith(("init_demo_", "init_bfcl_")) and isinstance(value, float)
            ) or f.name == "init_warmup_ratio":
                if not 0 <= value <= 1:
                    raise bad_value(f.name, value, "in [0, 1]", "a probability or share")
        for key in ("init_lr", "init_dagger_lr"):
            if getattr(self, key) <= 0:
                raise bad_value(key, getattr(self, key), "> 0", "a learning rate")
