"""The train section: TRL's `DPOConfig`, the LoRA keys of TRL's `ModelConfig`, and the SelSkill knobs.

Every `DPOConfig`/`TrainingArguments` key (beta, learning_rate, num_train_epochs, max_length,
bf16, gradient_checkpointing, precompute_ref_log_probs, ...) is a recipe key as TRL spells
it, and so are `ModelConfig`'s PEFT keys (use_peft, lora_r, lora_alpha, lora_dropout,
lora_target_modules, ...): the section is also a `ModelConfig`, so `trl.get_peft_config`
reads it as TRL's own scripts read theirs. Our own keys carry the `train_` prefix so that
they never clash with another section's.

Some TRL fields are not keys of this section (`_not_recipe_keys`, read through
`selskill.config.keys.recipe_fields`): those of `OWNED_ELSEWHERE` are keys of another section
(the run-wide `seed`, `report_to` and `log_level` are the run section's, `trust_remote_code`
the policy section's), whose value the field takes; `ModelConfig`'s model-loading fields are
no keys at all (`NOT_RECIPE_KEYS` says what replaces each).

The section depends on the recipe only: what depends on the machine (bf16 where the recipe
leaves it unset, whether this machine supports it, a multi-process launch without
accelerators) is decided by the train stage when it builds the DPOConfig it trains with
(`selskill.train.args`).
"""

from __future__ import annotations

from dataclasses import dataclass

from trl import DPOConfig, ModelConfig

from selskill.config.checks import check_above, check_at_least, check_declared_choices
from selskill.config.keys import key
from selskill.config.window import DEFAULT_WINDOW_N, WINDOW_ALL, parse_window_n

PAIR_KIND_CHOICES = ("episode", "local", "both")
OVERFLOW_CHOICES = ("skip", "error")
BRANCH_POOL_CHOICES = ("all", "ordinary", "post_skill")
LOCAL_REASON_CHOICES = ("all", "success_vs_failure", "success_rate", "efficiency")
PREFIX_SHARING_CHOICES = ("none", "pair", "branch")  # selskill/train/prefix_sharing.py
OBJECTIVE_CHOICES = ("dpo", "sft_wins")  # selskill/train/stage.py; sft_wins: selskill/train/wins.py


# TRL fields that are keys of another section (argparse takes each key once): the recipe key is that
# section's, and the train section's TRL field takes its value when the recipe is parsed
# (`selskill.config.parse_sections`) and when the train stage builds its DPOConfig (`selskill.train.args`).
OWNED_ELSEWHERE = {
    "seed": "RunConfig",
    "report_to": "RunConfig",
    "log_level": "RunConfig",
    "trust_remote_code": "PolicyConfig",
}

_LOADING = (
    "the trainer loads the policy with DPOConfig's model_init_kwargs, e.g. "
    "`model_init_kwargs: {dtype: bfloat16, attn_implementation: sdpa}`"
)
_QUANTIZED = (
    "quantized (QLoRA) base models are not supported: LoRA trains on the base in its model_init_kwargs dtype"
)
# `ModelConfig` keys that are not recipe keys, with what a recipe writes instead: the policy section
# names the model (and each round trains round r-1's), and the trainer's own loader is the one way to
# load it (two keys for one setting would disagree).
NOT_RECIPE_KEYS = {
    "model_name_or_path": "the policy section's key (round 1 starts from it; round r trains round r-1's model)",
    "model_revision": _LOADING,
    "dtype": _LOADING,
    "attn_implementation": _LOADING,
    "lora_task_type": "selskill trains causal language models only (CAUSAL_LM)",
    "load_in_8bit": _QUANTIZED,
    "load_in_4bit": _QUANTIZED,
    "bnb_4bit_quant_type": _QUANTIZED,
    "use_bnb_nested_quant": _QUANTIZED,
    "bnb_4bit_quant_storage": _QUANTIZED,
}


@dataclass
class TrainConfig(DPOConfig, ModelConfig):
    """DPO on SelSkill pairs. Defaults follow the paper (Table 13); see recipes/dpo_8b.yaml.

    `train_objective: sft_wins` trains the baseline SFT on the round's wins with the same
    TrainingArguments keys (selskill/train/wins.py).

    With `use_peft` the trainer trains a LoRA adapter and the reference is the same model with
    the adapter disabled (recipes/dpo_8b_lora.yaml; docs/design.md, "LoRA and round chaining").
    """

    _argument_group_name = (  # its heading in `--help`
        "train (TRL's DPOConfig keys, ModelConfig's use_peft and lora_* keys, and train_*)"
    )
    # TRL's fields that are no keys of this section (`selskill.config.keys.recipe_fields`)
    _not_recipe_keys = frozenset(OWNED_ELSEWHERE) | frozenset(NOT_RECIPE_KEYS)
    _owned_elsewhere = OWNED_ELSEWHERE  # field -> the section whose key it is (`selskill.config`)
    # whether building this config runs TRL's check that this machine supports bf16: not for the recipe
    # section, which loads on any machine; the train stage's DPOConfig does (`selskill.train.args`)
    _checks_machine = False

    train_objective: str = key(
        "dpo",
        "what the train stage fits: dpo = DPO on the label stage's pairs (SelSkill); sft_wins = "
        "rejection-sampling fine-tuning, the baseline to compare it with on the same rollouts: TRL's "
        "SFTTrainer on every successful episode of the round's sample stage (each of a task's K samples "
        "that won; a win with a malformed turn is left out), loss on the policy's own assistant tokens, "
        "with this section's learning_rate, num_train_epochs, batch keys and the run's seed. The DPO-only "
        "keys (beta, loss_type, train_pair_kinds, train_window_n, ...) are then unused, and a round "
        "runs no branch, fork or label stage",
        choices=list(OBJECTIVE_CHOICES),
    )
    train_pair_kinds: str = key(
        "both",
        "which pairs to train on: episode, local or both (the paper's Table 2 ablation)",
        choices=list(PAIR_KIND_CHOICES),
    )
    train_local_fraction: float = key(
        -1.0,
        "share of local pairs in the training set when both kinds are trained: a value in (0, 1) "
        "subsamples the over-represented kind (seeded) until local pairs make up this share; -1 keeps every "
        "pair (the natural mix). The one place kinds are mixed: label writes every pair it finds, so "
        "ablations that reuse one label stage differ only in train_* keys",
    )
    train_branch_pools: str = key(
        "all",
        "local pairs kept by the pool of their branch point: all, ordinary (entropy-selected ordinary "
        "turns) or post_skill (turns that invoked a skill); the paper's Table 2 'entropy-local only' and "
        "'skill-call-local only'. Episode pairs are not affected.",
        choices=list(BRANCH_POOL_CHOICES),
    )
    train_local_reasons: str = key(
        "all",
        "local pairs kept by their label reason: all, success_vs_failure (one arm won, the other lost), "
        "success_rate (label_arm_rule success_rate: both arms won, one more often) or efficiency (both won, "
        "fewer steps chosen). An efficiency label rests on a step count that the "
        "continuations' own sampling moves as much as the decision, and on the decision budget it mostly "
        "prefers skipping. Episode pairs are not affected.",
        choices=list(LOCAL_REASON_CHOICES),
    )
    train_max_pairs: int = key(
        0,
        "train on at most this many pairs (a seeded subsample after every other filter), so that "
        "ablations compare at matched pair counts; 0 = no limit",
    )
    train_window_n: str = key(
        DEFAULT_WINDOW_N,
        "local pairs train the assistant tokens of the first n assistant turns after the branch: "
        "1, 3 (paper) or all (the one spelling of every turn; -1, 0 and null are refused). Episode pairs "
        "always train every assistant token. The trainer builds this window from each token's role and "
        "turn; pair shards store no mask, so one label stage serves every n.",
    )
    train_keep_head_messages: int = key(
        2,
        "max_length policy: leading prompt messages that are never dropped (1 = the system message, "
        "2 = also the first user message, which states the task). Older prompt messages after them are "
        "dropped first; the trained window is never cut.",
    )
    train_message_start_token: str = key(
        "<|im_start|>",
        "token that opens every chat message (ChatML); message boundaries for the max_length policy",
    )
    train_trim_after_window: bool = key(
        True,
        "drop completion tokens after the last trained token: they carry no loss and cannot influence "
        "earlier tokens, so the loss is unchanged and the step is cheaper",
    )
    train_overflow: str = key(
        "skip",
        "pairs that still exceed max_length after the oldest prompt messages are dropped: skip them "
        "(counted in pairs_stats.json and the log) or error; with train_objective sft_wins, the winning "
        "episodes longer than max_length (counted in wins_stats.json: a cut episode would teach an unfinished one)",
        choices=list(OVERFLOW_CHOICES),
    )
    train_prefix_sharing: str = key(
        "pair",
        "run pairs as prefix trees, with the same loss and gradients: pair = [prompt][chosen][rejected] "
        "in one sequence, the prompt computed once per pair instead of twice; branch = every pair of a batch "
        "with the same prompt in one tree, each distinct continuation once, and training rows ordered by "
        "branch point (pays with per_device_train_batch_size > 1); none = one sequence per side (TRL's "
        "layout). Needs a qwen3, qwen2 or llama policy with sdpa, eager or flex_attention attention",
        choices=list(PREFIX_SHARING_CHOICES),
    )
    train_accelerate_config: str = key(
        "",
        "accelerate config `selskill train` relaunches itself under (e.g. recipes/accelerate/zero3.yaml); "
        "empty = train in the calling process",
    )
    # TRL turns bf16 on by default, which fails on a CPU-only machine when a recipe does not mention it.
    # Here None means: on where an accelerator supports it, off elsewhere. Recipes set it explicitly.
    bf16: bool | None = key(None, "bf16 mixed precision; unset = on where a GPU supports it, off on CPU")

    def __post_init__(self):
        check_declared_choices(self)
        check_at_least(self, 0, "train_max_pairs", why="0 = no limit")
        if not (self.train_local_fraction == -1.0 or 0.0 < self.train_local_fraction < 1.0):
            raise ValueError(
                f"train_local_fraction must be in (0, 1), or -1 for the natural mix; got {self.train_local_fraction} "
                f"(to train one kind only, set train_pair_kinds: episode or local)"
            )
        check_at_least(self, 0, "train_keep_head_messages")
        n = parse_window_n(self.train_window_n)
        self.train_window_n = WINDOW_ALL if n is None else str(n)
        if self.max_length is not None and self.max_length < 8:
            raise ValueError(
                f"max_length must be at least 8 tokens (or null for no limit); got {self.max_length}"
            )
        check_above(
            self, 0, "beta", why="DPO's preference strength: a negative beta trains toward the rejected side"
        )
        check_above(self, 0, "learning_rate")
        if self.max_steps <= 0:
            check_above(self, 0, "num_train_epochs", why="or set max_steps")
        check_at_least(self, 0, "warmup_steps", why="a float < 1 is a ratio of the total steps")
        check_at_least(self, 0, "max_grad_norm", why="0 = no clipping")
        check_at_least(self, 0, "weight_decay")
        if self.truncation_mode != "keep_start":
            raise ValueError(
                "truncation_mode is not used by the selskill trainer: pairs are fitted to max_length by dropping the "
                "oldest prompt messages (see train_keep_head_messages); remove truncation_mode from the recipe"
            )

        ModelConfig.__post_init__(self)  # DPOConfig's chain does not reach it: a single target -> its name

        # TRL's own checks and normalisations. Whether this machine runs bf16 (and, unset, whether to) is the
        # train stage's decision (`selskill.train.args`): the section is checked as bf16-off and keeps the value
        # the recipe gave, so a GPU recipe loads on any machine
        bf16 = self.bf16
        if not self._checks_machine:
            self.bf16 = False
        super().__post_init__()
        self.bf16 = bf16

    @property
    def window_turns(self) -> int | None:
        """n as a number of turns; None = all assistant turns after the branch."""
        return parse_window_n(self.train_window_n)

    @property
    def kinds(self) -> tuple[str, ...]:
        return ("episode", "local") if self.train_pair_kinds == "both" else (self.train_pair_kinds,)
