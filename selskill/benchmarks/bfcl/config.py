"""BFCL's recipe section (the `bfcl_*` keys) and its split rule.

Light on purpose: the recipe parser loads it through the registry to know the keys, before
anything plays, so it imports nothing but the recipe's own checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import sha256

from selskill.benchmarks.bfcl.init_config import BfclInitKeys
from selskill.config.checks import bad_value, check_choice
from selskill.config.keys import key

# BFCL multi-turn: four categories of the same 200 scenarios, split by scenario index
CATEGORIES: tuple[str, ...] = ("base", "long_context", "miss_func", "miss_param")
SCENARIOS = 200
SPLITS: tuple[str, ...] = ("train", "test")
DOC_STYLES: tuple[str, ...] = ("json", "compact", "brief")


def split_scenarios(
    test_fraction: float = 0.5, seed: int = 0, n: int = SCENARIOS
) -> tuple[list[int], list[int]]:
    """(train, test) scenario indices: a seeded shuffle by hash, the same in every process.

    Split scenarios, not task ids: a scenario's four category variants share their classes
    and state, so they must all fall on one side.
    """
    if not 0.0 <= test_fraction <= 1.0:
        raise ValueError(f"test_fraction must be in [0, 1], got {test_fraction}")
    order = sorted(range(n), key=lambda i: sha256(f"bfcl-split:{seed}:{i}".encode()).hexdigest())
    n_test = round(n * test_fraction)
    return sorted(order[n_test:]), sorted(order[:n_test])


@dataclass
class BfclConfig(BfclInitKeys):
    """BFCL multi-turn from bfcl-eval's shipped data (`benchmark: bfcl`); splits train and test."""

    _argument_group_name = "benchmark bfcl"  # its heading in `--help`

    bfcl_categories: str = key(
        "base,long_context,miss_func,miss_param", "comma-separated BFCL multi-turn categories"
    )
    bfcl_test_fraction: float = key(
        0.5, "share of the 200 scenarios in the test split (split by scenario index)"
    )
    bfcl_split_seed: int = key(0, "seed of the train/test scenario split")
    bfcl_scenarios: str = key(
        "", "comma-separated scenario indices (0-199) to keep in both splits, after the split (default: all)"
    )
    bfcl_withheld_callable: bool = key(
        True,
        "miss_func's withheld functions run when called before their turn (true, the default: "
        "BFCL's own rule; false: refused as unknown names until revealed)",
    )
    turn_doc_style: str = key(
        "compact",
        "function docs in the system prompt: compact | brief (no parameter notes) | json "
        "(BFCL's own rendering, 31-48k characters for two classes)",
    )
    turn_examples: bool = key(True, "few-shot examples in the system prompt (the paper's App. G)")

    def __post_init__(self):
        super().__post_init__()
        cats = self.categories
        if not cats or any(c not in CATEGORIES for c in cats) or len(set(cats)) != len(cats):
            raise bad_value(
                "bfcl_categories", self.bfcl_categories, f"a comma-separated list of {', '.join(CATEGORIES)}"
            )
        if not 0.0 <= self.bfcl_test_fraction <= 1.0:
            raise bad_value(
                "bfcl_test_fraction", self.bfcl_test_fraction, "in [0, 1]", "a share of scenarios"
            )
        try:
            kept = self.kept_scenarios
        except ValueError:
            kept = ()
        if kept == () or (kept and not all(0 <= i < SCENARIOS for i in kept)):
            raise bad_value(
                "bfcl_scenarios", self.bfcl_scenarios, f"comma-separated integers in [0, {SCENARIOS})"
            )
        check_choice(self, "turn_doc_style", DOC_STYLES)

    @property
    def kept_scenarios(self) -> tuple[int, ...] | None:
        """`bfcl_scenarios` as indices (None: every scenario)."""
        if not self.bfcl_scenarios.strip():
            return None
        return tuple(int(x) for x in str(self.bfcl_scenarios).split(",") if x.strip())

    def split(self, split: str) -> tuple[int, ...]:
        """The scenario indices of split `split` ("train" | "test") that this run keeps."""
        train, test = split_scenarios(self.bfcl_test_fraction, self.bfcl_split_seed)
        keep = self.kept_scenarios
        return tuple(i for i in (train if split == "train" else test) if keep is None or i in keep)

    @property
    def categories(self) -> tuple[str, ...]:
        """The categories of `bfcl_categories`, in the order given."""
        return tuple(c.strip() for c in self.bfcl_categories.split(",") if c.strip())
