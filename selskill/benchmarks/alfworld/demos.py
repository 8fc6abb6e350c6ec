"""Demonstrations for the offline init policy: realistic expert play with skill calls mixed in.

The init policy must behave like the paper's "RL-Init w/ Skill" (Table 1): it solves many
tasks, but invokes skills too often and at the wrong times, so that SelSkill has something
to fix. Demonstrations are therefore built in two layers.

**The expert** (`selskill.benchmarks.alfworld.expert`) explores instead of knowing where things are: it
reads only what the game tells the agent and visits receptacles in a plausible, systematic
order until it has found, treated and placed the task's objects.

**The mix** inserts skill calls at decision points, each executed for real through
`SkillExecutor` on the same env, so every returned text, error and state change is true,
and the expert continues from wherever the call left it. Rates (`DemoMix` defaults):

| call | when | default |
|---|---|---|
| opening memory (`pick_and_place`; `systematic_search` for look-at tasks) | first turn | 0.6 |
| premature task skill (`heat_object`/`cool_object`/`clean_object`/`examine_with_light`, not yet holding the object: fails `precondition_failed:holding_object`) | right after the opening | 0.6 |
| premature task skill, again | when the target is first seen, before taking it | 0.3 |
| repeat a failed call at once | after a failed call | 0.15 |
| memory after a failure (`recovery_strategy` / `common_mistakes`) | after a failed call | 0.3 |
| useful task skill replacing the manual steps (go to appliance + heat/cool/clean, or find lamp + use) | holding the target, processing still to do | 0.8 |
| `place_held_object` (redundant memory) | holding the finished object, before placing it | 0.15 |
| wrong executable skill (heat/cool/clean in a placement-only task; the paper's Table 8) | holding the target, before placing it | 0.15 |
| `find_second_object` | pick_two, after the first object is placed | 0.6 |
| random memory skill (`systematic_search`, `common_mistakes`, `recovery_strategy`, `pick_and_place`) | any other turn, per turn | 0.03 |
| (no skill) a wrong move: `go to` a receptacle that does not exist, one already searched, or the one the agent is at | any other turn, per turn | 0.1 |
| (no skill listed) the whole game by the expert alone, in the `no_skills` evaluation's prompt | per game | 0.5 |

The wrong moves are there so that the policy sees what follows a mistake: a small policy
trained only on flawless play meets "Nothing happens." for the first time at sampling time
and loops; after an injected mistake the demonstration simply carries on with the expert's
next move (the noise-injection idea of DART). The wrong move itself is context only: its
turn is left out of the SFT loss (`Demo.untrained_turns`), otherwise the policy would learn
to make it. Both were observed: docs/benchmarks.md, "What shaped the init's demonstrations
and SFT".

The rates are set so that sampled demonstrations call skills about as often and as
precisely as the paper's RL-Init (2.55 calls/episode, 70.9% Exec. Prec.; what they give:
docs/benchmarks.md, "Init policy at the `small` scale"). Rates above 0.5 at a fixed,
visible cue (the opening, the premature call, the useful call) are what a greedy policy
reproduces; rates below it give sampled rollouts the variety the branch stage needs.

Messages are built with `selskill.agent.transcript` and the turn-format renderers, and each
decision's skills are listed by `selskill.agent.listings`, so the policy is trained on exactly
the format and listings the episode runner gives it (a run with retrieval builds its init on
its own listings, and the mix only calls skills the decision lists). Every kept
demonstration is verified won within `max_decisions` decisions (assistant turns: the
rounds' step budget counts them so) and `max_env_steps` environment commands (a skill's
actions count); the others are dropped and counted. Everything is deterministic per (seed, task).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from selskill.agent.listings import DecisionListings, first_prefix, prefix_after_action, prefix_after_skill
from selskill.agent.transcript import after_action, after_skill, opening_messages
from selskill.agent.turn_format import TurnFormat, render_action, render_skill_call
from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.benchmarks.alfworld.env import AlfworldEnv, GameIndex, GameRecord, find_games
from selskill.benchmarks.alfworld.episode import NAVIGATION
from selskill.benchmarks.alfworld.expert import Expert, TaskSpec, task_spec, type_of
from selskill.benchmarks.alfworld.init_config import DemoBudget, DemoMix
from selskill.benchmarks.alfworld.turn_format import AlfworldTurnFormat
from selskill.envs.base import EnvError

# The format the offline policy is trained and sampled with (the runner must use the same).
from selskill.sft.demos import Demo, DemoPrompts, DemoReport, DemoSetup
from selskill.skills import SkillCallRecord, SkillLibrary, render_listing

DEMO_FORMAT = AlfworldTurnFormat(style="compact", show_admissible_commands=True, admissible_style="local")
DEMO_LISTING_STYLE = "compact"

TASK_SKILL = {
    "pick_heat_then_place_in_recep": "heat_object",
    "pick_cool_then_place_in_recep": "cool_object",
    "pick_clean_then_place_in_recep": "clean_object",
    "look_at_obj_in_light": "examine_with_light",
}
PLACE_ONLY = ("pick_and_place_simple", "pick_two_obj_and_place")
WRONG_EXECUTABLE = ("heat_object", "cool_object", "clean_object")
RANDOM_MEMORY = ("systematic_search", "common_mistakes", "recovery_strategy", "pick_and_place")
AFTER_FAILURE_MEMORY = ("recovery_strategy", "common_mistakes")


ALFWORLD_PROMPTS = DemoPrompts(DEMO_FORMAT, DEMO_LISTING_STYLE)


# --- one demonstration ----------------------------------------------------------------------


class DemoEpisode:
    """Drives env + executor for one demo and writes the transcript as the runner would.

    The setup's `listings` say what each decision is shown, as the episode host shows it; a
    call the mix draws for a skill that decision does not list is not made (`call` returns
    None), since the parser would reject it in a rollout. The episode ends as the runner ends
    one: after `budget.max_decisions` assistant turns or `budget.max_env_steps` commands.
    """

    def __init__(self, setup: DemoSetup, record, spec, rng, mix: DemoMix, budget: DemoBudget):
        self.env, self.executor, self.fmt = setup.env, setup.executor, setup.fmt
        self.record, self.spec, self.rng, self.mix = record, spec, rng, mix
        self.max_env_steps, self.max_decisions = budget.max_env_steps, budget.max_decisions
        self.listings: DecisionListings = setup.listings
        self.state = self.env.reset(record.task_id)
        self.prefix = first_prefix(self.state)
        self.listed = self.listings.listed(self.prefix)
        self.messages = opening_messages(
            self.fmt, self.listings.system_listing(self.listed, setup.listing), self.state
        )
        self.messages[-1] = self.listings.step_message(self.messages[-1], self.listed)
        self.expert = Expert(spec, self.state, search=mix.search)
        self.env_steps = 0
        self.calls: list[dict] = []

    @property
    def n_turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "assistant")

    @property
    def over(self) -> bool:
        return (
            self.state.won
            or self.state.done
            or self.n_turns >= self.max_decisions
            or self.env_steps >= self.max_env_steps
        )

    def _reply(self, message: dict) -> None:
        """Append the answer to a turn, with the next decision's listing where it has one."""
        if not self.over:
            self.listed, message = self.listings.after_turn(self.prefix, message, self.listed)
        self.messages.append(message)

    def act(self, command: str, text: str | None = None) -> None:
        """Play `command`; `text` is the assistant turn that said it (default: as the expert writes it)."""
        self.messages.append(self.fmt.assistant_message(render_action(command) if text is None else text))
        self.state = self.env.step(command)
        self.env_steps += self.state.env_steps
        self.expert.observe(command, self.state)
        self.prefix = prefix_after_action(self.prefix, command, self.state.observation)
        self._reply(after_action(self.fmt, self.state))

    def run_call(self, name: str, text: str | None = None, arguments: dict | None = None) -> SkillCallRecord:
        """Say and execute a call of `name` (`text`: the assistant turn, default the expert's)."""
        self.messages.append(self.fmt.assistant_message(render_skill_call(name) if text is None else text))
        rec = self.executor.execute(self.env, name, arguments)
        self.state = self.env.state
        self.env_steps += rec.env_steps
        self.expert.observe_skill(rec, self.state)
        self.prefix = prefix_after_skill(self.prefix, self.executor.library, name, rec)
        self._reply(after_skill(self.fmt, rec.observation, self.state))
        return rec

    def call(self, name: str, role: str) -> SkillCallRecord | None:
        """A mixed-in call, recorded among the demo's calls; None where `name` is not listed."""
        if name not in self.listed:
            return None
        rec = self._recorded_call(name, role)
        if not rec.precise and not self.over:
            self._after_failure(name)
        return rec

    def _recorded_call(self, name: str, role: str) -> SkillCallRecord:
        rec = self.run_call(name)
        self.calls.append({"role": role, "skill": name, "precise": rec.precise, "error": rec.error,
                           "env_steps": rec.env_steps, "turn": self.n_turns - 1})  # fmt: skip
        return rec

    def _after_failure(self, name: str) -> None:
        if self.rng.random() < self.mix.repeat_failed and name in self.listed:
            self._recorded_call(name, "repeat")
        if not self.over and self.rng.random() < self.mix.after_failure_memory:
            self.call(self.rng.choice(AFTER_FAILURE_MEMORY), "after_failure")

    def chance(self, rate: float) -> bool:
        # one draw per decision point, whatever the rate, so changing one rate does not
        # reshuffle every later decision of the episode
        return self.rng.random() < rate


def _mistake(ex: Expert, rng: random.Random) -> str:
    """A wrong move of the kinds a small policy makes: a receptacle that does not exist (a
    listed type with the next number), one already searched, or the one it stands at."""
    t = rng.choice(sorted({type_of(r) for r in ex.receptacles}))
    n = max(int(r.rsplit(" ", 1)[1]) for r in ex.receptacles if type_of(r) == t) + 1
    options = [f"go to {t} {n}"]
    searched = sorted(r for r in ex.contents if r != ex.loc and r in ex.receptacles)
    if searched:
        options.append(f"go to {rng.choice(searched)}")
    if ex.loc:
        options.append(f"go to {ex.loc}")
    return rng.choice(options)


@dataclass
class MixState:
    """Which once-per-episode mix decisions have been taken (so a resumed episode skips them)."""

    seen_done: bool = False
    treat_done: bool = False
    placing_for: set = field(default_factory=set)
    second_done: bool = False
    false_taken: set = field(default_factory=set)  # receptacles where a false take was injected

    def note(self, ex: Expert, spec: TaskSpec) -> None:
        """Mark the decisions of the expert's current phase as taken (a turn someone else played)."""
        phase = ex.phase()
        self.seen_done |= phase == "fetch"
        self.treat_done |= phase in ("treat", "light")
        if phase == "place":
            self.placing_for.add(ex.holding)
        self.second_done |= spec.n_objects == 2 and len(ex.placed) == 1 and not ex.holding


def _play(ep: DemoEpisode):
    """`ep` from its start, the opening's calls first. Returns (Demo, None) or (None, drop reason)."""
    spec, mix = ep.spec, ep.mix
    task_skill = TASK_SKILL.get(spec.task_type)
    if ep.chance(mix.opening_memory):
        ep.call(
            "systematic_search" if spec.task_type == "look_at_obj_in_light" else "pick_and_place", "opening"
        )
    premature_start = ep.chance(mix.premature_start)
    if task_skill and premature_start:
        ep.call(task_skill, "premature")
    return play_on(ep, MixState(), untrained=[])


def play_on(ep: DemoEpisode, done: MixState, untrained: list[int]):
    """The expert (with the skill-call mix) plays `ep` from where it stands to its end.

    Returns (Demo, None) or (None, drop reason). `untrained` lists assistant turns already
    in `ep` that are context only; the injected wrong moves are added to it.
    """
    spec, mix = ep.spec, ep.mix
    task_skill = TASK_SKILL.get(spec.task_type)
    # `ep.call` is None for a skill the decision does not list: the expert plays on instead
    while not ep.over:
        ex = ep.expert
        phase = ex.phase()
        r_random = ep.chance(mix.random_memory)
        if phase == "fetch" and not done.seen_done:
            done.seen_done = True
            if ep.chance(mix.premature_seen) and task_skill and ep.call(task_skill, "premature"):
                continue
        if phase in ("treat", "light") and not done.treat_done:
            done.treat_done = True
            if ep.chance(mix.useful) and ep.call(task_skill, "useful"):
                continue
        if phase == "place" and ex.holding not in done.placing_for:
            done.placing_for.add(ex.holding)
            place_mem, wrong = ep.chance(mix.place_memory), ep.chance(mix.wrong_executable)
            if (
                spec.task_type in PLACE_ONLY
                and wrong
                and ep.call(ep.rng.choice(WRONG_EXECUTABLE), "wrong_exec")
            ):
                continue
            if place_mem and ep.call("place_held_object", "place_memory"):
                continue
        if spec.n_objects == 2 and len(ex.placed) == 1 and not ex.holding and not done.second_done:
            done.second_done = True
            if ep.chance(mix.second_memory) and ep.call("find_second_object", "second_memory"):
                continue
        if r_random and ep.call(ep.rng.choice(RANDOM_MEMORY), "random_memory"):
            continue
        if ep.chance(mix.mistake):
            untrained.append(ep.n_turns)
            ep.act(_mistake(ex, ep.rng))
            continue
        if (
            mix.false_take > 0
            and phase == "search"
            and ex.loc in ex.contents
            and ex.loc not in done.false_taken
            and not ex.holding
        ):
            done.false_taken.add(ex.loc)
            if ep.chance(mix.false_take):
                untrained.append(ep.n_turns)
                ep.act(f"take {spec.obj} {ep.rng.randint(1, 3)} from {ex.loc}")
                continue
        command = ex.next_command()
        if command is None:
            return None, "expert_stuck"
        ep.act(command)
    # the opening's calls (made before `over` is checked) and an executable skill's commands
    # can overshoot a budget: such a demonstration was not won within it
    if not ep.state.won or ep.n_turns > ep.max_decisions or ep.env_steps > ep.max_env_steps:
        return None, "step_limit"
    calls = ep.calls
    return (
        Demo(
            skills_listed=bool(ep.listings.library),
            task_id=ep.record.task_id,
            task_type=ep.record.task_type,
            messages=ep.messages,
            n_skill_calls=len(calls),
            n_precise=sum(1 for c in calls if c["precise"]),
            env_steps=ep.env_steps,
            calls=calls,
            untrained_turns=untrained,
        ),
        None,
    )


def build_demos(
    games: GameIndex | Sequence[GameRecord] | str | Path,
    *,
    prompts: DemoPrompts = ALFWORLD_PROMPTS,
    mix: DemoMix | None = None,
    budget: DemoBudget | None = None,
    seed: int = 0,
    split: str = "train",
    progress: bool = False,
) -> DemoReport:
    """Play every game once (expert + mixed skill calls); keep the won episodes.

    The prompts' library is what the episodes may call and their retriever (over it) what each
    decision lists, as the rounds' episode host will (`selskill.agent.listings`): an init meant
    for retrieval rounds is trained on their prompts.
    """
    mix = mix or DemoMix()
    budget = budget or DemoBudget()
    if isinstance(games, (str, Path)):
        games = find_games(games, split)
    records = list(games.games if isinstance(games, GameIndex) else games)
    setup = DemoSetup.of(AlfworldEnv(records), prompts, load_alfworld_skills(), NAVIGATION)
    report = DemoReport(demos=[])
    iterator: Iterable[GameRecord] = records
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(records, desc="demos", unit="game")
    bare = setup.without_skills() if mix.no_skills else None
    for record in iterator:
        report.attempted += 1
        rng = random.Random(f"selskill-demo:{seed}:{record.task_id}")
        # its own draw, so that the share does not reshuffle the calls of the games played with skills
        unlisted = (
            bare is not None
            and random.Random(f"selskill-demo-bare:{seed}:{record.task_id}").random() < mix.no_skills
        )
        try:
            demo, reason = _play(
                DemoEpisode(bare if unlisted else setup, record, task_spec(record), rng, mix, budget)
            )
        except (EnvError, OSError, ValueError, KeyError) as exc:
            demo, reason = None, f"error:{type(exc).__name__}"
        if demo is None:
            report.dropped[reason] += 1
        else:
            report.demos.append(demo)
    return report


def make_demos(games, **kwargs) -> list[Demo]:
    """`build_demos(...).demos`: the winning demonstrations only."""
    return build_demos(games, **kwargs).demos


def tokenizer_corpus(
    demos: Iterable[Demo],
    library: SkillLibrary | None = None,
    fmt: TurnFormat = DEMO_FORMAT,
    listing_style: str = DEMO_LISTING_STYLE,
) -> Iterator[str]:
    """Texts to train the tokenizer on: the system prompt, skill texts, every demo message."""
    library = library or load_alfworld_skills()
    yield fmt.system_text(render_listing(library, style=listing_style))
    for skill in library.values():
        yield skill.description
        yield skill.body
        yield render_skill_call(skill.name)
    for demo in demos:
        for message in demo.messages:
            if message["role"] != "system":  # one copy above is enough
                yield message["content"]
