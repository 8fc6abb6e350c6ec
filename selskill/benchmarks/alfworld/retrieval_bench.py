"""ALFWorld's labelled episodes for `selskill bench retrieval`.

Demonstrations (`selskill.benchmarks.alfworld.demos`) with a mix in which the expert calls
its skills where they help (opening memory, the task skill once it holds the object,
`place_held_object`, `find_second_object`), no premature, wrong or random calls, and the
demonstrations' usual 10% wrong moves. At every decision the label is the skill the expert
calls next (at this decision or a later one); decisions after the last call are not events.
After a memory skill the current observation stays the environment's (the skill's text is
guidance, not an observation); after an executable one it is what the skill returned.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass

from selskill.benchmarks.alfworld.episode import NAVIGATION
from selskill.skills.model import SkillLibrary
from selskill.skills.retrieval_bench import Episode, Event, RetrievalBench
from selskill.skills.step_records import EpisodePrefix


def bench_demo_mix():
    """The expert calling its skills where they help (`on`), never where they do not (`off`), with the
    demonstrations' wrong moves (`mistake` and the rest at their defaults)."""
    from selskill.benchmarks.alfworld.demos import DemoMix

    on = ("opening_memory", "useful", "place_memory", "second_memory")
    off = (
        "premature_start", "premature_seen", "repeat_failed", "after_failure_memory", "wrong_executable",
        "random_memory",
    )  # fmt: skip
    return DemoMix(**dict.fromkeys(on, 1.0), **dict.fromkeys(off, 0.0))


def _traced_episode_class():
    from selskill.benchmarks.alfworld.demos import DemoEpisode

    class TracedEpisode(DemoEpisode):
        """A demonstration that also records, at each decision, the prefix retrieval sees there."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.decisions: list[tuple[EpisodePrefix, str | None]] = []

        def act(self, command, text=None):
            self.decisions.append((self.prefix, None))
            super().act(command, text)

        def call(self, name, role):
            self.decisions.append((self.prefix, name))
            return super().call(name, role)

        def _after_failure(self, name):  # the bench mix never reacts to a failed call
            return None

    return TracedEpisode


def alfworld_episodes(
    games_dir: str | None = None, split: str = "valid_seen", per_type: int = 10, seed: int = 0
):
    """Episodes from the expert's demonstrations; generates `per_type` tiny games when no dir is given.

    Returns (episodes, games root, dropped count).
    """
    import random

    from selskill.benchmarks.alfworld import load_alfworld_skills
    from selskill.benchmarks.alfworld.demos import ALFWORLD_PROMPTS, DemoBudget, MixState, play_on, task_spec
    from selskill.benchmarks.alfworld.env import AlfworldEnv, find_games
    from selskill.sft.demos import DemoSetup

    if games_dir is None:
        from selskill.benchmarks.alfworld.generate import generate_games

        games_dir = tempfile.mkdtemp(prefix="selskill-bench-retrieval-")
        generate_games(games_dir, per_type=per_type, seed=seed, split=split, size="tiny")
    index = find_games(games_dir, splits=split)
    records = index.games
    setup = DemoSetup.of(AlfworldEnv(index), ALFWORLD_PROMPTS, load_alfworld_skills(), NAVIGATION)
    mix = bench_demo_mix()
    traced = _traced_episode_class()
    episodes, dropped = [], 0
    for record in records:
        rng = random.Random(f"selskill-bench-retrieval:{seed}:{record.task_id}")
        spec = task_spec(record)
        ep = traced(setup, record, spec, rng, mix, DemoBudget())
        opening = "systematic_search" if spec.task_type == "look_at_obj_in_light" else "pick_and_place"
        if ep.chance(mix.opening_memory):
            ep.call(opening, "opening")
        ep.chance(mix.premature_start)  # the draw `_play` makes, so the rest matches a demo's
        demo, _ = play_on(ep, MixState(), untrained=[])
        if demo is None:
            dropped += 1
            continue
        events, upcoming = [], None
        for prefix, skill in reversed(ep.decisions):
            upcoming = skill or upcoming
            if upcoming:
                events.append(Event(prefix, frozenset({upcoming})))
        episodes.append(Episode("alfworld", record.task_id, ep.decisions[0][0].task, events[::-1]))
    return episodes, games_dir, dropped


@dataclass(frozen=True)
class AlfworldRetrieval:
    """ALFWorld's options of `selskill bench retrieval` (`selskill.skills.retrieval_bench.RetrievalOptions`)."""

    alfworld_games: str | None = None  # None: tiny games generated for this run, removed after
    alfworld_split: str = "valid_seen"
    alfworld_per_type: int = 10  # games per task type when generating

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument(
            "--alfworld-games", help="games root (default: tiny games generated in a temp folder)"
        )
        parser.add_argument("--alfworld-split", default=cls.alfworld_split)
        parser.add_argument(
            "--alfworld-per-type",
            type=int,
            default=cls.alfworld_per_type,
            help="games per task type when generating",
        )

    def episodes(self, bench: RetrievalBench) -> tuple[SkillLibrary, list[Episode], dict]:
        """(ALFWorld's own skills, the expert's labelled episodes, what the result records of them)."""
        from selskill.benchmarks.alfworld import load_alfworld_skills

        own = load_alfworld_skills()
        episodes, root, dropped = alfworld_episodes(
            self.alfworld_games, self.alfworld_split, self.alfworld_per_type, bench.seed
        )
        if self.alfworld_games is None:  # generated for this run only
            shutil.rmtree(root, ignore_errors=True)
            root = (
                f"generated: {self.alfworld_per_type} tiny games per task type, seed {bench.seed} (removed)"
            )
        return (
            own,
            episodes,
            {"games": root, "split": self.alfworld_split, "episodes": len(episodes), "dropped": dropped},
        )
