"""What every benchmark's demonstrations are made of, and where they are played.

A benchmark plugin plays its own demonstrations (ALFWorld's expert with skill calls mixed in,
BFCL's ground truth); the init SFT (`selskill.sft.build`) trains on any of them, so the
record of one demonstration, a build's report of them and the prompts they are written in
live here, below both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from selskill.agent.eval_modes import prompt_setup
from selskill.agent.listings import DecisionListings
from selskill.agent.parser import parse_turn
from selskill.agent.turn_format import TurnFormat
from selskill.envs.base import Env
from selskill.skills import Navigation, SkillExecutor, SkillLibrary, render_listing
from selskill.skills.retrieval import SkillRetriever


@dataclass
class Demo:
    """One winning demonstration as chat messages (what SFT trains on) plus its bookkeeping."""

    task_id: str
    task_type: str
    messages: list[dict]
    n_skill_calls: int
    n_precise: int
    env_steps: int
    calls: list[dict] = field(default_factory=list)  # per call: role, skill, precise, error, env_steps, turn
    # assistant turns (0-based among assistant messages) kept as context but not trained:
    # the injected wrong moves (a policy should see them and recover, never learn to make them)
    untrained_turns: list[int] = field(default_factory=list)
    skills_listed: bool = True  # False: played in the no_skills prompt (no skill section, nothing callable)

    @property
    def n_turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "assistant")

    @property
    def mistakes(self) -> list[str]:
        """The injected wrong moves' commands, in order (read from their untrained turns)."""
        turns = [m["content"] for m in self.messages if m["role"] == "assistant"]
        return [parse_turn(turns[i], ()).action for i in self.untrained_turns]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class DemoReport:
    demos: list[Demo]
    attempted: int = 0
    dropped: Counter = field(default_factory=Counter)  # reason -> count

    def stats(self) -> dict:
        return demo_stats(self.demos, attempted=self.attempted, dropped=self.dropped)


@dataclass(frozen=True)
class DemoSource:
    """A benchmark's demonstrations for the SFT of a given model (`init_sft`): the settings that decide
    them (the init's manifest records them; a rerun with others is refused) and how to play them,
    `play(progress, timings)`, called only when the init is trained (its timings go into `timings`)."""

    settings: dict
    play: Callable[[bool, dict], DemoReport]


# --- where demonstrations are played ---------------------------------------------------------


@dataclass(frozen=True)
class DemoPrompts:
    """How the rounds will prompt the policy a build trains: the turn format, the listing style,
    and the library (None: the benchmark's own skills) and retriever that each decision lists
    skills from. Demonstrations are written in exactly these prompts."""

    fmt: TurnFormat
    listing_style: str
    library: SkillLibrary | None = None
    retriever: SkillRetriever | None = None

    def listings(self, own: SkillLibrary) -> DecisionListings:
        """The listing rules over `library`, or `own` where the prompts name none."""
        return DecisionListings(self.library or own, self.retriever, self.listing_style)


@dataclass(frozen=True)
class DemoSetup:
    """What every demonstration of a build plays on: one environment, the skill executor, and the
    prompts as `DemoPrompts` resolves them (`listing`: the full library's listing text)."""

    env: Env
    executor: SkillExecutor
    fmt: TurnFormat
    listing: str
    listings: DecisionListings

    @classmethod
    def of(
        cls, env, prompts: DemoPrompts, own: SkillLibrary, navigation: Navigation | None = None
    ) -> DemoSetup:
        """`navigation`: the commands the benchmark's skills move and look around with (its hooks')."""
        listings = prompts.listings(own)
        library = listings.library
        listing = render_listing(library, style=prompts.listing_style)
        return cls(env, SkillExecutor(library, navigation), prompts.fmt, listing, listings)

    def without_skills(self) -> DemoSetup:
        """The same environment in the prompt evaluation's `no_skills` mode plays: no skill section
        and nothing callable (`selskill.agent.eval_modes.prompt_setup` owns that prompt)."""
        style = self.listings.style
        bare = prompt_setup("no_skills", self.listings.library, self.fmt, style)
        return DemoSetup(
            self.env, SkillExecutor(bare.library), bare.fmt, bare.skill_text,
            DecisionListings(bare.library, None, style),
        )  # fmt: skip


def demo_stats(demos: Sequence[Demo], attempted: int | None = None, dropped: Counter | None = None) -> dict:
    """Counts an init manifest records: demos, calls per demo, precision, calls by role."""
    n = len(demos)
    calls = [c for d in demos for c in d.calls]
    by_role = Counter(c["role"] for c in calls)
    by_skill = Counter(c["skill"] for c in calls)
    errors = Counter((c["error"] or "").split(":", 1)[0] for c in calls if not c["precise"])
    return {
        "n_demos": n,
        "attempted": attempted if attempted is not None else n,
        "dropped": dict(dropped or {}),
        "by_task_type": dict(sorted(Counter(d.task_type for d in demos).items())),
        "skill_calls_per_demo": (len(calls) / n) if n else 0.0,
        "exec_precision": (sum(c["precise"] for c in calls) / len(calls)) if calls else None,
        "demos_with_calls": (sum(1 for d in demos if d.calls) / n) if n else 0.0,
        "demos_without_skills": sum(1 for d in demos if not d.skills_listed),
        "env_steps_mean": (sum(d.env_steps for d in demos) / n) if n else 0.0,
        "env_steps_max": max((d.env_steps for d in demos), default=0),
        "turns_mean": (sum(d.n_turns for d in demos) / n) if n else 0.0,
        "mistakes_per_demo": (sum(len(d.untrained_turns) for d in demos) / n) if n else 0.0,
        "calls_by_role": dict(sorted(by_role.items())),
        "calls_by_skill": dict(sorted(by_skill.items())),
        "failed_calls_by_error": dict(sorted(errors.items())),
    }
