"""ALFWorld's recipe section: where its games come from (generated households or real data).

Light on purpose: the recipe parser loads it through the registry to know the keys, before
anything plays, so it imports nothing but the recipe's own checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from selskill.benchmarks.alfworld.init_config import GAME_SIZES, AlfworldInitKeys
from selskill.config.checks import check_at_least, check_choice
from selskill.config.keys import key

# the generated splits, plus real data's `valid_train`, which is only indexed when named (it
# repeats train games)
SPLITS: tuple[str, ...] = ("train", "valid_seen", "valid_unseen")
REAL_ONLY_SPLITS: tuple[str, ...] = ("valid_train",)
KNOWN_SPLITS: tuple[str, ...] = SPLITS + REAL_ONLY_SPLITS
HELD_OUT: tuple[str, ...] = ("valid_seen", "valid_unseen")
GRAMMAR_MODES: tuple[str, ...] = ("patch", "strict")


@dataclass
class AlfworldConfig(AlfworldInitKeys):
    """ALFWorld's games: generated households (the offline default) or real data from $ALFWORLD_DATA;
    and its init keys (`AlfworldInitKeys`)."""

    _argument_group_name = "benchmark alfworld (games)"  # its heading in `--help`

    games_dir: str = key(
        "runs/games", "root of generated games (<games_dir>/<split>/...); ignored where ALFWORLD_DATA is used"
    )
    use_alfworld_data: bool = key(False, "read real ALFWorld games from $ALFWORLD_DATA instead of games_dir")
    alfworld_grammar: str = key(
        "patch",
        "real game files in alfworld's old grammar (`put X in/on Y`, 'You arrive at loc N'): "
        "patch = move them to the new grammar (`move X to Y`) in memory when loaded, as alfworld's "
        "scripts/patch_tw-pddl.py would on disk; strict = refuse them with an error naming the file",
    )
    games_size: str = key("small", "generated scene size: tiny, small or real (the scale ladder)")
    games_train_per_type: int = key(4, "generated train games per task type")
    games_eval_per_type: int = key(4, "generated valid_seen/valid_unseen games per type")
    games_unseen_per_type: int = key(-1, "generated valid_unseen games per type (-1 = games_eval_per_type)")
    games_seed: int = key(0, "generation seed (the same seed writes identical games)")

    def __post_init__(self):
        super().__post_init__()
        check_choice(self, "alfworld_grammar", GRAMMAR_MODES)
        check_choice(self, "games_size", GAME_SIZES)
        check_at_least(self, 0, "games_train_per_type", "games_eval_per_type")
        check_at_least(self, -1, "games_unseen_per_type", why="-1 = games_eval_per_type")

    def per_type(self, split: str) -> int:
        """Generated games per task type of `split`."""
        if split == "train":
            return self.games_train_per_type
        if split == "valid_unseen" and self.games_unseen_per_type >= 0:
            return self.games_unseen_per_type
        return self.games_eval_per_type
