"""The skill executor against alfworld's real PDDL engine on tiny hand-written games.

Each game is built for one behaviour (a microwave present or not, a lamp on the second
surface, ...), so a failing test names the behaviour rather than a random scene.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.benchmarks.alfworld.env import AlfworldEnv, GameRecord
from selskill.benchmarks.alfworld.episode import NAVIGATION
from selskill.envs.base import Env, EnvState
from selskill.skills import SkillCallRecord, SkillExecutor

alfworld = pytest.importorskip("alfworld")

DATA = Path(alfworld.__file__).parent / "data"


# --- tiny games ------------------------------------------------------------------------


def problem(receptacles, objects, goal, *, held=None, openable=()):
    """A PDDL problem: each receptacle at its own location, the agent at a location of its own.

    receptacles: [(id, type)]; objects: [(id, type, receptacle id or None, properties)];
    `held` is the id of an object that starts in the agent's hands.
    """
    rtypes = sorted({t for _, t in receptacles})
    otypes = sorted({t for _, t, _, _ in objects})
    decl = ["agent1 - agent", "loc_start - location"]
    decl += [f"loc_{i} - location" for i in range(len(receptacles))]
    decl += [f"{rid} - receptacle" for rid, _ in receptacles]
    decl += [f"{oid} - object" for oid, _, _, _ in objects]
    decl += [f"{t}Type - rtype" for t in rtypes] + [f"{t}Type - otype" for t in otypes]
    init = ["(atLocation agent1 loc_start)", "(= (total-cost) 0)"]
    for i, (rid, rtype) in enumerate(receptacles):
        init += [f"(receptacleAtLocation {rid} loc_{i})", f"(receptacleType {rid} {rtype}Type)"]
        init += [f"(canContain {rtype}Type {ot}Type)" for ot in otypes]
        if rid in openable:
            init.append(f"(openable {rid})")
    where = {rid: i for i, (rid, _) in enumerate(receptacles)}
    for oid, otype, rid, props in objects:
        init.append(f"(objectType {oid} {otype}Type)")
        init += [f"({p} {oid})" for p in props]
        if rid is not None:
            init += [f"(inReceptacle {oid} {rid})", f"(objectAtLocation {oid} loc_{where[rid]})"]
    if held:
        init += [f"(holds agent1 {held})", "(holdsAny agent1)"]
    return (
        "(define (problem tiny)\n (:domain alfred)\n (:objects\n  "
        + "\n  ".join(decl)
        + "\n )\n (:init\n  "
        + "\n  ".join(init)
        + f"\n )\n (:goal {goal})\n)\n"
    )


def in_goal(otype: str, rid: str) -> str:
    # Goals must be solvable: the engine fails to load a game whose goal it proves
    # impossible (KeyError 'val1'), so even the failure scenes get a reachable goal.
    return f"(exists (?o - object) (and (objectType ?o {otype}Type) (inReceptacle ?o {rid})))"


LIGHT_GOAL = """(and
  (exists (?ot - object ?r - receptacle ?a - agent ?l - location)
    (and (objectType ?ot DeskLampType) (toggleable ?ot) (isToggled ?ot)
         (receptacleAtLocation ?r ?l) (atLocation ?a ?l) (inReceptacle ?ot ?r)))
  (exists (?o - object ?a - agent) (and (objectType ?o BookType) (holds ?a ?o))))"""

MUG = ("Mug_bar_1", "Mug", "CounterTop_bar_1", ("pickupable", "heatable", "coolable", "cleanable"))
LAMP = ("DeskLamp_bar_1", "DeskLamp", "Desk_bar_1", ("toggleable",))
BOOK = ("Book_bar_1", "Book", "Bed_bar_1", ("pickupable",))

GAMES = {
    # Heating must leave the mug hot; the goal also needs it placed, so the skill alone
    # does not end the episode.
    "heat": (
        "put a hot mug in countertop",
        problem(
            [("CounterTop_bar_1", "CounterTop"), ("Microwave_bar_1", "Microwave")],
            [MUG],
            "(exists (?o - object) (and (objectType ?o MugType) (isHot ?o) (inReceptacle ?o CounterTop_bar_1)))",
            openable={"Microwave_bar_1"},
        ),
    ),
    "no_microwave": (
        "heat some mug and put it in countertop",
        problem(
            [("CounterTop_bar_1", "CounterTop"), ("Fridge_bar_1", "Fridge")],
            [MUG],
            in_goal("Mug", "Fridge_bar_1"),
        ),
    ),
    "book_microwave": (
        "heat some book and put it in countertop",
        problem(
            [("CounterTop_bar_1", "CounterTop"), ("Microwave_bar_1", "Microwave")],
            [("Book_bar_1", "Book", "CounterTop_bar_1", ("pickupable",))],
            in_goal("Book", "Microwave_bar_1"),
        ),
    ),
    "cool": (
        "cool some mug and put it in countertop",
        problem(
            [("CounterTop_bar_1", "CounterTop"), ("Fridge_bar_1", "Fridge")],
            [MUG],
            "(exists (?o - object) (isCool ?o))",
            held="Mug_bar_1",
            openable={"Fridge_bar_1"},
        ),
    ),
    "clean": (
        "clean some mug and put it in countertop",
        problem(
            [("CounterTop_bar_1", "CounterTop"), ("Sink_bar_1_bar_SinkBasin", "SinkBasin")],
            [MUG],
            "(exists (?o - object) (isClean ?o))",
            held="Mug_bar_1",
        ),
    ),
    # The lamp stands on the desk, the skill's second surface type: the sidetable is
    # visited first and found empty.
    "light": (
        "look at book under the desklamp",
        problem(
            [("Bed_bar_1", "Bed"), ("Desk_bar_1", "Desk"), ("SideTable_bar_1", "SideTable")],
            [BOOK, LAMP],
            LIGHT_GOAL,
        ),
    ),
    "no_lamp": (
        "look at book under the desklamp",
        problem(
            [("Bed_bar_1", "Bed"), ("Desk_bar_1", "Desk"), ("SideTable_bar_1", "SideTable")],
            [BOOK],
            in_goal("Book", "Desk_bar_1"),
        ),
    ),
}


# --- the product adapter over these games ----------------------------------------------


def write_games(root: Path) -> list[GameRecord]:
    records = []
    for task_id, (task, pddl) in GAMES.items():
        grammar = (DATA / "alfred.twl2").read_text().replace("UNKNOWN GOAL", task)
        game = {"pddl_domain": (DATA / "alfred.pddl").read_text(), "grammar": grammar, "pddl_problem": pddl}
        path = root / f"{task_id}.tw-pddl"
        path.write_text(json.dumps({**game, "solvable": True}))
        records.append(GameRecord(task_id=task_id, path=str(path), task_type="tiny", split="train"))
    return records


class CountingEnv(AlfworldEnv):
    """AlfworldEnv plus a step counter and a step limit that ends the episode like a rollout's."""

    def __init__(self, games: list[GameRecord], max_steps: int = 50):
        super().__init__(games)
        self.max_steps = max_steps
        self.total_steps = 0

    def reset(self, task_id: str) -> EnvState:
        self.total_steps = 0
        return super().reset(task_id)

    def step(self, command: str) -> EnvState:
        state = super().step(command)
        self.total_steps += 1
        if self.total_steps >= self.max_steps:
            state.done = True
        return state

    def describe(self, name: str) -> str:
        """The game's own description of an object (`examine`), e.g. "This is a hot mug 1."."""
        return self.step(f"examine {name}").observation


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> CountingEnv:
    # One engine for every game: each new PddlEnv loads a libdownward copy it never frees.
    return CountingEnv(write_games(tmp_path_factory.mktemp("games")))


@pytest.fixture(scope="module")
def executor() -> SkillExecutor:
    return SkillExecutor(load_alfworld_skills(), NAVIGATION)


def test_adapter_satisfies_protocol(env):
    env.reset("heat")
    assert isinstance(env, Env)
    assert env.inventory() == [] and "go to microwave 1" in env.state.admissible_commands


# --- executable skills: success --------------------------------------------------------


def test_heat_object_heats_the_held_mug(env, executor):
    env.reset("heat")
    env.step("go to countertop 1")
    env.step("take mug 1 from countertop 1")
    before = env.total_steps

    record = executor.execute(env, "heat_object")

    assert record.precise and record.error is None
    assert record.actions == ["go to microwave 1", "heat mug 1 with microwave 1"]
    assert record.env_steps == len(record.actions) == env.total_steps - before
    assert record.resolved == {"object": "mug 1", "microwave": "microwave 1"}
    assert "You heat the mug 1 using the microwave 1." in record.observation
    assert not record.won and not record.done
    assert env.inventory() == ["mug 1"]  # still held, ready to be placed
    assert env.describe("mug 1") == "This is a hot mug 1."
    # The procedure continues in the new grammar and wins.
    env.step("go to countertop 1")
    assert env.step("move mug 1 to countertop 1").won


def test_go_to_is_skipped_when_already_there(env, executor):
    env.reset("heat")
    env.step("go to countertop 1")
    env.step("take mug 1 from countertop 1")
    env.step("go to microwave 1")

    record = executor.execute(env, "heat_object", {"object": "mug 1", "microwave": "microwave 1"})

    assert record.precise
    assert record.actions == ["heat mug 1 with microwave 1"] and record.env_steps == 1
    assert env.describe("mug 1") == "This is a hot mug 1."


def test_cool_object_cools_and_wins(env, executor):
    env.reset("cool")
    record = executor.execute(env, "cool_object", {})
    assert record.precise
    assert record.actions == ["go to fridge 1", "cool mug 1 with fridge 1"]
    assert record.env_steps == 2
    assert record.won and record.done
    assert env.describe("mug 1") == "This is a cold mug 1."


def test_clean_object_uses_the_sink_basin(env, executor):
    env.reset("clean")
    record = executor.execute(env, "clean_object")
    assert record.precise
    assert record.actions == ["go to sinkbasin 1", "clean mug 1 with sinkbasin 1"]
    assert record.won
    assert env.describe("mug 1") == "This is a clean mug 1."


def test_examine_with_light_searches_surfaces_in_the_stated_order(env, executor):
    env.reset("light")
    env.step("go to bed 1")
    env.step("take book 1 from bed 1")

    record = executor.execute(env, "examine_with_light")

    assert record.precise and record.error is None
    assert record.actions == ["go to sidetable 1", "go to desk 1", "use desklamp 1"]
    assert record.env_steps == 3
    assert record.resolved == {"object": "book 1", "lamp": "desklamp 1"}
    assert record.won and record.done


# --- executable skills: failures -------------------------------------------------------


def test_heat_object_holding_nothing_fails_before_any_step(env, executor):
    env.reset("heat")
    record = executor.execute(env, "heat_object")
    assert not record.precise
    assert record.error == "precondition_failed:holding_object"
    assert record.env_steps == 0 and record.actions == [] and env.total_steps == 0
    assert "not holding anything" in record.observation


def test_heat_object_without_microwave_fails_its_precondition(env, executor):
    env.reset("no_microwave")
    env.step("go to countertop 1")
    env.step("take mug 1 from countertop 1")
    record = executor.execute(env, "heat_object")
    assert record.error == "precondition_failed:receptacle_exists:microwave"
    assert record.env_steps == 0 and not record.precise


def test_holding_a_different_object_than_named_fails(env, executor):
    env.reset("heat")
    env.step("go to countertop 1")
    env.step("take mug 1 from countertop 1")
    record = executor.execute(env, "heat_object", {"object": "apple 1"})
    assert record.error == "precondition_failed:holding:object"
    assert record.env_steps == 0


def test_inadmissible_step_stops_the_skill_without_sending_it(env, executor):
    # A book is not heatable: the engine never offers "heat book 1 with microwave 1".
    env.reset("book_microwave")
    env.step("go to countertop 1")
    env.step("take book 1 from countertop 1")
    before = env.total_steps

    record = executor.execute(env, "heat_object")

    assert not record.precise
    assert record.error == "inadmissible:heat book 1 with microwave 1"
    assert record.actions == ["go to microwave 1"]
    assert record.env_steps == 1 == env.total_steps - before
    assert "not possible here" in record.observation


def test_examine_with_light_without_lamp_reports_not_found(env, executor):
    env.reset("no_lamp")
    env.step("go to bed 1")
    env.step("take book 1 from bed 1")
    record = executor.execute(env, "examine_with_light")
    assert not record.precise
    assert record.error == "not_found:desklamp"
    assert record.actions == ["go to sidetable 1", "go to desk 1"]
    assert record.env_steps == 2
    assert "no desklamp found" in record.observation


def test_episode_ending_mid_skill_is_reported(env, executor):
    env.reset("light")
    env.step("go to bed 1")
    env.step("take book 1 from bed 1")
    env.max_steps = 3
    try:
        record = executor.execute(env, "examine_with_light")
    finally:
        env.max_steps = 50
    assert record.error == "episode_done" and record.done and not record.won
    assert record.actions == ["go to sidetable 1"] and record.env_steps == 1


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"microwave": "fridge 1"}, "bad_argument:microwave"),
        ({"oven": "oven 1"}, "bad_argument:oven"),
        ({"object": 3}, "bad_argument:object"),
        (["mug 1"], "bad_arguments"),
    ],
)
def test_bad_arguments_are_refused(env, executor, arguments, error):
    env.reset("heat")
    env.step("go to countertop 1")
    env.step("take mug 1 from countertop 1")
    record = executor.execute(env, "heat_object", arguments)
    assert record.error == error and not record.precise and record.env_steps == 0


# --- memory skills, unknown names, the record -------------------------------------------


def test_memory_skill_returns_its_body(env, executor):
    env.reset("heat")
    skill = executor.library["common_mistakes"]
    record = executor.execute(env, "common_mistakes")
    assert record.precise and record.error is None
    assert record.kind == "memory"
    assert record.observation == skill.body and "move OBJECT to RECEPTACLE" in record.observation
    assert record.env_steps == 0 and record.actions == [] and env.total_steps == 0


def test_unknown_skill_is_a_record_not_an_exception(env, executor):
    env.reset("heat")
    record = executor.execute(env, "teleport", {"to": "kitchen"})
    assert record.error == "unknown_skill" and not record.precise and record.kind is None
    assert record.env_steps == 0
    assert "heat_object" in record.observation  # tells the model what exists


def test_record_is_json_serialisable(env, executor):
    env.reset("heat")
    env.step("go to countertop 1")
    env.step("take mug 1 from countertop 1")
    record = executor.execute(env, "heat_object", {"object": "mug 1"})
    data = json.loads(json.dumps(record.to_dict()))
    assert data["skill"] == "heat_object" and data["precise"] is True
    assert data["actions"] == record.actions and data["arguments"] == {"object": "mug 1"}
    assert isinstance(record, SkillCallRecord)


# --- receptacle defaults, without the engine ---------------------------------------------


class _Scripted:
    """Just enough of an Env to check which receptacle a default resolves to."""

    def __init__(self, admissible: list[str], held: list[str]):
        self.state = EnvState(observation="", admissible_commands=admissible, task="t")
        self.held = held
        self.sent: list[str] = []

    def inventory(self) -> list[str]:
        return list(self.held)

    def step(self, command: str) -> EnvState:
        self.sent.append(command)
        admissible = self.state.admissible_commands  # unchanged: the next step stays admissible
        self.state = EnvState(
            observation="You heat it.", admissible_commands=admissible, task="t", env_steps=1
        )
        return self.state


def test_receptacle_default_is_the_natural_first(executor):
    env = _Scripted(["go to microwave 10", "go to microwave 2", "heat mug 1 with microwave 2"], ["mug 1"])
    record = executor.execute(env, "heat_object")
    assert record.resolved["microwave"] == "microwave 2"
    assert env.sent == ["go to microwave 2", "heat mug 1 with microwave 2"]


def test_receptacle_default_prefers_where_the_agent_is(executor):
    env = _Scripted(
        ["go to microwave 1", "examine microwave 2", "examine mug 1", "heat mug 1 with microwave 2"],
        ["mug 1"],
    )
    record = executor.execute(env, "heat_object")
    assert record.precise and env.sent == ["heat mug 1 with microwave 2"]
