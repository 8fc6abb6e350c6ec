"""`selskill bench retrieval`: does the right skill reach the listing?

Real labels, no model. At every decision point of a reference trajectory, the skills
relevant to the next move are known; R@k is the share of decision points where at least
one of them is in the top k of a mode's ranking:

each benchmark plugin labels its own reference episodes, and adds its own options to the
command (`Benchmark.retrieval`, a `RetrievalOptions` class: BFCL's ground truth replayed call
by call, ALFWorld's expert demonstrations; each plugin's `retrieval_bench.py` says how it
labels them).

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
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Protocol

from selskill.skills.distractors import library_of_size
from selskill.skills.model import SkillLibrary
from selskill.skills.retrieval import RetrievalConfig, SkillRetriever
from selskill.skills.scorers import DEFAULT_DENSE_MODEL, DenseEncoder, dense_unavailable
from selskill.skills.step_records import EpisodePrefix
from selskill.templates import markdown

KS: tuple[int, ...] = (1, 3, 5)
DEFAULT_SIZES = "own,68,250,1000"


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


class RetrievalOptions(Protocol):
    """A benchmark's own part of a `selskill bench retrieval` run (`Benchmark.retrieval` is its class): a
    dataclass whose fields are its flags, named after the benchmark as its recipe keys are
    (`bfcl_split` is `--bfcl-split`), each flag's default the field's."""

    @classmethod
    def add_arguments(cls, parser) -> None:
        """Add its flags to the command's parser."""

    def episodes(self, bench: RetrievalBench) -> tuple[SkillLibrary, list[Episode], dict]:
        """(its own skills, its labelled reference episodes, what the result records of them)."""


def retrieval_options() -> dict[str, type]:
    """The options class of every registered benchmark that has a retrieval bench, by name (registry order)."""
    from selskill.registry import benchmark, names

    return {name: spec.retrieval() for name in names() if (spec := benchmark(name)).retrieval is not None}


@dataclass(frozen=True)
class RetrievalBench:
    """What one `selskill bench retrieval` run measures (one field per command-line flag, and each
    benchmark's own options)."""

    envs: tuple[str, ...] = ()  # (): every benchmark with a retrieval bench
    sizes: str = DEFAULT_SIZES  # library sizes, "own" = the benchmark's own skills
    scorers: tuple[str, ...] = ("bm25", "dense", "fused")
    dense_model: str = DEFAULT_DENSE_MODEL
    seed: int = 0  # distractors and demonstrations
    pseudo_skills: str | None = None  # JSON {task_id: [pseudo-skill text, ...]} for task mode
    record_weight: float = 0.5
    fusion: str = "rrf"
    # benchmark -> its RetrievalOptions; one not here plays with its options' defaults
    options: Mapping[str, RetrievalOptions] = field(default_factory=dict)

    @classmethod
    def from_args(cls, args) -> RetrievalBench:
        values = {f.name: getattr(args, f.name) for f in fields(cls) if f.name != "options"}
        options = {
            name: own(**{f.name: getattr(args, f.name) for f in fields(own)})
            for name, own in retrieval_options().items()
        }
        return cls(**{**values, "envs": tuple(args.envs), "scorers": tuple(args.scorers), "options": options})

    def retrieval_config(self) -> RetrievalConfig:
        return RetrievalConfig(
            dense_model=self.dense_model, record_weight=self.record_weight, fusion=self.fusion
        )


def bench_retrieval(bench: RetrievalBench | None = None) -> dict:
    bench = bench or RetrievalBench()
    if {"bm25", "fused"} & set(bench.scorers):
        import bm25s  # noqa: F401 - a missing extra is said before any benchmark's data loads
    base = bench.retrieval_config()
    result: dict = {"config": base.to_dict(), "seed": bench.seed, "notes": [], "rows": []}
    chosen, encoder = _scorers(bench, base, result)
    pseudo = json.loads(Path(bench.pseudo_skills).read_text()) if bench.pseudo_skills else None
    if pseudo is None:
        result["notes"].append("task mode without pseudo-skills (no policy): SkillDreamer's Direct Retrieval")
    for env in bench.envs or tuple(retrieval_options()):
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
    """(the benchmark's own skills, its labelled episodes, what the result records of them)."""
    from selskill.registry import playable

    spec = playable(env)
    if spec.retrieval is None:
        raise ValueError(f"benchmark {env} has no labelled episodes for the retrieval bench")
    options = bench.options.get(env) or spec.retrieval()()
    return options.episodes(bench)


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
