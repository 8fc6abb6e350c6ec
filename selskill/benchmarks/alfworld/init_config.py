"""ALFWorld's init keys: how its demonstrations are played (the expert, the skill mix) and DAgger.

The settings classes hold the defaults; the `init_*` keys of `AlfworldInitKeys` take theirs
from them and its methods build them, so a default is written once. `AlfworldConfig`, the
plugin's recipe section, carries these keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field

from selskill.config.checks import bad_value, check_at_least, check_choice, check_share
from selskill.config.keys import prefixed_values
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


@dataclass
class AlfworldInitKeys:
    """The init keys of ALFWorld's recipe section."""

    init_games_per_type: int = field(
        default=AlfworldDemos.games_per_type, metadata={"help": "generated train games per task type"}
    )
    init_game_size: str = field(
        default=AlfworldDemos.game_size, metadata={"help": "generated scene size: tiny, small or real"}
    )
    init_max_decisions: int = field(
        default=DemoBudget.max_decisions,
        metadata={
            "help": "demonstrations not won within this many decisions (assistant turns, as max_decisions "
            "counts them) are dropped; DAgger's policy episodes play under it, and its expert gets as many "
            "decisions of its own after a relabelled point"
        },
    )
    init_max_env_steps: int = field(
        default=DemoBudget.max_env_steps,
        metadata={
            "help": "the demonstrations' command cap (not their budget): a demonstration whose environment "
            "commands (an executable skill's count) exceed it is dropped"
        },
    )
    init_demo_opening_memory: float = field(default=DemoMix.opening_memory, metadata={"help": "see DemoMix"})
    init_demo_premature_start: float = field(
        default=DemoMix.premature_start, metadata={"help": "see DemoMix"}
    )
    init_demo_premature_seen: float = field(default=DemoMix.premature_seen, metadata={"help": "see DemoMix"})
    init_demo_repeat_failed: float = field(default=DemoMix.repeat_failed, metadata={"help": "see DemoMix"})
    init_demo_after_failure_memory: float = field(
        default=DemoMix.after_failure_memory, metadata={"help": "see DemoMix"}
    )
    init_demo_useful: float = field(default=DemoMix.useful, metadata={"help": "see DemoMix"})
    init_demo_place_memory: float = field(default=DemoMix.place_memory, metadata={"help": "see DemoMix"})
    init_demo_wrong_executable: float = field(
        default=DemoMix.wrong_executable, metadata={"help": "see DemoMix"}
    )
    init_demo_second_memory: float = field(default=DemoMix.second_memory, metadata={"help": "see DemoMix"})
    init_demo_random_memory: float = field(default=DemoMix.random_memory, metadata={"help": "see DemoMix"})
    init_demo_mistake: float = field(default=DemoMix.mistake, metadata={"help": "see DemoMix"})
    init_demo_false_take: float = field(default=DemoMix.false_take, metadata={"help": "see DemoMix"})
    init_demo_no_skills: float = field(
        default=DemoMix.no_skills,
        metadata={"help": "share of the demonstrations played with no skill listed (the no_skills prompt)"},
    )
    init_demo_search: str = field(
        default=DemoMix.search,
        metadata={
            "help": "expert search order: prior (likely places first) | sweep (every receptacle by name)"
        },
    )

    init_dagger_iters: int = field(
        default=DaggerSettings.iterations,
        metadata={
            "help": "DAgger iterations after SFT: play the policy on the train games, let the expert label "
            "the states it reached, SFT on all demonstrations so far (0 = off; selskill/benchmarks/alfworld/dagger.py)"
        },
    )
    init_dagger_epochs: float = field(
        default=DaggerSettings.epochs,
        metadata={"help": "epochs per DAgger iteration over the aggregated demonstrations"},
    )
    init_dagger_lr: float = field(
        default=DaggerSettings.lr, metadata={"help": "peak learning rate of the DAgger SFT"}
    )
    init_dagger_points: int = field(
        default=DaggerSettings.points,
        metadata={"help": "relabelled demonstrations per policy episode (from its disagreements)"},
    )
    init_dagger_env_steps: int = field(
        default=DaggerSettings.max_env_steps,
        metadata={
            "help": "environment commands of a DAgger policy episode at most (and of the expert after it); "
            "the decision budget is init_max_decisions"
        },
    )
    init_dagger_temperature: float = field(
        default=DaggerSettings.temperature,
        metadata={"help": "sampling temperature of the DAgger policy episodes (0 = greedy)"},
    )
    init_dagger_fresh_games: bool = field(
        default=DaggerSettings.fresh_games,
        metadata={
            "help": "each DAgger iteration plays init_games_per_type new generated train games per type "
            "(false: the games of the demonstrations)"
        },
    )
    init_dagger_from: str = field(
        default=DaggerSettings.base,
        metadata={
            "help": "start DAgger from this existing init model (built with the same settings, DAgger off) "
            "instead of training the base policy again"
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
        rates = [f.name for f in dataclasses.fields(AlfworldInitKeys) if f.name.startswith("init_demo_")]
        check_share(self, *(key for key in rates if isinstance(getattr(self, key), float)))
        if self.init_dagger_lr <= 0:
            raise bad_value("init_dagger_lr", self.init_dagger_lr, "> 0", "a learning rate")

    def alfworld_demos(self) -> AlfworldDemos:
        return AlfworldDemos(
            games_per_type=self.init_games_per_type,
            game_size=self.init_game_size,
            budget=DemoBudget(max_decisions=self.init_max_decisions, max_env_steps=self.init_max_env_steps),
            mix=DemoMix(**prefixed_values(self, "init_demo_")),
        )

    def dagger(self, action_choice: str = "free") -> DaggerSettings:
        """`action_choice`: the rollout section's, which DAgger's own rollouts follow."""
        return DaggerSettings(
            iterations=self.init_dagger_iters,
            epochs=self.init_dagger_epochs,
            lr=self.init_dagger_lr,
            points=self.init_dagger_points,
            max_env_steps=self.init_dagger_env_steps,
            temperature=self.init_dagger_temperature,
            base=self.init_dagger_from,
            fresh_games=self.init_dagger_fresh_games,
            action_choice=action_choice,
        )
