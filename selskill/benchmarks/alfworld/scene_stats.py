"""What a household looks like, read from its PDDL problem: the figures that compare generated
scales with real ALFWorld scenes (docs/benchmarks.md, "Generated scenes against real ones").

Counted from the facts every game file states, so real and generated games are measured by
the same rule: receptacles are the `receptacleAtLocation` facts, objects the
`objectAtLocation` facts, and a receptacle is co-located when another receptacle shares its
location (at drawer 7, `open drawer 8` is admissible and `go to drawer 8` is not).
"""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter
from dataclasses import dataclass

from selskill.benchmarks.alfworld.env import GameIndex

_RECEPTACLE_AT = re.compile(r"\(receptacleAtLocation\s+(\S+)\s+(\S+)\)")
_OBJECT_AT = re.compile(r"\(objectAtLocation\s+(\S+)\s+(\S+)\)")


@dataclass
class SceneStats:
    receptacles: int
    objects: int
    colocated_receptacles: int  # receptacles that share their location with another one
    admissible_at_start: int | None = None  # None unless the game was loaded


def scene_stats(problem: str) -> SceneStats:
    """Figures of one PDDL problem text."""
    receptacles = dict(_RECEPTACLE_AT.findall(problem))
    per_location = Counter(receptacles.values())
    objects = {o for o, _ in _OBJECT_AT.findall(problem)}
    return SceneStats(
        receptacles=len(receptacles),
        objects=len(objects),
        colocated_receptacles=sum(n for n in per_location.values() if n > 1),
    )


def index_stats(index: GameIndex, admissible: bool = False, progress: bool = False) -> dict:
    """Means over the index's games; with `admissible`, each game is loaded to count its first commands."""
    env = None
    if admissible:
        from selskill.benchmarks.alfworld.env import AlfworldEnv

        env = AlfworldEnv(index)
    games = index.games
    if progress:
        from tqdm.auto import tqdm

        games = tqdm(games, desc="scene stats", unit="game")
    rows = []
    for record in games:
        with open(record.path) as f:
            s = scene_stats(json.load(f)["pddl_problem"])
        if env is not None:
            s.admissible_at_start = len(env.reset(record.task_id).admissible_commands)
        rows.append(s)
    if not rows:
        raise ValueError("no game in the index: check the folder and --split")

    def mean(values) -> float:
        return round(statistics.fmean(values), 1)

    out = {
        "games": len(rows),
        "receptacles": mean(r.receptacles for r in rows),
        "receptacles_range": [min(r.receptacles for r in rows), max(r.receptacles for r in rows)],
        "objects": mean(r.objects for r in rows),
        "scenes_with_colocated": round(sum(r.colocated_receptacles > 0 for r in rows) / len(rows), 3),
        "colocated_share_of_receptacles": round(
            sum(r.colocated_receptacles for r in rows) / sum(r.receptacles for r in rows), 3
        ),
    }
    if admissible:
        out["admissible_at_start"] = mean(r.admissible_at_start for r in rows)
    return out
