"""Demonstrations for the offline init policy: realistic expert play with skill calls mixed in.

The init policy must behave like the paper's "RL-Init w/ Skill" (Table 1): it solves many
tasks, but invokes skills too often and at the wrong times, so that SelSkill has something
to fix. Demonstrations are therefore built in two layers.

**The expert** explores instead of knowing where things are. It reads only what the game
tells the agent: the receptacles named in the first observation, what each observation
says is on or in a receptacle, whether a receptacle is closed, and the admissible
commands. It visits receptacles in a plausible, systematic order and opens closed ones
until it sees the target, takes it, heats/cools/cleans it at the appliance if the task
asks, finds a desk lamp for look-at tasks, and places the object (twice for pick_two).
Search order: receptacle types where ALFWorld's train split usually keeps the object
(placement prior share >= `COMMON_SHARE`) first, then types that can hold it, then the
rest; within a tier by name, lowest number first (what `systematic_search` advises). The
task's parent receptacle type is not searched (the task says the object must get there).
A lamp is looked for where `examine_with_light` looks (sidetable, desk, dresser,
coffeetable, shelf), remembering any lamp already seen. What the expert knows of the task
(object type, target type, whether heat/cool/clean/light is needed) is what the task
sentence says; it is read from the game's `traj_data.json`, from which that sentence is
generated.

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

The wrong moves are there so that the policy sees what follows a mistake: a small policy
trained only on flawless play meets "Nothing happens." for the first time at sampling time
and loops (measured: it hallucinates "drawer 2" in a room with one drawer, then repeats
it); after an injected mistake the demonstration simply carries on with the expert's next
move (the noise-injection idea of DART). The wrong move itself is context only: its turn
is left out of the SFT loss (`Demo.untrained_turns`), otherwise the policy would learn to
make it (measured: trained on, they taught "go to desk 1" while standing at desk 1).

With these rates a sampled demonstration averages about 2.5 skill calls with roughly 70%
executed precisely (the paper's RL-Init: 2.55 calls/episode, 70.9% Exec. Prec.). Rates
above 0.5 at a fixed, visible cue (the opening, the premature call, the useful call) are
what a greedy policy reproduces; rates below it give sampled rollouts the variety the
branch stage needs.

Messages are built with `selskill.agent.transcript` and the turn-format renderers, so the
policy is trained on exactly the format the episode runner gives it. Every kept
demonstration is verified won within `max_env_steps` environment steps (skill actions
count); the others are dropped and counted. Everything is deterministic per (seed, task).
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from selskill.agent.parser import parse_turn
from selskill.agent.transcript import after_action, after_skill, opening_messages
from selskill.agent.turn_format import TurnFormat, render_action, render_skill_call
from selskill.envs.alfworld import TRAJ_FILE, AlfworldEnv, GameIndex, GameRecord, find_games
from selskill.envs.base import EnvError, EnvState
from selskill.skills import SkillCallRecord, SkillExecutor, SkillLibrary, load_alfworld_skills, render_listing
from selskill.skills.executor import natural_key

# The format the offline policy is trained and sampled with (the runner must use the same).
DEMO_FORMAT = TurnFormat(style="compact", show_admissible_commands=True, admissible_style="local")
DEMO_LISTING_STYLE = "compact"
DEFAULT_MAX_ENV_STEPS = 50

# A receptacle type holding at least this share of an object type's placements in the
# prior is searched first.
COMMON_SHARE = 0.15

TASK_SKILL = {
    "pick_heat_then_place_in_recep": "heat_object",
    "pick_cool_then_place_in_recep": "cool_object",
    "pick_clean_then_place_in_recep": "clean_object",
    "look_at_obj_in_light": "examine_with_light",
}
APPLIANCE = {
    "pick_heat_then_place_in_recep": ("microwave", "heat"),
    "pick_cool_then_place_in_recep": ("fridge", "cool"),
    "pick_clean_then_place_in_recep": ("sinkbasin", "clean"),
}
PLACE_ONLY = ("pick_and_place_simple", "pick_two_obj_and_place")
WRONG_EXECUTABLE = ("heat_object", "cool_object", "clean_object")
RANDOM_MEMORY = ("systematic_search", "common_mistakes", "recovery_strategy", "pick_and_place")
AFTER_FAILURE_MEMORY = ("recovery_strategy", "common_mistakes")
LAMP_VISIT = ("sidetable", "desk", "dresser", "coffeetable", "shelf")  # examine_with_light's order
LAMP = "desklamp"

ROLES = ("opening", "premature", "repeat", "after_failure", "useful", "place_memory", "wrong_exec",
         "second_memory", "random_memory")  # fmt: skip


SEARCH_ORDERS = ("prior", "sweep")


@dataclass(frozen=True)
class DemoMix:
    """Rates at which skill calls are mixed into the expert's play (module docstring)."""

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


# --- what the agent can read from the game's text -----------------------------------------

_NAME_RE = re.compile(r"\b([a-z]+ \d+)\b")
_ROOM_RE = re.compile(r"Looking quickly around you, you see (.*?)\.\s*$", re.M)
_ARRIVE_RE = re.compile(r"^You arrive at ([a-z]+ \d+)\.")  # "drawer 8", or old grammar's "loc 12"
_OPEN_RE = re.compile(r"^You open the ([a-z]+ \d+)\.")
_EXAMINE_SEE_RE = re.compile(
    r"^(?:On the [a-z]+ \d+, you see|The [a-z]+ \d+ is open\. In it, you see) (.*?)\.?\s*$", re.S
)
_SEE_RE = re.compile(r"you see (.*?)\.?\s*$", re.S)
_CLOSED_RE = re.compile(r"The ([a-z]+ \d+) is closed\.")


def _type_of(name: str) -> str:
    return name.rsplit(" ", 1)[0]


def _names(text: str) -> list[str]:
    return _NAME_RE.findall(text)


def _skill_chunks(text: str) -> list[tuple[str, str]]:
    """(command, observation) pairs of a skill's returned text ("> cmd" lines then feedback)."""
    chunks: list[tuple[str, str]] = []
    for line in text.splitlines():
        if line.startswith("> "):
            chunks.append((line[2:].strip(), ""))
        elif chunks:
            cmd, obs = chunks[-1]
            chunks[-1] = (cmd, (obs + "\n" + line).strip())
    return chunks


@dataclass(frozen=True)
class TaskSpec:
    """What the task sentence says: object, target receptacle type, the treatment needed."""

    task_type: str
    obj: str  # object type as the game writes it, e.g. "potato"
    parent: str  # receptacle type, e.g. "countertop" ("" for look-at tasks)
    n_objects: int
    # a game not generated by us (no `selskill` block in its traj_data): there a target may
    # start on a receptacle of the parent type (the lettuce to cool and put on a countertop
    # lies on one, a ladle to clean is only on countertops), so those are searched too;
    # generated scenes never do that, and their search skips the parent type
    real_scene: bool = False

    @classmethod
    def from_traj(cls, traj: dict) -> TaskSpec:
        params = traj.get("pddl_params") or {}
        task_type = traj["task_type"]
        return cls(
            task_type=task_type,
            obj=str(params.get("object_target", "")).lower(),
            parent=str(params.get("parent_target", "")).lower(),
            n_objects=2 if task_type == "pick_two_obj_and_place" else 1,
            real_scene="selskill" not in traj,
        )


def _prior_by_object() -> dict[str, dict[str, int]]:
    from selskill.envs.alfworld_gen import load_placement_prior

    by_obj: dict[str, dict[str, int]] = {}
    for rtype, counts in load_placement_prior().items():
        for otype, n in counts.items():
            by_obj.setdefault(otype.lower(), {})[rtype.lower()] = n
    return by_obj


def _can_hold() -> dict[str, set[str]]:
    from alfworld.gen import constants

    return {r.lower(): {o.lower() for o in objs} for r, objs in constants.VAL_RECEPTACLE_OBJECTS.items()}


_PRIOR: dict | None = None
_HOLD: dict | None = None


def search_order(
    receptacles: Sequence[str], obj: str, exclude_type: str = "", style: str = "prior"
) -> list[str]:
    """The order the expert visits receptacles in when looking for an object of type `obj`.

    "prior": likely receptacle types first (alfworld's placement statistics), then by name;
    "sweep": every receptacle by name, whatever the object, so that the next place to look
    is a rule a small policy can read off the admissible commands (the one after where it
    stands) instead of a table of object-receptacle statistics it must memorise.
    """
    global _PRIOR, _HOLD
    if style == "sweep":
        return sorted((r for r in receptacles if _type_of(r) != exclude_type), key=natural_key)
    if _PRIOR is None:
        _PRIOR, _HOLD = _prior_by_object(), _can_hold()
    if obj == LAMP:
        rank = {t: i for i, t in enumerate(LAMP_VISIT)}
        return sorted(
            (r for r in receptacles if _type_of(r) != exclude_type),
            key=lambda r: (rank.get(_type_of(r), len(rank)), natural_key(r)),
        )
    counts = _PRIOR.get(obj, {})
    total = sum(counts.values()) or 1

    def tier(r: str) -> int:
        t = _type_of(r)
        if counts.get(t, 0) / total >= COMMON_SHARE:
            return 0
        if counts.get(t, 0) > 0 or obj in _HOLD.get(t, ()):
            return 1
        return 2

    return sorted(
        (r for r in receptacles if _type_of(r) != exclude_type), key=lambda r: (tier(r), natural_key(r))
    )


class Expert:
    """Plays a task from what the observations say; `next_command()` is its next manual step."""

    def __init__(self, spec: TaskSpec, first: EnvState, search: str = "prior"):
        self.spec = spec
        match = _ROOM_RE.search(first.observation)
        self.receptacles: list[str] = _names(match.group(1)) if match else []
        if not self.receptacles:
            raise ValueError("the first observation names no receptacles")
        self.loc: str | None = None
        self.contents: dict[str, list[str]] = {}  # receptacle -> objects last seen there
        self.closed: set[str] = set()
        self.holding: str | None = None
        self.treated: set[str] = set()  # objects heated/cooled/cleaned
        self.placed: list[str] = []
        self.parent: str | None = None  # the parent instance everything goes to
        self.admissible: list[str] = list(first.admissible_commands)
        self.won = False
        self.order = search_order(
            self.receptacles, spec.obj, exclude_type="" if spec.real_scene else spec.parent, style=search
        )
        self.lamp_order = search_order(self.receptacles, LAMP, style=search)

    # --- reading feedback -------------------------------------------------------------
    def _read(self, command: str, observation: str) -> None:
        obs = observation.strip()
        m = _ARRIVE_RE.match(obs)
        if m:
            # old grammar names the place ("loc 12"), not the receptacle: the command does
            self.loc = m.group(1) if not m.group(1).startswith("loc ") else command.removeprefix("go to ")
        opened = _OPEN_RE.match(obs)
        if opened:
            self.closed.discard(opened.group(1))
        m = _CLOSED_RE.search(obs)
        if m and self.loc == m.group(1):
            self.closed.add(self.loc)
        if self.loc and (m := _SEE_RE.search(obs)) and (obs.startswith(("You arrive", "You open"))):
            # what an open shows belongs to the opened receptacle, which in real scenes may be
            # another one at the same place (in generated scenes it is always `loc`)
            self.contents[opened.group(1) if opened else self.loc] = _names(m.group(1))
        if command.startswith("examine "):
            self._read_examine(command.removeprefix("examine "), obs)
        if obs.startswith("You pick up the "):
            obj = obs[len("You pick up the ") :].split(" from ", 1)[0]
            self.holding = obj
            for items in self.contents.values():
                if obj in items:
                    items.remove(obj)
        elif obs.startswith("You move the "):
            obj, _, dest = obs[len("You move the ") :].rstrip(".").partition(" to the ")
            self.holding = None
            self.contents.setdefault(dest, []).append(obj)
            if _type_of(obj) == self.spec.obj and _type_of(dest) == self.spec.parent:
                self.placed.append(obj)
        elif re.match(r"^You (heat|cool|clean) the ", obs):
            self.treated.add(obs.split(" the ", 1)[1].split(" using ", 1)[0])

    def _read_examine(self, receptacle: str, obs: str) -> None:
        """What `examine R` says of a receptacle not looked into yet (one sharing the agent's place)."""
        if receptacle not in self.receptacles or receptacle in self.contents:
            return
        if obs == f"The {receptacle} is closed.":
            self.closed.add(receptacle)
        elif m := _EXAMINE_SEE_RE.match(obs):
            self.contents[receptacle] = _names(m.group(1))
        else:
            self.contents[receptacle] = []  # unreadable: do not examine it again

    def observe(self, command: str, state: EnvState) -> None:
        self._read(command, state.observation)
        self.admissible = list(state.admissible_commands)
        self.won = state.won

    def observe_skill(self, record: SkillCallRecord, state: EnvState) -> None:
        for command, observation in _skill_chunks(record.observation):
            self._read(command, observation)
        self.admissible = list(state.admissible_commands)
        self.won = state.won

    # --- deciding -----------------------------------------------------------------------
    def _is_target(self, name: str) -> bool:
        return _type_of(name) == self.spec.obj and name not in self.placed

    @property
    def needs_treatment(self) -> bool:
        return (
            self.spec.task_type in APPLIANCE and self.holding is not None and self.holding not in self.treated
        )

    @property
    def holds_target(self) -> bool:
        return self.holding is not None and _type_of(self.holding) == self.spec.obj

    def known_targets(self) -> list[tuple[str, str]]:
        """(object, receptacle) of targets seen and not yet used, the nearest (here) first."""
        found = [
            (o, r)
            for r, items in self.contents.items()
            for o in items
            if self._is_target(o)
            and r != self.parent
            and (self.spec.real_scene or _type_of(r) != self.spec.parent)
        ]
        return sorted(found, key=lambda x: (x[1] != self.loc, natural_key(x[1]), natural_key(x[0])))

    def here(self, receptacle: str) -> bool:
        """The agent can act on `receptacle` without moving.

        In real scenes several receptacles share one place (at drawer 7, `go to drawer 8` is
        not admissible but `examine`/`open drawer 8` are); generated scenes give each its own
        place, where this is just `loc == receptacle`.
        """
        return self.loc == receptacle or (
            f"go to {receptacle}" not in self.admissible and f"examine {receptacle}" in self.admissible
        )

    def _shares_place(self, receptacle: str) -> bool:
        return self.loc != receptacle and self.here(receptacle)

    def sees_target_here(self) -> bool:
        return any(r == self.loc for _, r in self.known_targets())

    def phase(self) -> str:
        """search | fetch | treat | light | place"""
        if self.holds_target:
            if self.spec.task_type == "look_at_obj_in_light":
                return "light"
            return "treat" if self.needs_treatment else "place"
        return "fetch" if self.known_targets() else "search"

    def _goto_or(self, receptacle: str, then: str) -> str:
        if not self.here(receptacle):
            return f"go to {receptacle}"
        if receptacle in self.closed or (
            self._shares_place(receptacle) and f"open {receptacle}" in self.admissible
        ):
            return f"open {receptacle}"
        return then

    def _explore(self, order: Sequence[str]) -> str | None:
        for r in order:
            if r in self.contents:
                continue  # already looked inside
            if self.loc == r:
                return f"open {r}" if r in self.closed else None
            if self._shares_place(r):
                return f"open {r}" if f"open {r}" in self.admissible else f"examine {r}"
            return f"go to {r}"
        return None

    def next_command(self) -> str | None:
        """The next manual command, or None when the expert has nowhere left to look."""
        phase = self.phase()
        if phase == "light":
            use = [c for c in self.admissible if c.startswith(f"use {LAMP} ")]
            if use:
                return use[0]
            seen = [r for r in self.lamp_order if any(_type_of(o) == LAMP for o in self.contents.get(r, []))]
            if seen:
                return f"go to {seen[0]}"
            return self._explore(self.lamp_order)
        if phase == "treat":
            appliance_type, verb = APPLIANCE[self.spec.task_type]
            candidates = [r for r in self.receptacles if _type_of(r) == appliance_type]
            if not candidates:
                return None  # nothing in the room that the task's verb works with
            here = sorted((c for c in candidates if self.here(c)), key=natural_key)
            appliance = (
                self.loc if self.loc in candidates else (here or [min(candidates, key=natural_key)])[0]
            )
            if not self.here(appliance):
                return f"go to {appliance}"
            return f"{verb} {self.holding} with {appliance}"
        if phase == "place":
            if self.parent is None:
                parents = [r for r in self.receptacles if _type_of(r) == self.spec.parent]
                if not parents:
                    return None
                # the one here, else the lowest-numbered one
                here = sorted((r for r in parents if self.here(r)), key=natural_key)
                self.parent = (
                    self.loc if self.loc in parents else (here or [min(parents, key=natural_key)])[0]
                )
            return self._goto_or(self.parent, f"move {self.holding} to {self.parent}")
        if phase == "fetch":
            obj, where = self.known_targets()[0]
            return self._goto_or(where, f"take {obj} from {where}")
        return self._explore(self.order)


# --- one demonstration ----------------------------------------------------------------------


class DemoEpisode:
    """Drives env + executor for one demo and writes the transcript as the runner would."""

    def __init__(self, env, executor, fmt, listing, record, spec, rng, mix, max_env_steps):
        self.env, self.executor, self.fmt = env, executor, fmt
        self.record, self.spec, self.rng, self.mix = record, spec, rng, mix
        self.max_env_steps = max_env_steps
        self.state = env.reset(record.task_id)
        self.messages = opening_messages(fmt, listing, self.state)
        self.expert = Expert(spec, self.state, search=mix.search)
        self.env_steps = 0
        self.calls: list[dict] = []

    @property
    def n_turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "assistant")

    @property
    def over(self) -> bool:
        # the turn cap only guards against a run of calls that consume no environment steps
        return (
            self.state.won
            or self.state.done
            or self.env_steps >= self.max_env_steps
            or self.n_turns >= 2 * self.max_env_steps
        )

    def act(self, command: str, text: str | None = None) -> None:
        """Play `command`; `text` is the assistant turn that said it (default: as the expert writes it)."""
        self.messages.append(self.fmt.assistant_message(render_action(command) if text is None else text))
        self.state = self.env.step(command)
        self.env_steps += self.state.env_steps
        self.expert.observe(command, self.state)
        self.messages.append(after_action(self.fmt, self.state))

    def call(self, name: str, role: str) -> SkillCallRecord:
        self.messages.append(self.fmt.assistant_message(render_skill_call(name)))
        rec = self.executor.execute(self.env, name, None)
        self.state = self.env.state
        self.env_steps += rec.env_steps
        self.expert.observe_skill(rec, self.state)
        self.messages.append(after_skill(self.fmt, rec.observation, self.state))
        self.calls.append(
            {
                "role": role,
                "skill": name,
                "precise": rec.precise,
                "error": rec.error,
                "env_steps": rec.env_steps,
                "turn": self.n_turns - 1,
            }
        )
        if not rec.precise and not self.over:
            self._after_failure(name)
        return rec

    def _after_failure(self, name: str) -> None:
        if self.rng.random() < self.mix.repeat_failed:
            self.messages.append(self.fmt.assistant_message(render_skill_call(name)))
            rec = self.executor.execute(self.env, name, None)
            self.state = self.env.state
            self.env_steps += rec.env_steps
            self.expert.observe_skill(rec, self.state)
            self.messages.append(after_skill(self.fmt, rec.observation, self.state))
            self.calls.append(
                {
                    "role": "repeat",
                    "skill": name,
                    "precise": rec.precise,
                    "error": rec.error,
                    "env_steps": rec.env_steps,
                    "turn": self.n_turns - 1,
                }
            )
        if not self.over and self.rng.random() < self.mix.after_failure_memory:
            self.call(self.rng.choice(AFTER_FAILURE_MEMORY), "after_failure")

    def chance(self, rate: float) -> bool:
        # one draw per decision point, whatever the rate, so changing one rate does not
        # reshuffle every later decision of the episode
        return self.rng.random() < rate


def _mistake(ex: Expert, rng: random.Random) -> str:
    """A wrong move of the kinds a small policy makes: a receptacle that does not exist (a
    listed type with the next number), one already searched, or the one it stands at."""
    t = rng.choice(sorted({_type_of(r) for r in ex.receptacles}))
    n = max(int(r.rsplit(" ", 1)[1]) for r in ex.receptacles if _type_of(r) == t) + 1
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


def _play(env, executor, fmt, listing, record: GameRecord, spec: TaskSpec, rng, mix: DemoMix, max_env_steps):
    """Returns (Demo, None) or (None, drop reason)."""
    ep = DemoEpisode(env, executor, fmt, listing, record, spec, rng, mix, max_env_steps)
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
    while not ep.over:
        ex = ep.expert
        phase = ex.phase()
        r_random = ep.chance(mix.random_memory)
        if phase == "fetch" and not done.seen_done:
            done.seen_done = True
            if ep.chance(mix.premature_seen) and task_skill:
                ep.call(task_skill, "premature")
                continue
        if phase in ("treat", "light") and not done.treat_done:
            done.treat_done = True
            if ep.chance(mix.useful):
                ep.call(task_skill, "useful")
                continue
        if phase == "place" and ex.holding not in done.placing_for:
            done.placing_for.add(ex.holding)
            place_mem, wrong = ep.chance(mix.place_memory), ep.chance(mix.wrong_executable)
            if spec.task_type in PLACE_ONLY and wrong:
                ep.call(ep.rng.choice(WRONG_EXECUTABLE), "wrong_exec")
                continue
            if place_mem:
                ep.call("place_held_object", "place_memory")
                continue
        if spec.n_objects == 2 and len(ex.placed) == 1 and not ex.holding and not done.second_done:
            done.second_done = True
            if ep.chance(mix.second_memory):
                ep.call("find_second_object", "second_memory")
                continue
        if r_random:
            ep.call(ep.rng.choice(RANDOM_MEMORY), "random_memory")
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
    if not ep.state.won:
        return None, "step_limit"
    if ep.env_steps > ep.max_env_steps:
        return None, "step_limit"
    calls = ep.calls
    return (
        Demo(
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


def task_spec(record: GameRecord) -> TaskSpec:
    """What the task sentence of `record`'s game says (read from its `traj_data.json`)."""
    return TaskSpec.from_traj(json.loads((Path(record.path).parent / TRAJ_FILE).read_text()))


def play_expert(
    env, record: GameRecord, max_env_steps: int = DEFAULT_MAX_ENV_STEPS, search: str = "prior"
) -> tuple[list[str], EnvState, str | None]:
    """The bare expert (no skill calls, no injected mistakes) plays one game from its start.

    Returns (commands, final state, None if won else why not: "expert_stuck" or
    "step_limit"). It plays exactly as `build_demos` with `DemoMix.none()` does; `verify-games`
    uses it to show that a game without a stored walkthrough (real ALFWorld data) is winnable.
    """
    state = env.reset(record.task_id)
    expert = Expert(task_spec(record), state, search=search)
    commands: list[str] = []
    while not (state.won or state.done) and len(commands) < max_env_steps:
        command = expert.next_command()
        if command is None:
            return commands, state, "expert_stuck"
        state = env.step(command)
        commands.append(command)
        expert.observe(command, state)
    return commands, state, None if state.won else "step_limit"


def build_demos(
    games: GameIndex | Sequence[GameRecord] | str | Path,
    *,
    mix: DemoMix | None = None,
    seed: int = 0,
    split: str = "train",
    fmt: TurnFormat = DEMO_FORMAT,
    listing_style: str = DEMO_LISTING_STYLE,
    library: SkillLibrary | None = None,
    max_env_steps: int = DEFAULT_MAX_ENV_STEPS,
    progress: bool = False,
) -> DemoReport:
    """Play every game once (expert + mixed skill calls); keep the won episodes."""
    mix = mix or DemoMix()
    if isinstance(games, (str, Path)):
        games = find_games(games, split)
    records = list(games.games if isinstance(games, GameIndex) else games)
    library = library or load_alfworld_skills()
    executor = SkillExecutor(library)
    listing = render_listing(library, style=listing_style)
    env = AlfworldEnv(records)
    report = DemoReport(demos=[])
    iterator: Iterable[GameRecord] = records
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(records, desc="demos", unit="game")
    for record in iterator:
        report.attempted += 1
        rng = random.Random(f"selskill-demo:{seed}:{record.task_id}")
        try:
            spec = task_spec(record)
            demo, reason = _play(env, executor, fmt, listing, record, spec, rng, mix, max_env_steps)
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
        "env_steps_mean": (sum(d.env_steps for d in demos) / n) if n else 0.0,
        "env_steps_max": max((d.env_steps for d in demos), default=0),
        "turns_mean": (sum(d.n_turns for d in demos) / n) if n else 0.0,
        "mistakes_per_demo": (sum(len(d.untrained_turns) for d in demos) / n) if n else 0.0,
        "calls_by_role": dict(sorted(by_role.items())),
        "calls_by_skill": dict(sorted(by_skill.items())),
        "failed_calls_by_error": dict(sorted(errors.items())),
    }


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
