"""The round-1 variants of the mini replication, by name: each is the main line with these recipe
keys changed. A module of its own so that the CLI can offer the sets without loading the stages."""

from __future__ import annotations

PAIR_VARIANTS: dict[str, dict[str, str]] = {
    "episode-only": {"train_pair_kinds": "episode"},
    "local-only": {"train_pair_kinds": "local"},
    "entropy-local-only": {"train_pair_kinds": "local", "train_branch_pools": "ordinary"},
    "skill-call-local-only": {"train_pair_kinds": "local", "train_branch_pools": "post_skill"},
    "n1": {"train_window_n": "1"},
    "n3": {"train_window_n": "3"},
    "nall": {"train_window_n": "all"},
}
# trained on the round's own wins instead of pairs; reported beside the pair variants
SFT_VARIANTS: dict[str, dict[str, str]] = {"sft-wins": {"train_objective": "sft_wins"}}
BRANCH_VARIANTS: dict[str, dict[str, str]] = {
    "branch-random": {"branch_strategy": "random"},
    "branch-all_skill": {"branch_strategy": "all_skill"},
}
# which variants `bench mini --ablations` runs: the comparisons a reader of one round needs (each
# pair kind alone, and SFT on the same samples' wins), every ablation of the paper, or none
ABLATION_SETS: dict[str, tuple[str, ...]] = {
    "comparisons": ("episode-only", "local-only", "sft-wins"),
    "all": (*PAIR_VARIANTS, *SFT_VARIANTS, *BRANCH_VARIANTS),
    "none": (),
}
