"""`selskill bench retrieval`: does the right skill reach the listing?

Real labels, no model. At every decision point of a reference trajectory, the skills
relevant to the next move are known; R@k is the share of decision points where at least
one of them is in the top k of a mode's ranking:

- **BFCL**: the ground-truth trajectories (`ground_truth_commands`) replayed through
  `BfclEnv`, one call per step. The decision point before each call is an event; relevant
  are the reference skill of the call's class (`file_system_reference` for
  GorillaFileSystem, ...) and every workflow skill (an executable skill) with a step that
  calls that function. The strategy skills are never labels.
- **ALFWorld**: demonstrations from `selskill.init.demos` with a mix in which the expert
  calls its skills where they help (opening memory, the task skill once it holds the
  object, `place_held_object`, `find_second_object`), no premature, wrong or random calls,
  and the demonstrations' usual 10% wrong moves. At every decision the label is the skill
  the expert calls next (at this decision or a later one); decisions after the last call
  are not events. After a memory skill the current observation stays the environment's
  (the skill's text is guidance, not an observation); after an executable one it is what
  the skill returned.

Modes (`selskill.skills.retrieval`): `all` truncated to k (the listing's first k names:
what a listing that only had room for k would show), `task` (once per episode from the task
text as first given; pseudo-skills only with `--pseudo-skills`, since they need a policy)
and `progress` (the record B_t and the current step, at every decision). R@k of `progress`
is read from its full ranking; the listing itself is its top 3 within 1,200 tokens.
`progress+demote` is `progress` with
`demote_invoked="memory"` (memory skills already invoked go last; only where trajectories
invoke skills). `early/mid/late` split R@3 by the event's position in its episode (thirds), which is where
JitSkill's claim (tracked state beats task-only retrieval as the episode unfolds) shows.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

from selskill import markdown
from selskill.skills.distractors import library_of_size
from selskill.skills.model import SkillLibrary
from selskill.skills.retrieval import RetrievalConfig, SkillRetriever
from selskill.skills.scorers import DEFAULT_DENSE_MODEL, DenseEncoder, dense_unavailable
from selskill.skills.step_records import EpisodePrefix, bfcl_steps

KS: tuple[int, ...] = (1, 3, 5)
DEFAULT_SIZES = "own,68,250,1000"
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


@dataclass(frozen=True)
class Event:
    prefix: EpisodePrefix
    relevant: frozenset[str]


@dataclass
class Episode:
    env: str
    task_id: str
    task: str
    events: list[Event]


# --- BFCL --------------------------------------------------------------------------------------


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
    from selskill.benchmarks.bfcl.env import CATEGORIES, BfclEnv, ground_truth_commands, split_tasks
    from selskill.envs.calls import decode_step

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
            calls = decode_step(command).calls
            if calls:
                relevant = bfcl_relevant(calls[0].name, task.involved_classes, fn_classes, workflows)
                if relevant:
                    events.append(Event(prefix, relevant))
            state = env.step(command)
            prefix = prefix.extend(*bfcl_steps(state.info), observation=state.observation, goal=state.task)
            if state.done:
                break
        episodes.append(Episode("bfcl", task.id, task.turns[0], events))
    return episodes


# --- ALFWorld ----------------------------------------------------------------------------------


def bench_demo_mix():
    """The expert calling its skills where they help, with the demonstrations' wrong moves."""
    from selskill.benchmarks.alfworld.demos import DemoMix

    return DemoMix(
        opening_memory=1.0,
        premature_start=0.0,
        premature_seen=0.0,
        repeat_failed=0.0,
        after_failure_memory=0.0,
        useful=1.0,
        place_memory=1.0,
        wrong_executable=0.0,
        second_memory=1.0,
        random_memory=0.0,
    )


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
    from selskill.init.demos import DemoSetup

    if games_dir is None:
        from selskill.benchmarks.alfworld.generate import generate_games

        games_dir = tempfile.mkdtemp(prefix="selskill-bench-retrieval-")
        generate_games(games_dir, per_type=per_type, seed=seed, split=split, size="tiny")
    index = find_games(games_dir, splits=split)
    records = index.games
    setup = DemoSetup.of(AlfworldEnv(index), ALFWORLD_PROMPTS, load_alfworld_skills())
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


# --- scoring -----------------------------------------------------------------------------------


def _first_hit(ranking: Sequence[str], relevant: frozenset[str]) -> int | None:
    for i, name in enumerate(ranking):
        if name in relevant:
            return i + 1
    return None


def evaluate(
    episodes: Sequence[Episode],
    retriever: SkillRetriever,
    mode: str,
    pseudo: dict[str, list[str]] | None = None,
    ks: Sequence[int] = KS,
) -> dict:
    """R@k over every event, and R@3 per third of the episode (early / mid / late)."""
    hits = {k: 0 for k in ks}
    thirds = {p: [0, 0] for p in ("early", "mid", "late")}
    n = 0
    for ep in episodes:
        if mode == "task":
            fixed = retriever.task_ranking(ep.task, (pseudo or {}).get(ep.task_id, ()))
        elif mode == "all":
            fixed = list(retriever.names)
        for j, ev in enumerate(ep.events):
            ranking = fixed if mode in ("task", "all") else retriever.progress_ranking(ev.prefix)
            rank = _first_hit(ranking, ev.relevant)
            n += 1
            for k in ks:
                hits[k] += rank is not None and rank <= k
            part = ("early", "mid", "late")[min(2, 3 * j // max(1, len(ep.events)))]
            thirds[part][0] += 1
            thirds[part][1] += rank is not None and rank <= 3
    out = {"events": n, **{f"R@{k}": (hits[k] / n if n else None) for k in ks}}
    for part, (count, hit) in thirds.items():
        out[f"R@3_{part}"] = hit / count if count else None
    return out


def parse_sizes(spec: str, own: int) -> list[int]:
    sizes = []
    for part in spec.split(","):
        part = part.strip()
        size = own if part == "own" else int(part)
        if size >= own and size not in sizes:
            sizes.append(size)
    return sizes


def run_env(
    name: str,
    episodes: Sequence[Episode],
    own: SkillLibrary,
    sizes: Sequence[int],
    scorers: Sequence[str],
    encoder: DenseEncoder | None,
    base: RetrievalConfig,
    seed: int,
    pseudo: dict[str, list[str]] | None,
) -> list[dict]:
    rows = []
    # the demoting variant differs only where the trajectories invoke skills (ALFWorld's demos)
    invokes_skills = any(s.kind == "skill" for ep in episodes for ev in ep.events for s in ev.prefix.steps)
    for size in sizes:
        library = library_of_size(own, size, seed)
        t0 = time.perf_counter()
        row = evaluate(episodes, SkillRetriever(library, replace(base, mode="all")), "all")
        rows.append({"env": name, "size": size, "mode": "all (truncated)", "scorer": "-", **row,
                     "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
        for scorer in scorers:
            cfg = replace(base, scorer=scorer)
            retriever = SkillRetriever(library, cfg, encoder=encoder)
            demoting = SkillRetriever(library, replace(cfg, demote_invoked="memory"), scorer=retriever.scorer)
            for mode in ("task", "progress", "progress+demote")[: 3 if invokes_skills else 2]:
                t0 = time.perf_counter()
                if mode == "progress+demote":
                    row = evaluate(episodes, demoting, "progress", pseudo)
                else:
                    row = evaluate(episodes, retriever, mode, pseudo)
                rows.append({"env": name, "size": size, "mode": mode, "scorer": scorer, **row,
                             "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
    return rows


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def format_table(rows: Sequence[dict]) -> str:
    headers = [
        "env",
        "skills",
        "mode",
        "scorer",
        "events",
        "R@1",
        "R@3",
        "R@5",
        "R@3 early",
        "R@3 mid",
        "R@3 late",
    ]
    recall = ("R@1", "R@3", "R@5", "R@3_early", "R@3_mid", "R@3_late")
    return markdown.table(
        headers,
        [
            [r["env"], r["size"], r["mode"], r["scorer"], r["events"], *(_pct(r[c]) for c in recall)]
            for r in rows
        ],
    )


@dataclass(frozen=True)
class RetrievalBench:
    """What one `selskill bench retrieval` run measures (one field per command-line flag)."""

    envs: tuple[str, ...] = ("bfcl", "alfworld")
    sizes: str = DEFAULT_SIZES  # library sizes, "own" = the benchmark's own skills
    scorers: tuple[str, ...] = ("bm25", "dense", "fused")
    dense_model: str = DEFAULT_DENSE_MODEL
    bfcl_split: str = "test"
    bfcl_limit: int | None = None
    alfworld_games: str | None = None  # None: tiny games generated for this run, removed after
    alfworld_split: str = "valid_seen"
    alfworld_per_type: int = 10
    seed: int = 0  # distractors and demonstrations
    pseudo_skills: str | None = None  # JSON {task_id: [pseudo-skill text, ...]} for task mode
    record_weight: float = 0.5
    fusion: str = "rrf"

    @classmethod
    def from_args(cls, args) -> RetrievalBench:
        values = {f.name: getattr(args, f.name) for f in fields(cls)}
        return cls(**{**values, "envs": tuple(args.envs), "scorers": tuple(args.scorers)})

    def retrieval_config(self) -> RetrievalConfig:
        return RetrievalConfig(
            dense_model=self.dense_model, record_weight=self.record_weight, fusion=self.fusion
        )


def bench_retrieval(bench: RetrievalBench | None = None) -> dict:
    bench = bench or RetrievalBench()
    base = bench.retrieval_config()
    result: dict = {"config": base.to_dict(), "seed": bench.seed, "notes": [], "rows": []}
    chosen, encoder = _scorers(bench, base, result)
    pseudo = json.loads(Path(bench.pseudo_skills).read_text()) if bench.pseudo_skills else None
    if pseudo is None:
        result["notes"].append("task mode without pseudo-skills (no policy): SkillDreamer's Direct Retrieval")
    for env in bench.envs:
        t0 = time.perf_counter()
        own, episodes, result[env] = _env_episodes(env, bench)
        result[env]["build_seconds"] = round(time.perf_counter() - t0, 1)
        sizes = parse_sizes(bench.sizes, len(own))
        result["rows"] += run_env(env, episodes, own, sizes, chosen, encoder, base, bench.seed, pseudo)
    result["table"] = format_table(result["rows"])
    return result


def _scorers(
    bench: RetrievalBench, base: RetrievalConfig, result: dict
) -> tuple[list[str], DenseEncoder | None]:
    """The scorers that can run here and the dense encoder they need (dense ones drop, with a note,
    when the encoder does not load offline)."""
    chosen = list(bench.scorers)
    if not any(s in ("dense", "fused") for s in chosen):
        return chosen, None
    why = dense_unavailable(bench.dense_model)
    if why:
        result["notes"].append(f"dense and fused skipped: the encoder does not load offline ({why})")
        return [s for s in chosen if s == "bm25"], None
    encoder = DenseEncoder(bench.dense_model, max_length=base.dense_max_length)
    result["dense_model"] = encoder.path
    return chosen, encoder


def _env_episodes(env: str, bench: RetrievalBench) -> tuple[SkillLibrary, list[Episode], dict]:
    """(the env's own skills, its labelled episodes, what the result records of them)."""
    from selskill.benchmarks.alfworld import load_alfworld_skills
    from selskill.benchmarks.bfcl import load_bfcl_skills

    if env == "bfcl":
        own = load_bfcl_skills()
        episodes = bfcl_episodes(own, split=bench.bfcl_split, limit=bench.bfcl_limit)
        return own, episodes, {"split": bench.bfcl_split, "episodes": len(episodes)}
    if env == "alfworld":
        own = load_alfworld_skills()
        episodes, root, dropped = alfworld_episodes(
            bench.alfworld_games, bench.alfworld_split, bench.alfworld_per_type, bench.seed
        )
        if bench.alfworld_games is None:  # generated for this run only
            shutil.rmtree(root, ignore_errors=True)
            root = (
                f"generated: {bench.alfworld_per_type} tiny games per task type, seed {bench.seed} (removed)"
            )
        info = {"games": root, "split": bench.alfworld_split, "episodes": len(episodes), "dropped": dropped}
        return own, episodes, info
    raise ValueError(f"unknown env {env!r} (bfcl, alfworld)")


def main(args) -> int:
    result = bench_retrieval(RetrievalBench.from_args(args))
    for note in result["notes"]:
        print(f"note: {note}")
    print(result["table"])
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "retrieval.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / "retrieval.md").write_text(result["table"] + "\n")
    return 0
