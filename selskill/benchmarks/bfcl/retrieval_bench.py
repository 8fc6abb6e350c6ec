"""BFCL's labelled episodes for `selskill bench retrieval`.

The ground-truth trajectories (`ground_truth_commands`) replayed through `BfclEnv`, one call
per step. The decision point before each call is an event; relevant are the reference skill
of the call's class (`file_system_reference` for GorillaFileSystem, ...) and every workflow
skill (an executable skill) with a step that calls that function. The strategy skills are
never labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from selskill.benchmarks.bfcl.config import SPLITS
from selskill.skills.model import SkillLibrary
from selskill.skills.retrieval_bench import Episode, Event, RetrievalBench
from selskill.skills.step_records import EpisodePrefix, call_steps

BFCL_REFERENCE_SKILLS = {
    "GorillaFileSystem": "file_system_reference",
    "MathAPI": "math_reference",
    "MessageAPI": "message_reference",
    "TwitterAPI": "twitter_reference",
    "TicketAPI": "ticket_reference",
    "TradingBot": "trading_reference",
    "TravelAPI": "travel_reference",
    "VehicleControlAPI": "vehicle_reference",
}


def _function_classes() -> dict[str, set[str]]:
    from selskill.benchmarks.bfcl.env import BACKEND_CLASSES, function_docs

    out: dict[str, set[str]] = {}
    for cls in BACKEND_CLASSES:
        for doc in function_docs([cls]):
            out.setdefault(doc["name"], set()).add(cls)
    return out


def workflow_functions(library: SkillLibrary) -> dict[str, set[str]]:
    """Executable skill -> the functions its call steps call."""
    from selskill.skills.model import CallStep

    return {
        s.name: {step.call.split("(", 1)[0].strip() for step in s.steps if isinstance(step, CallStep)}
        for s in library.values()
        if s.is_executable
    }


def bfcl_relevant(
    function: str, involved: Sequence[str], fn_classes: dict[str, set[str]], workflows: dict[str, set[str]]
) -> frozenset[str]:
    """The skills relevant to a call of `function`: its class's reference, workflows that call it."""
    refs = {BFCL_REFERENCE_SKILLS[c] for c in fn_classes.get(function, ()) if c in involved}
    flows = {name for name, fns in workflows.items() if function in fns}
    return frozenset(refs | flows)


def bfcl_episodes(
    library: SkillLibrary,
    categories: Sequence[str] | None = None,
    split: str = "test",
    limit: int | None = None,
) -> list[Episode]:
    """One episode per BFCL task of `split`, its events from the replayed ground truth."""
    from selskill.benchmarks.bfcl.decoding import decode
    from selskill.benchmarks.bfcl.env import CATEGORIES, BfclEnv, ground_truth_commands, split_tasks

    missing = sorted(set(BFCL_REFERENCE_SKILLS.values()) - set(library))
    if missing:
        raise ValueError(f"the BFCL library lacks the reference skills {missing}")
    tasks = split_tasks(split, categories or CATEGORIES)
    if limit is not None:
        tasks = tasks[:limit]
    fn_classes, workflows = _function_classes(), workflow_functions(library)
    env = BfclEnv(tasks=tasks)
    episodes = []
    for task in tasks:
        state = env.reset(task.id)
        prefix = EpisodePrefix(task=task.turns[0], observation=state.observation, goal=state.task, api=True)
        events = []
        for command in ground_truth_commands(task):
            calls = decode(command).calls
            if calls:
                relevant = bfcl_relevant(calls[0].name, task.involved_classes, fn_classes, workflows)
                if relevant:
                    events.append(Event(prefix, relevant))
            state = env.step(command)
            prefix = prefix.extend(*call_steps(state.info), observation=state.observation, goal=state.task)
            if state.done:
                break
        episodes.append(Episode("bfcl", task.id, task.turns[0], events))
    return episodes


@dataclass(frozen=True)
class BfclRetrieval:
    """BFCL's options of `selskill bench retrieval` (`selskill.skills.retrieval_bench.RetrievalOptions`)."""

    bfcl_split: str = "test"
    bfcl_limit: int | None = None  # only the first N tasks of the split

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument("--bfcl-split", default=cls.bfcl_split, choices=list(SPLITS))
        parser.add_argument("--bfcl-limit", type=int, help="only the first N tasks of the split")

    def episodes(self, bench: RetrievalBench) -> tuple[SkillLibrary, list[Episode], dict]:
        """(BFCL's own skills, the episodes of the split, what the result records of them)."""
        from selskill.benchmarks.bfcl import load_bfcl_skills

        own = load_bfcl_skills()
        episodes = bfcl_episodes(own, split=self.bfcl_split, limit=self.bfcl_limit)
        return own, episodes, {"split": self.bfcl_split, "episodes": len(episodes)}
