"""Offline ALFWorld households: real engine, real domain and grammar, generated scenes.

A fresh machine has no ALFWorld data and cannot download it. alfworld ships everything the
TextWorld/PDDL engine needs except the problems: the domain (`alfred.pddl`), the grammar
(`alfred.twl2`), the goal library, the object/receptacle constants and the floor-plan
receptacle layouts. This module writes problems against them, so games are played by the
same engine, produce the same text and admissible commands, and are won by the same goal
forms as the real data set. Placements follow counts from ALFWorld's train split
(`shared/data/alfworld_placement_prior.json`).

Each game directory mirrors the real layout (`<split>/<task dir>/<trial>/game.tw-pddl`
plus `traj_data.json`), so the real-data loader reads both, and alfworld's hand-coded
expert can play them. A known solution is built from the generator's own facts (never by
the planner, which can take minutes on large scenes).
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from selskill.benchmarks.alfworld.config import GAME_SIZES as SIZES
from selskill.benchmarks.alfworld.config import SPLITS

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# 2: receptacles keep the floor plan's shared locations (co-located receptacles, as in real
# games: `open drawer 8` from drawer 7, no `go to`). The random stream stays keyed by scheme 1,
# so a scene in which no two receptacles share a location is the same in both versions.
GENERATOR_VERSION = 2
_RNG_SCHEME = 1
GENERATOR_FILE = "generator.json"

# The scale ladder: (receptacles, objects) ranges per generated size; `real` keeps the floor
# plan's whole receptacle set and ALFWorld's per-type instance counts. `tiny` is the CPU scale
# (a policy trained from scratch on 2 cores learns it; docs/benchmarks.md, "Scale ladder"),
# `small` the scale where such a policy stops learning the task logic.
SCALE: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "tiny": ((3, 5), (4, 8)),
    "small": ((8, 15), (15, 30)),
}

# The appliance a task type needs, and the command that uses it.
APPLIANCE = {
    "pick_clean_then_place_in_recep": ("SinkBasin", "clean"),
    "pick_heat_then_place_in_recep": ("Microwave", "heat"),
    "pick_cool_then_place_in_recep": ("Fridge", "cool"),
}
# Objects that stand in scenes but cannot be picked up (ALFWorld lists them, never as targets).
NOT_PICKUPABLE = frozenset(
    {
        "Television",
        "Window",
        "Mirror",
        "ShowerGlass",
        "Painting",
        "Blinds",
        "Curtains",
        "Poster",
        "LightSwitch",
        "ShowerDoor",
        "StoveKnob",
        "Bathtub",
        "Sink",
        "Chair",
        "Footstool",
        "LaundryHamperLid",
        "Boots",
    }
)
# Receptacles the floor-plan layouts do not list but scenes hold (ALFWorld's kitchens have four burners).
EXTRA_RECEPTACLE_COUNT = {"StoveBurner": 4}
# Real kitchens' burners mostly stand in front/back pairs at one location (17 of the 26 kitchen
# scenes of a 60-game sample of ALFWorld's train split; docs/benchmarks.md, "Generated scenes").
BURNER_PAIRS_SHARE = 0.7
LAMP = "DeskLamp"


class GenerationError(RuntimeError):
    """The request cannot be satisfied (e.g. no floor plan fits a task type)."""


@dataclass
class Receptacle:
    id: str  # ALFWorld id, e.g. "Cabinet|+00.68|+00.50|-02.20"
    type: str
    location: str  # e.g. "loc|0|-5|2|30"


@dataclass
class Obj:
    id: str
    type: str
    receptacle: str  # receptacle id


@dataclass
class Scene:
    floor_plan: int
    scene_type: str
    receptacles: list[Receptacle]
    objects: list[Obj]
    agent_location: str


@dataclass
class Game:
    """One generated game: what is written to disk, plus how it is won."""

    task_type: str
    split: str
    size: str
    seed: int
    index: int
    scene: Scene
    object_target: str
    parent_target: str
    toggle_target: str = ""
    task_text: str = ""
    solution: list[str] = field(default_factory=list)

    @property
    def dir_name(self) -> str:
        return f"{self.task_type}-{self.object_target}-None-{self.parent_target or self.toggle_target}-{self.scene.floor_plan}"

    @property
    def trial_name(self) -> str:
        # sizes other than `small` (the first one) carry their name: one games folder can hold
        # several scales without one game overwriting another
        return f"trial_s{self.seed}_{self.index:05d}" + ("" if self.size == "small" else f"_{self.size}")


# ---------------------------------------------------------------------------------------
# alfworld's shipped data


def _alfworld_file(*parts: str):
    return importlib.resources.files("alfworld").joinpath(*parts)


def domain_text() -> str:
    return _alfworld_file("data", "alfred.pddl").read_text()


def grammar_text() -> str:
    return _alfworld_file("data", "alfred.twl2").read_text()


def _constants():
    # alfworld.gen.constants is a plain module of tables; importing it pulls nothing heavy.
    from alfworld.gen import constants

    return constants


def load_placement_prior(path: str | Path | None = None) -> dict[str, dict[str, int]]:
    """Receptacle type -> object type -> count in ALFWorld's train split initial states."""
    if path is None:
        path = default_prior_path()
    with open(path) as f:
        return json.load(f)["counts"]


def default_prior_path() -> Path:
    """The shipped copy of the placement prior (package data), or the shared one."""
    here = Path(__file__).resolve().parent / "data" / "alfworld_placement_prior.json"
    return here


def _floor_plan_receptacles(fp: int) -> list[tuple[str, list[float]]]:
    data = json.loads(_alfworld_file("gen", "layouts", f"FloorPlan{fp}-openable.json").read_text())
    return sorted(data.items())


def _floor_plan_object_types(fp: int) -> list[str]:
    return sorted(
        set(json.loads(_alfworld_file("gen", "layouts", f"FloorPlan{fp}-objects.json").read_text()))
    )


def scene_type_of(fp: int) -> str:
    c = _constants()
    for name, numbers in c.SCENE_TYPE.items():
        if fp in numbers:
            return name
    raise GenerationError(f"floor plan {fp} has no scene type")


def floor_plans_for(split: str, task_type: str) -> list[int]:
    """Floor plans of a split that suit a task type. valid_unseen never shares a plan with train."""
    c = _constants()
    numbers = c.TEST_SCENE_NUMBERS if split == "valid_unseen" else c.TRAIN_SCENE_NUMBERS
    valid = c.GOALS_VALID[task_type]
    return sorted(fp for fp in numbers if scene_type_of(fp) in valid)


def receptacle_type_of(alfworld_id: str) -> str:
    """`Sink|..|SinkBasin` is a SinkBasin; other ids start with their type."""
    parts = alfworld_id.split("|")
    if parts[-1] in ("SinkBasin", "BathtubBasin"):
        return parts[-1]
    return parts[0]


def mangle(alfworld_id: str) -> str:
    """ALFWorld id -> PDDL identifier, the same substitutions as alfworld's own generator."""
    out = alfworld_id
    for src, dst in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        out = out.replace(src, dst)
    return out


@contextlib.contextmanager
def _seeded_global_random(seed_text: str) -> Iterator[None]:
    """alfworld's task-text templating draws from the global `random`; pin it, then restore it."""
    saved = random.getstate()
    random.seed(seed_text)
    try:
        yield
    finally:
        random.setstate(saved)


# ---------------------------------------------------------------------------------------
# scene and task sampling


def _location(pose: list[float]) -> tuple[int, int, int, int]:
    x, z, rot, hor = pose
    return (round(x / 0.25), round(z / 0.25), int(rot) // 90 % 4, int(hor))


def _loc_id(loc: tuple[int, int, int, int]) -> str:
    return "loc|{}|{}|{}|{}".format(*loc)


def _unique_location(
    loc: tuple[int, int, int, int], used: set, rng: random.Random
) -> tuple[int, int, int, int]:
    """The agent's start: a location no receptacle has (real games start the agent in the open)."""
    while loc in used:
        loc = (loc[0] + rng.choice((-1, 1)), loc[1] + rng.choice((-1, 1)), loc[2], loc[3])
    used.add(loc)
    return loc


def _all_receptacles(
    fp: int, rng: random.Random
) -> tuple[list[tuple[str, str, tuple[int, int, int, int]]], dict[str, str]]:
    """(id, type, location) for every receptacle of the floor plan, layout file first; and which
    receptacle stands at which other one's location when both are in the scene (burner pairs)."""
    c = _constants()
    out = []
    for rid, pose in _floor_plan_receptacles(fp):
        out.append((rid, receptacle_type_of(rid), _location(pose)))
    shares: dict[str, str] = {}
    present = {t for _, t, _ in out}
    receptacle_types = set(c.RECEPTACLES) - set(c.MOVABLE_RECEPTACLES)
    for t in _floor_plan_object_types(fp):
        if t in receptacle_types and t not in present:
            extra = []
            for _ in range(EXTRA_RECEPTACLE_COUNT.get(t, 1)):
                x, y, z = (rng.uniform(-3, 3), rng.uniform(0.2, 1.8), rng.uniform(-3, 3))
                rid = f"{t}|{x:+06.2f}|{y:+06.2f}|{z:+06.2f}"
                extra.append((rid, t, (round(x / 0.25), round(z / 0.25), rng.randrange(4), 30)))
            out += extra
            if t == "StoveBurner":
                shares |= _burner_pairs(extra)
    return out, shares


def _burner_pairs(burners: list) -> dict[str, str]:
    """Burners 2 and 4 stand at the location of 1 and 3, at the real kitchens' rate.

    The draw has a stream of its own (keyed by the first burner's id), so deciding it moves
    no other draw of the scene; a burner keeps its own location when its partner is not in
    the scene (a scaled-down scene keeps a few receptacles), so such scenes are unchanged.
    """
    if len(burners) < 2 or random.Random(f"selskill-burners:{burners[0][0]}").random() >= BURNER_PAIRS_SHARE:
        return {}
    return {burners[i][0]: burners[i - 1][0] for i in range(1, len(burners), 2)}


def _can_contain(recep_type: str, obj_type: str) -> bool:
    return obj_type in _constants().VAL_RECEPTACLE_OBJECTS.get(recep_type, ())


def _placement_weights(obj_type: str, recep_types: list[str], prior) -> list[float]:
    """Prior counts where ALFWorld has them; a small floor for every valid receptacle.

    Lamps are never moved, so THOR's placement table omits them: they stand where the
    prior saw them.
    """
    if obj_type == LAMP:
        return [float(prior.get(rt, {}).get(LAMP, 0)) for rt in recep_types]
    return [
        (prior.get(rt, {}).get(obj_type, 0) + 0.25) if _can_contain(rt, obj_type) else 0.0
        for rt in recep_types
    ]


def _movable_object_types(fp: int, prior) -> list[str]:
    c = _constants()
    static = set(c.RECEPTACLES) - set(c.MOVABLE_RECEPTACLES)
    known = {o for counts in prior.values() for o in counts}
    return [
        t for t in _floor_plan_object_types(fp) if t not in static and t in known and t not in NOT_PICKUPABLE
    ]


def _pick_task(
    task_type: str, fp: int, recep_types: list[str], obj_types: list[str], prior, rng: random.Random
):
    """(object_target, parent_target, toggle_target) valid for this floor plan, or None."""
    c = _constants()
    rset = set(recep_types)
    if task_type in APPLIANCE and APPLIANCE[task_type][0] not in rset:
        return None
    candidates = []
    for ot in obj_types:
        if task_type == "pick_clean_then_place_in_recep" and ot not in c.VAL_ACTION_OBJECTS["Cleanable"]:
            continue
        if task_type == "pick_heat_then_place_in_recep" and ot not in c.VAL_ACTION_OBJECTS["Heatable"]:
            continue
        if task_type == "pick_cool_then_place_in_recep" and ot not in c.VAL_ACTION_OBJECTS["Coolable"]:
            continue
        if not any(_can_contain(rt, ot) for rt in rset):
            continue  # nowhere to start from
        if task_type == "look_at_obj_in_light":
            if ot == LAMP:
                continue
            candidates.append((ot, "", LAMP))
            continue
        for rt in sorted(rset):
            if not _can_contain(rt, ot):
                continue
            if task_type in APPLIANCE and rt == APPLIANCE[task_type][0]:
                continue
            # the object must be able to start somewhere other than the parent type
            if not any(_can_contain(other, ot) for other in rset if other != rt):
                continue
            candidates.append((ot, rt, ""))
    if task_type == "look_at_obj_in_light" and (
        LAMP not in obj_types or not any(_placement_weights(LAMP, sorted(rset), prior))
    ):
        return None
    if not candidates:
        return None
    return rng.choice(sorted(candidates))


def _sample_scene_and_task(task_type: str, split: str, size: str, rng: random.Random, prior):
    plans = floor_plans_for(split, task_type)
    for _ in range(200):
        fp = rng.choice(plans)
        receps, shares = _all_receptacles(fp, rng)
        obj_types = _movable_object_types(fp, prior)
        if size in SCALE:
            receps = _subsample_receptacles(receps, task_type, SCALE[size][0], rng)
        recep_types = sorted({t for _, t, _ in receps})
        task = _pick_task(task_type, fp, recep_types, obj_types, prior, rng)
        if task is None:
            continue
        scene = _populate(fp, receps, obj_types, task, task_type, size, rng, prior, shares)
        if scene is not None:
            return scene, task
    raise GenerationError(f"no floor plan of split {split!r} fits {task_type!r} after 200 draws")


def _subsample_receptacles(receps, task_type: str, bounds: tuple[int, int], rng: random.Random):
    lo, hi = bounds
    n = rng.randint(lo, hi)
    if len(receps) <= n:
        return receps
    keep = []
    if task_type in APPLIANCE:
        appliance = [r for r in receps if r[1] == APPLIANCE[task_type][0]]
        keep.append(appliance[0] if appliance else None)
    keep = [k for k in keep if k is not None]
    rest = [r for r in receps if r not in keep]
    # keep type variety: one of each type first, then fill
    by_type: dict[str, list] = {}
    for r in rest:
        by_type.setdefault(r[1], []).append(r)
    firsts = [rng.choice(v) for _, v in sorted(by_type.items())]
    rng.shuffle(firsts)
    chosen = keep + firsts[: max(0, n - len(keep))]
    others = [r for r in rest if r not in chosen]
    rng.shuffle(others)
    chosen += others[: max(0, n - len(chosen))]
    return sorted(chosen)


def _populate(fp, receps, obj_types, task, task_type, size, rng, prior, shares=None) -> Scene | None:
    c = _constants()
    object_target, parent_target, toggle_target = task
    # receptacles keep their floor-plan locations, shared ones included (drawers of one chest)
    at = {rid: loc for rid, _, loc in receps}
    receps = [(rid, rt, at.get((shares or {}).get(rid), loc)) for rid, rt, loc in receps]
    used: set = {loc for _, _, loc in receps}
    receptacles = [Receptacle(rid, rt, _loc_id(loc)) for rid, rt, loc in receps]
    agent_loc = _unique_location(
        (rng.randint(-20, 20), rng.randint(-20, 20), rng.randrange(4), 30), used, rng
    )
    recep_types = [r.type for r in receptacles]

    # how many instances of each type
    counts: dict[str, int] = {}
    if size in SCALE:
        lo, hi = SCALE[size][1]
        target_total = rng.randint(lo, hi)
        pool = [t for t in obj_types if any(_placement_weights(t, recep_types, prior))]
        while sum(counts.values()) < target_total and pool:
            t = rng.choice(pool)
            counts[t] = counts.get(t, 0) + 1
            if counts[t] >= c.MAX_NUM_OF_OBJ_INSTANCES:
                pool.remove(t)
    else:
        for t in obj_types:
            if any(_placement_weights(t, recep_types, prior)):
                counts[t] = rng.randint(1, c.MAX_NUM_OF_OBJ_INSTANCES)
    need = 2 if task_type == "pick_two_obj_and_place" else 1
    counts[object_target] = max(counts.get(object_target, 0), need)
    if toggle_target:
        counts[toggle_target] = 1
    objects: list[Obj] = []
    for t in sorted(counts):
        weights = _placement_weights(t, recep_types, prior)
        if t == object_target and parent_target:
            # the game must not start won: no target instance in a receptacle of the parent type
            weights = [0.0 if rt == parent_target else w for w, rt in zip(weights, recep_types, strict=True)]
        if task_type == "pick_cool_then_place_in_recep" and t == object_target:
            weights = [0.0 if rt == "Fridge" else w for w, rt in zip(weights, recep_types, strict=True)]
        if not any(weights):
            if t in (object_target, toggle_target):
                return None
            continue
        for _ in range(counts[t]):
            r = rng.choices(receptacles, weights=weights)[0]
            x, y, z = (rng.uniform(-3, 3), rng.uniform(0, 2), rng.uniform(-3, 3))
            objects.append(Obj(f"{t}|{x:+06.2f}|{y:+06.2f}|{z:+06.2f}", t, r.id))
    return Scene(fp, scene_type_of(fp), receptacles, objects, _loc_id(agent_loc))


# ---------------------------------------------------------------------------------------
# PDDL problem and solution


def _goal_pddl(task_type: str, object_target: str, parent_target: str, toggle_target: str) -> str:
    from alfworld.gen import goal_library

    goal = goal_library.gdict[task_type]["pddl"].format(
        obj=object_target, recep=parent_target, toggle=toggle_target, mrecep=""
    )
    goal = goal.replace("#", "-").strip()
    # the library's snippets close the (define ...) form too: keep exactly the (:goal ...) form
    depth, end = 0, None
    for i, ch in enumerate(goal):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                end = i + 1
                break
    return goal[:end]


def problem_pddl(game: Game) -> str:
    c = _constants()
    s = game.scene
    rtypes = sorted({r.type for r in s.receptacles})
    otypes = sorted({o.type for o in s.objects})
    locations = sorted({r.location for r in s.receptacles} | {s.agent_location})
    rec_by_id = {r.id: r for r in s.receptacles}
    m = mangle
    lines = [
        f"(define (problem selskill_{m(f'{game.split}_{game.seed}_{game.index}')})",
        "  (:domain alfred)",
        "  (:objects",
    ]
    lines.append("    agent1 - agent")
    lines += [f"    {t}Type - otype" for t in otypes]
    lines += [f"    {t}Type - rtype" for t in rtypes]
    lines += [f"    {m(loc)} - location" for loc in locations]
    lines += [f"    {m(r.id)} - receptacle" for r in s.receptacles]
    lines += [f"    {m(o.id)} - object" for o in s.objects]
    lines.append("  )")
    init = ["(= (totalCost) 0)", f"(atLocation agent1 {m(s.agent_location)})"]
    for rt in rtypes:
        for ot in otypes:
            if _can_contain(rt, ot):
                init.append(f"(canContain {rt}Type {ot}Type)")
    for r in s.receptacles:
        init.append(f"(receptacleType {m(r.id)} {r.type}Type)")
        init.append(f"(receptacleAtLocation {m(r.id)} {m(r.location)})")
        if r.type in c.OPENABLE_CLASS_SET:
            init.append(f"(openable {m(r.id)})")
    actions = c.VAL_ACTION_OBJECTS
    for o in s.objects:
        oid = m(o.id)
        init.append(f"(objectType {oid} {o.type}Type)")
        init.append(f"(inReceptacle {oid} {m(o.receptacle)})")
        init.append(f"(objectAtLocation {oid} {m(rec_by_id[o.receptacle].location)})")
        if o.type not in NOT_PICKUPABLE and o.type != LAMP:
            init.append(f"(pickupable {oid})")
        if o.type in c.MOVABLE_RECEPTACLES_SET:
            init.append(f"(isReceptacleObject {oid})")
        for prop, key in (("cleanable", "Cleanable"), ("heatable", "Heatable"), ("coolable", "Coolable")):
            if o.type in actions[key]:
                init.append(f"({prop} {oid})")
        if o.type in actions["Toggleable"]:
            init.append(f"(toggleable {oid})")
        if rec_by_id[o.receptacle].type == "Fridge" and o.type in actions["Coolable"]:
            init.append(f"(isCool {oid})")  # ALFWorld marks what starts in the fridge as cool
    lines.append("  (:init")
    lines += [f"    {f}" for f in init]
    lines.append("  )")
    lines.append(
        "  " + _goal_pddl(game.task_type, game.object_target, game.parent_target, game.toggle_target)
    )
    lines.append(")")
    return "\n".join(lines) + "\n"


def entity_names(game: Game) -> dict[str, str]:
    """ALFWorld id -> the name the agent reads ("mug 2"), exactly as AlfredDemangler assigns it."""
    from alfworld.agents.utils.misc import Demangler

    s = game.scene
    # the engine lowercases identifiers; the demangler sees the lowercase ids of every entity in a fact
    ids = {mangle(x).lower(): x for x in [r.id for r in s.receptacles] + [o.id for o in s.objects]}
    locs = {mangle(r.location).lower() for r in s.receptacles} | {mangle(s.agent_location).lower()}

    class _Info:
        def __init__(self, i):
            self.id = i

    infos = {i: _Info(i) for i in list(ids) + sorted(locs)}
    dm = Demangler(game_infos=infos)
    return {orig: dm.demangle_alfred_name(low).strip() for low, orig in ids.items()}


class _Planner:
    """Builds the known solution by tracking location, open receptacles and the held object."""

    def __init__(self, game: Game):
        self.game = game
        self.names = entity_names(game)
        self.rec = {r.id: r for r in game.scene.receptacles}
        self.at: str | None = None  # the location the agent stands at
        self.opened: set[str] = set()
        self.cmds: list[str] = []
        self.openable = _constants().OPENABLE_CLASS_SET

    def goto(self, rid: str) -> None:
        # a receptacle that shares the agent's location is reached without `go to` (not admissible there)
        if self.at != self.rec[rid].location:
            self.cmds.append(f"go to {self.names[rid]}")
            self.at = self.rec[rid].location

    def open_if_needed(self, rid: str) -> None:
        if self.rec[rid].type in self.openable and rid not in self.opened:
            self.cmds.append(f"open {self.names[rid]}")
            self.opened.add(rid)

    def take(self, obj: Obj) -> None:
        self.goto(obj.receptacle)
        self.open_if_needed(obj.receptacle)
        self.cmds.append(f"take {self.names[obj.id]} from {self.names[obj.receptacle]}")

    def put(self, obj: Obj, rid: str) -> None:
        self.goto(rid)
        self.open_if_needed(rid)
        self.cmds.append(f"move {self.names[obj.id]} to {self.names[rid]}")

    def use_appliance(self, obj: Obj, rid: str, verb: str) -> None:
        self.goto(rid)
        self.cmds.append(f"{verb} {self.names[obj.id]} with {self.names[rid]}")


def _solve(game: Game, rng: random.Random) -> list[str]:
    s = game.scene
    p = _Planner(game)
    targets = sorted((o for o in s.objects if o.type == game.object_target), key=lambda o: p.names[o.id])
    if game.task_type == "look_at_obj_in_light":
        lamp = next(o for o in s.objects if o.type == game.toggle_target)
        p.take(targets[0])
        p.goto(lamp.receptacle)
        p.cmds.append(f"use {p.names[lamp.id]}")
        return p.cmds
    parents = sorted((r for r in s.receptacles if r.type == game.parent_target), key=lambda r: p.names[r.id])
    parent = rng.choice(parents)
    n = 2 if game.task_type == "pick_two_obj_and_place" else 1
    for obj in targets[:n]:
        p.take(obj)
        if game.task_type in APPLIANCE:
            appliance_type, verb = APPLIANCE[game.task_type]
            appliance = sorted(
                (r for r in s.receptacles if r.type == appliance_type), key=lambda r: p.names[r.id]
            )[0]
            p.use_appliance(obj, appliance.id, verb)
        p.put(obj, parent.id)
    return p.cmds


# ---------------------------------------------------------------------------------------
# public API


def _game_rng(seed: int, split: str, task_type: str, index: int, size: str) -> random.Random:
    # str seeds hash with sha512: the same in every process and Python version
    return random.Random(f"selskill-gen:v{_RNG_SCHEME}:{seed}:{split}:{size}:{task_type}:{index}")


def generate_game(
    task_type: str,
    index: int,
    *,
    seed: int = 0,
    split: str = "train",
    size: str = "small",
    prior: dict | None = None,
) -> Game:
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown task type {task_type!r}; choose one of {', '.join(TASK_TYPES)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    prior = prior if prior is not None else load_placement_prior()
    rng = _game_rng(seed, split, task_type, index, size)
    scene, (obj_t, parent_t, toggle_t) = _sample_scene_and_task(task_type, split, size, rng, prior)
    game = Game(task_type, split, size, seed, index, scene, obj_t, parent_t, toggle_t)
    game.task_text = _task_text(game)
    game.solution = _solve(game, rng)
    return game


def traj_data(game: Game) -> dict:
    """The fields of ALFWorld's traj_data.json that its loaders and hand-coded expert read."""
    return {
        "task_type": game.task_type,
        "task_id": f"{game.dir_name}/{game.trial_name}",
        "pddl_params": {
            "object_target": game.object_target,
            "parent_target": game.parent_target,
            "toggle_target": game.toggle_target,
            "mrecep_target": "",
            "object_sliced": False,
        },
        "scene": {"floor_plan": f"FloorPlan{game.scene.floor_plan}", "scene_num": game.scene.floor_plan},
        "selskill": {
            "generator_version": GENERATOR_VERSION,
            "seed": game.seed,
            "index": game.index,
            "split": game.split,
            "size": game.size,
            "scene_type": game.scene.scene_type,
            "n_receptacles": len(game.scene.receptacles),
            "n_objects": len(game.scene.objects),
            "solution": game.solution,
        },
    }


def _task_text(game: Game) -> str:
    from alfworld.agents.utils.misc import add_task_to_grammar

    with _seeded_global_random(f"selskill-task:{game.seed}:{game.split}:{game.task_type}:{game.index}"):
        grammar = add_task_to_grammar("UNKNOWN GOAL", traj_data(game))
    return grammar


def game_json(game: Game) -> dict:
    return {
        "pddl_domain": domain_text(),
        "grammar": grammar_text().replace("UNKNOWN GOAL", game.task_text),
        "pddl_problem": problem_pddl(game),
        "solvable": True,
        "walkthrough": game.solution,
    }


def write_game(game: Game, root: str | Path) -> Path:
    """Write `<root>/<split>/<task dir>/<trial>/{game.tw-pddl,traj_data.json}`; returns the trial dir."""
    out = Path(root) / game.split / game.dir_name / game.trial_name
    out.mkdir(parents=True, exist_ok=True)
    for name, payload in (("game.tw-pddl", game_json(game)), ("traj_data.json", traj_data(game))):
        tmp = out / (name + ".tmp")
        tmp.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
        tmp.replace(out / name)
    return out


def games_generator_version(root: str | Path) -> int | None:
    """The generator version of the games under `root` (None: no generated game there yet)."""
    root = Path(root)
    if (root / GENERATOR_FILE).is_file():
        return int(json.loads((root / GENERATOR_FILE).read_text())["generator_version"])
    for split in SPLITS:
        for traj in (root / split).glob("*/*/traj_data.json") if (root / split).is_dir() else ():
            meta = json.loads(traj.read_text()).get("selskill")
            return None if meta is None else int(meta.get("generator_version", 1))  # None: real data
    return None


def check_generator_version(root: str | Path) -> None:
    """Refuse to mix versions in one folder: new games would overwrite old ones under the same names."""
    found = games_generator_version(root)
    if found is not None and found != GENERATOR_VERSION:
        raise ValueError(
            f"{root} holds games of generator version {found}; this selskill writes version "
            f"{GENERATOR_VERSION} (co-located receptacles). Point games_dir (gen-games --out) at a new "
            f"folder, or delete {root} to regenerate it; runs made on the old games stay readable."
        )


def generate_games(
    root: str | Path,
    *,
    per_type: int,
    seed: int = 0,
    split: str = "train",
    size: str = "small",
    task_types: tuple[str, ...] = TASK_TYPES,
    progress: bool = False,
) -> list[Path]:
    check_generator_version(root)
    Path(root).mkdir(parents=True, exist_ok=True)
    (Path(root) / GENERATOR_FILE).write_text(json.dumps({"generator_version": GENERATOR_VERSION}) + "\n")
    prior = load_placement_prior()
    jobs = [(t, i) for t in task_types for i in range(per_type)]
    if progress:
        from tqdm.auto import tqdm

        jobs = tqdm(jobs, desc=f"gen-games {split}", unit="game")
    return [
        write_game(generate_game(t, i, seed=seed, split=split, size=size, prior=prior), root) for t, i in jobs
    ]
