"""ALFWorld's init keys: how its demonstrations are played (the expert, the skill mix) and DAgger.

The settings classes hold the defaults; each `init_*` key of `AlfworldInitKeys` names the field
it sets (`KeysOf`) and takes its type and default from it, and its methods build them, so a
setting is written once. `AlfworldConfig`, the
plugin's recipe section, carries these keys.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from selskill.config.checks import bad_value, check_at_least, check_choice, check_share
from selskill.config.keys import KeysOf, recipe_section, settings_of
from selskill.config.rollout import MAX_DECISIONS

SEARCH_ORDERS: tuple[str, ...] = ("prior", "sweep")  # the expert's order of search
GAME_SIZES: tuple[str, ...] = ("tiny", "small", "real")  # generated scene sizes: the scale ladder

# --- ALFWorld's demonstrations and DAgger ------------------------------------------------------


@dataclass(frozen=True)
class DemoBudget:
    """A demonstration is kept only if won within these (assistant turns, environment commands):
    the init is not taught an episode the rounds' step budget would cut short."""

    max_decisions: int = MAX_DECISIONS
    max_env_steps: int = 50


@dataclass(frozen=True)
class DemoMix:
    """Rates at which skill calls are mixed into the expert's play (`selskill.sft.demos`)."""

    opening_memory: float = 0.6
    premature_start: float = 0.6
    premature_seen: float = 0.3
    repeat_failed: float = 0.15
    after_failure_memory: float = 0.3
    useful: float = 0.8
    place_memory: float = 0.15
    wrong_executable: float = 0.15
    second_memory: float = 0.6
    random_memory: float = 0.03
    mistake: float = 0.1
    # at a searched receptacle that does not hold the task's object, first try to take it from
    # there (an untrained wrong move; "Nothing happens.", then the expert moves on, trained):
    # greedy small policies hallucinate that take and repeat it to the step limit. 0 draws
    # nothing, so builds without it keep their demonstrations.
    false_take: float = 0.0
    # share of the games played with the skills unlisted, in the prompt `eval_mode: no_skills`
    # plays (no skill section, nothing callable): the expert's manual procedures stay the policy's
    # own, as for the paper's init, which learned the task before skills were put in its prompt,
    # and it wins about as often without its skills as with them (docs/benchmarks.md, "An init
    # with the paper's starting profile"). 0 draws nothing.
    no_skills: float = 0.5
    # how the expert orders receptacles when it searches (`search_order`): "prior" visits the
    # places where the object usually is first; "sweep" visits every receptacle in name order
    search: str = "prior"

    def __post_init__(self):
        if self.search not in SEARCH_ORDERS:
            raise ValueError(f"DemoMix.search must be one of {', '.join(SEARCH_ORDERS)}, got {self.search!r}")
        for name, value in asdict(self).items():
            if name != "search" and not 0.0 <= value <= 1.0:
                raise ValueError(f"DemoMix.{name} must be in [0, 1], got {value}")

    @classmethod
    def none(cls) -> DemoMix:
        """The bare expert: no skill calls at all."""
        return cls(**{k: 0.0 for k in asdict(cls()) if k != "search"})


@dataclass(frozen=True)
class AlfworldDemos:
    """What the ALFWorld init demonstrates: generated train games, played under a budget with a mix."""

    games_per_type: int = 40
    game_size: str = "small"
    budget: DemoBudget = field(default_factory=DemoBudget)
    mix: DemoMix = field(default_factory=DemoMix)


@dataclass(frozen=True)
class DaggerSettings:
    """DAgger after the SFT (`selskill.benchmarks.alfworld.dagger`); `iterations=0` turns it off."""

    iterations: int = 0
    epochs: float = 2.0
    lr: float = 1e-3
    points: int = 2
    max_env_steps: int = 30
    temperature: float = 0.0
    base: str = ""  # an existing init model (same settings, DAgger off) to start from
    fresh_games: bool = False  # iteration i plays new generated train games, not the SFT's
    # the rollouts' decoding (the recipe's `action_choice`): DAgger relabels the states the policy
    # reaches as the rounds will sample it, so it decodes the same way
    action_choice: str = "free"

    def __post_init__(self):
        if self.iterations < 0 or self.points < 1 or self.epochs <= 0 or self.max_env_steps < 1:
            raise ValueError(
                f"DAgger settings out of range: {self} (init_dagger_iters >= 0, init_dagger_points >= 1, "
                "init_dagger_epochs > 0, init_dagger_env_steps >= 1)"
            )
        if self.base and not self.iterations:
            raise ValueError("init_dagger_from is set but init_dagger_iters is 0: set init_dagger_iters >= 1")


@recipe_section
class AlfworldInitKeys:
    """The init keys of ALFWorld's recipe section."""

    _demos = KeysOf(
        AlfworldDemos,
        "init_",
        {
            "init_games_per_type": "generated train games per task type",
            "init_game_size": "generated scene size: tiny, small or real",
        },
    )
    _budget = KeysOf(
        DemoBudget,
        "init_",
        {
            "init_max_decisions": "demonstrations not won within this many decisions (assistant turns, as "
            "max_decisions counts them) are dropped; DAgger's policy episodes play under it, and its expert gets "
            "as many decisions of its own after a relabelled point",
            "init_max_env_steps": "the demonstrations' command cap (not their budget): a demonstration whose "
            "environment commands (an executable skill's count) exceed it is dropped",
        },
    )
    _mix = KeysOf(
        DemoMix,
        "init_demo_",
        {
            "init_demo_opening_memory": "see DemoMix",
            "init_demo_premature_start": "see DemoMix",
            "init_demo_premature_seen": "see DemoMix",
            "init_demo_repeat_failed": "see DemoMix",
            "init_demo_after_failure_memory": "see DemoMix",
            "init_demo_useful": "see DemoMix",
            "init_demo_place_memory": "see DemoMix",
            "init_demo_wrong_executable": "see DemoMix",
            "init_demo_second_memory": "see DemoMix",
            "init_demo_random_memory": "see DemoMix",
            "init_demo_mistake": "see DemoMix",
            "init_demo_false_take": "see DemoMix",
            "init_demo_no_skills": "share of the demonstrations played with no skill listed (the no_skills prompt)",
            "init_demo_search": "expert search order: prior (likely places first) | sweep (every receptacle by name)",
        },
    )
    _dagger = KeysOf(
        DaggerSettings,
        "init_dagger_",
        {
            "init_dagger_iters": "DAgger iterations after SFT: play the policy on the train games, let the expert "
            "label the states it reached, SFT on all demonstrations so far (0 = off; "
            "selskill/benchmarks/alfworld/dagger.py)",
            "init_dagger_epochs": "epochs per DAgger iteration over the aggregated demonstrations",
            "init_dagger_lr": "peak learning rate of the DAgger SFT",
            "init_dagger_points": "relabelled demonstrations per policy episode (from its disagreements)",
            "init_dagger_env_steps": "environment commands of a DAgger policy episode at most (and of the expert "
            "after it); the decision budget is init_max_decisions",
            "init_dagger_temperature": "sampling temperature of the DAgger policy episodes (0 = greedy)",
            "init_dagger_fresh_games": "each DAgger iteration plays init_games_per_type new generated train games "
            "per type (false: the games of the demonstrations)",
            "init_dagger_from": "start DAgger from this existing init model (built with the same settings, DAgger "
            "off) instead of training the base policy again",
        },
        renamed={
            "init_dagger_iters": "iterations",
            "init_dagger_env_steps": "max_env_steps",
            "init_dagger_from": "base",
        },
    )

    def __post_init__(self):
        check_choice(self, "init_game_size", GAME_SIZES)
        check_choice(self, "init_demo_search", SEARCH_ORDERS)
        check_at_least(
            self, 1, "init_games_per_type", "init_max_decisions", "init_max_env_steps", "init_dagger_points",
            "init_dagger_env_steps",
        )  # fmt: skip
        check_at_least(self, 0, "init_dagger_iters", "init_dagger_epochs", "init_dagger_temperature")
        check_share(self, *(key for key in self._mix.help if isinstance(getattr(self, key), float)))
        if self.init_dagger_lr <= 0:
            raise bad_value("init_dagger_lr", self.init_dagger_lr, "> 0", "a learning rate")

    def alfworld_demos(self) -> AlfworldDemos:
        return settings_of(
            self, AlfworldDemos, budget=settings_of(self, DemoBudget), mix=settings_of(self, DemoMix)
        )

    def dagger(self, action_choice: str = "free") -> DaggerSettings:
        """`action_choice`: the rollout section's, which DAgger's own rollouts follow."""
        return settings_of(self, DaggerSettings, action_choice=action_choice)
