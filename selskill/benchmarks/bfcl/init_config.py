"""BFCL's init keys: which train tasks its ground-truth demonstrations play, and the skill mix.

`BfclDemoMix` holds the defaults; each `init_bfcl_*` rate key names the field it sets (`KeysOf`)
and takes its type and default from it, and `bfcl_demo_mix` builds it. `BfclConfig`, the
plugin's recipe section, carries these keys.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from selskill.config.checks import check_at_least, check_share
from selskill.config.keys import KeysOf, key, recipe_section, settings_of

# --- BFCL's demonstrations ---------------------------------------------------------------------


@dataclass(frozen=True)
class BfclDemoMix:
    """Rates at which skill calls are mixed into BFCL's ground truth (`selskill.benchmarks.bfcl.demos`)."""

    opening_memory: float = 0.5
    useful: float = 0.8
    reference_memory: float = 0.15
    wrong_executable: float = 0.15
    missing_function: float = 0.8

    def __post_init__(self):
        for name, value in asdict(self).items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"init_bfcl_{name} must be in [0, 1], got {value}")


@recipe_section
class BfclInitKeys:
    """The init keys of BFCL's recipe section."""

    init_bfcl_tasks: int = key(
        0,
        "benchmark bfcl: train tasks demonstrated, the first N in the order the sample stage takes "
        "them (0 = every task of the train split)",
    )
    _mix = KeysOf(
        BfclDemoMix,
        "init_bfcl_",
        {
            "init_bfcl_opening_memory": "benchmark bfcl: see BfclDemoMix",
            "init_bfcl_useful": "benchmark bfcl: see BfclDemoMix",
            "init_bfcl_reference_memory": "benchmark bfcl: see BfclDemoMix",
            "init_bfcl_wrong_executable": "benchmark bfcl: see BfclDemoMix",
            "init_bfcl_missing_function": "benchmark bfcl: see BfclDemoMix",
        },
    )

    def __post_init__(self):
        check_at_least(self, 0, "init_bfcl_tasks", why="0 = every task of the train split")
        check_share(self, *self._mix.help)

    def bfcl_demo_mix(self) -> BfclDemoMix:
        return settings_of(self, BfclDemoMix)
