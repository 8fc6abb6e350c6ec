"""ALFWorld on its real TextWorld/PDDL engine, for real data and for generated games alike.

Both sources share one layout (`<split>/<task dir>/<trial>/{game.tw-pddl,traj_data.json}`),
so one loader serves them. The engine object is created once and games are `load()`ed into
it: every new PddlEnv loads its own libdownward copy and never frees it. Planner output
(`policy_commands`) is never requested: it replans on every step and can take minutes.

Game files in alfworld's old grammar (`put X in/on Y`) are detected when indexed and loaded,
and patched in memory unless `grammar="strict"` (selskill/benchmarks/alfworld/grammar.py says why).
Real data may also ship `valid_train` (train games alfworld sets apart for evaluation): it is a
split of its own, indexed only when asked for, so "all splits" never counts train games twice.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from selskill.benchmarks.alfworld.config import KNOWN_SPLITS, REAL_ONLY_SPLITS
from selskill.benchmarks.alfworld.generate import SPLITS, TASK_TYPES
from selskill.benchmarks.alfworld.grammar import (
    OldGrammarError,
    check_mode,
    is_old_grammar,
    load_game,
    strict_error,
)
from selskill.envs.base import EnvError, EnvState, replay_commands

GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"
REAL_DATA_DIR = "json_2.1.1"
_TASK_RE = re.compile(r"Your task is to: (.*?)\s*$", re.S)


@dataclass(frozen=True)
class GameRecord:
    task_id: str  # "<split>/<task dir>/<trial>": the same in every process
    path: str  # the game.tw-pddl file
    task_type: str
    split: str
    old_grammar: bool = False  # alfworld's old grammar: patched in memory at load


@dataclass
class GameIndex:
    """The playable games under a root, what was skipped and why, and how many need the grammar patch."""

    root: str
    games: list[GameRecord] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    grammar: str = "patch"
    benchmark = "alfworld"  # its registry name (selskill.registry.benchmark_of_index)

    def by_id(self) -> dict[str, GameRecord]:
        return {g.task_id: g for g in self.games}

    @property
    def patched(self) -> int:
        """Indexed games in alfworld's old grammar, which `AlfworldEnv` patches when it loads them."""
        return sum(1 for g in self.games if g.old_grammar)

    def stats(self) -> dict[str, int]:
        return {"games_patched_from_old_grammar": self.patched}

    def summary(self) -> str:
        skipped = ", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())) or "none"
        patched = f", {self.patched} patched from alfworld's old grammar" if self.patched else ""
        return f"{len(self.games)} games under {self.root} (skipped: {skipped}{patched})"


def data_root(root: str | os.PathLike | None = None) -> Path:
    """`root`, else $ALFWORLD_DATA; real data keeps its splits under json_2.1.1/."""
    if root is None:
        env = os.environ.get("ALFWORLD_DATA")
        if not env:
            raise FileNotFoundError(
                "no game directory given and ALFWORLD_DATA is not set: pass a directory made by "
                "`selskill gen-games`, or set ALFWORLD_DATA to a copy of the ALFWorld data"
            )
        root = env
    root = Path(root)
    if (root / REAL_DATA_DIR).is_dir():
        root = root / REAL_DATA_DIR
    return root


def _skip_reason(rel: Path, traj: dict | None, task_types: Iterable[str]) -> str | None:
    """Why the trial at `rel` (its path below the data root) is not indexed, from its path and traj_data.

    Only the path below the root is matched: a root under a folder named e.g. `Sliced_copy`
    must not skip every game.
    """
    text = rel.as_posix()
    if "movable" in text:
        return "movable"
    if "Sliced" in text:
        return "sliced"
    if traj is None:
        return "unreadable_traj_data"
    if traj.get("task_type") not in task_types:
        return "unsupported_task_type"
    params = traj.get("pddl_params") or {}
    if params.get("object_sliced"):
        return "sliced"
    if params.get("toggle_target") == "FloorLamp":
        return "floorlamp"  # FloorLamp games cannot be won in the TextWorld engine
    return None


def _read_game(trial: Path) -> tuple[str | None, dict | None]:
    """(skip reason, game data) of the trial's game file."""
    game = trial / GAME_FILE
    if not game.is_file():
        return "missing_game_file", None
    try:
        with open(game) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return "unreadable_game_file", None
    solvable = data.get("solvable")
    if solvable is None:
        return "missing_solvable_flag", None
    if not solvable:
        return "unsolvable", None
    return None, data


def find_games(
    root: str | os.PathLike | None = None,
    splits: str | Sequence[str] | None = None,
    task_types: Iterable[str] = TASK_TYPES,
    grammar: str = "patch",
) -> GameIndex:
    """Index the games of `splits` under a real or generated root.

    Default: every split present but `valid_train` (which repeats train games), or
    `valid_train` when it is the only one.

    `grammar`: "patch" indexes old-grammar games (flagged, patched at load); "strict" raises
    `OldGrammarError` naming the first such file.
    """
    check_mode(grammar)
    base = data_root(root)
    if isinstance(splits, str):
        splits = [splits]
    if splits is None:
        splits = [s for s in SPLITS if (base / s).is_dir()] or [
            s for s in REAL_ONLY_SPLITS if (base / s).is_dir()
        ]
    splits = list(splits)
    for split in splits:
        if split not in KNOWN_SPLITS:
            raise ValueError(f"unknown split {split!r}; choose from {', '.join(KNOWN_SPLITS)}")
    if not any((base / s).is_dir() for s in splits):
        raise FileNotFoundError(
            f"{base} has none of the splits {', '.join(splits)}: expected {base}/<split>/<task>/<trial>/{GAME_FILE}"
        )
    task_types = tuple(task_types)
    index = GameIndex(root=str(base), grammar=grammar)
    for split in splits:
        split_dir = base / split
        if not split_dir.is_dir():
            continue
        for traj_path in sorted(split_dir.rglob(TRAJ_FILE)):
            trial = traj_path.parent
            rel = trial.relative_to(base)
            try:
                traj = json.loads(traj_path.read_text())
            except (OSError, ValueError):
                traj = None
            reason = _skip_reason(rel, traj, task_types)
            data = None
            if reason is None:
                reason, data = _read_game(trial)
            if reason:
                index.skipped[reason] += 1
                continue
            old = is_old_grammar(data)
            if old and grammar == "strict":
                raise strict_error(str(trial / GAME_FILE))
            record = GameRecord(rel.as_posix(), str(trial / GAME_FILE), traj["task_type"], split, old)
            index.games.append(record)
    return index


def game_files(root: str | os.PathLike | None, split: str) -> dict[str, Path]:
    """The files `find_games` reads for `split` (each trial's traj_data and game file, skipped ones too:
    a repaired file changes the games), by their path below the data root."""
    base = data_root(root)
    split_dir = base / split
    if not split_dir.is_dir():
        raise FileNotFoundError(
            f"{base} has no split {split}: expected {split_dir}/<task>/<trial>/{GAME_FILE}"
        )
    found = [*split_dir.rglob(TRAJ_FILE), *split_dir.rglob(GAME_FILE)]
    return {p.relative_to(base).as_posix(): p for p in found if p.is_file()}


def record_for_trial(trial_dir: str | os.PathLike) -> GameRecord:
    """A single trial directory as a one-game record (for `selskill play`, debugging)."""
    trial = Path(trial_dir)
    if trial.is_file():
        trial = trial.parent
    game = trial / GAME_FILE
    if not game.is_file():
        raise FileNotFoundError(
            f"{trial} has no {GAME_FILE}: pass a trial directory made by `selskill gen-games`"
        )
    try:
        traj = json.loads((trial / TRAJ_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(f"{trial / TRAJ_FILE} is missing or unreadable ({exc})") from None
    try:
        with open(game) as f:
            old = is_old_grammar(json.load(f))
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(f"{game} is unreadable ({exc})") from None
    parts = trial.resolve().parts
    split = parts[-3] if len(parts) >= 3 and parts[-3] in KNOWN_SPLITS else ""
    return GameRecord("/".join(parts[-3:]), str(game), traj.get("task_type", ""), split, old)


def install_grammar_parse_cache() -> None:
    """Memoise textworld's grammar-template parser (deep copies out): the same derivations, faster steps.

    Every step the engine re-derives the command template of each applicable action, and
    each derivation first parses the template text with tatsu; the parse of a given text
    never changes, so it is parsed once and copied. Outputs are identical (a test replays
    games with and without the cache).
    """
    import copy

    from textworld.envs.pddl import textgen

    if getattr(textgen._parse_and_convert, "_selskill_cached", False):
        return
    original = textgen._parse_and_convert
    cache: dict = {}

    def cached(text, *args, **kwargs):
        if args or set(kwargs) - {"rule_name", "trace"} or kwargs.get("trace"):
            return original(text, *args, **kwargs)
        key = (text, kwargs.get("rule_name"))
        if key not in cache:
            if len(cache) > 50_000:
                cache.clear()
            cache[key] = original(text, **kwargs)
        return copy.deepcopy(cache[key])

    cached._selskill_cached = True
    cached._original = original
    cached.cache = cache
    textgen._parse_and_convert = cached


TRANSLATION_CACHE_SIZE = 256  # games; one entry is the parsed task + its SAS text (~1 MB)


def install_translation_cache() -> None:
    """Memoise fast-downward's PDDL->SAS translation per (domain, problem): cheaper resets.

    textworld translates a game's problem twice (plain and optimised) each time it builds a
    planner state, and it builds one on `load` and another on every `reset`: four
    translations (pure Python, the bulk of a reset) to start an episode on a new game, two to
    restart the same game, although the output depends only on the two texts. Sampling K
    episodes per task and replaying a prefix for every fork restart the same games over and
    over. The cached task is deep-copied out (far cheaper than translating), so no state
    object shares it; texts, admissible commands and outcomes are identical (a test replays
    games with and without it). Figures: docs/benchmarks.md, "After the engine and KV fixes".
    """
    import copy
    from collections import OrderedDict

    from textworld.envs.pddl import logic

    fd = logic.fast_downward
    if getattr(fd.pddl2sas, "_selskill_cached", False):
        return
    original = fd.pddl2sas
    cache: OrderedDict = OrderedDict()

    def cached(domain, problem, verbose=False, optimize=False):
        key = (domain, problem, bool(optimize))
        if key in cache:
            cache.move_to_end(key)
        else:
            cache[key] = original(domain, problem, verbose=verbose, optimize=optimize)
            if len(cache) > TRANSLATION_CACHE_SIZE:
                cache.popitem(last=False)
        task, sas = cache[key]
        return copy.deepcopy(task), sas

    cached._selskill_cached = True
    cached._original = original
    cached.cache = cache
    fd.pddl2sas = cached


def clear_engine_caches() -> None:
    """Empty the memoised parses and translations of this process.

    A stage (or an episode child process) starts with them empty; a benchmark that plays
    several settings in one process empties them between settings so that none is timed
    with the caches an earlier setting filled.
    """
    from textworld.envs.pddl import logic, textgen

    for fn in (textgen._parse_and_convert, logic.fast_downward.pddl2sas):
        if getattr(fn, "_selskill_cached", False):
            fn.cache.clear()


def install_context_copy() -> None:
    """Copy textworld's derivation contexts with dict copies instead of `deepcopy`: faster steps.

    Every symbol of every derivation gets a copy of the context, whose `variables` and
    `mapping` dicts textworld deep-copies although derivation only ever adds keys to the
    copy (`dict.update` in `query`) and never mutates the entity and variable objects they
    hold; a new dict per copy keeps every derivation's additions to itself. Those deep copies
    were a large share of a step (docs/benchmarks.md, "After the engine and KV fixes"). Texts
    are identical (the test that replays games with and without the engine caches covers
    this one too).
    """
    from textworld.envs.pddl import textgen

    if getattr(textgen.copy_context, "_selskill_cached", False):
        return
    original = textgen.copy_context

    def copy_context(context):
        return {
            "state": context["state"],
            "facts": context["facts"],
            "variables": dict(context["variables"]),
            "mapping": dict(context["mapping"]),
            "entity_infos": context["entity_infos"],
        }

    copy_context._selskill_cached = True
    copy_context._original = original
    textgen.copy_context = copy_context


def _make_engine():
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs.pddl import PddlEnv

    install_grammar_parse_cache()
    install_translation_cache()
    install_context_copy()
    return AlfredDemangler(PddlEnv(textworld.EnvInfos(admissible_commands=True, won=True)))


class AlfworldEnv:
    """The `Env` protocol over alfworld's engine; one instance plays many games in turn.

    Each game file is read here and handed to the engine as data, so that an old-grammar
    game is patched in memory (`grammar="patch"`, the default; `patched` lists them) or
    refused (`grammar="strict"`, `OldGrammarError`) whatever the index said.
    """

    def __init__(self, games: GameIndex | Sequence[GameRecord], grammar: str | None = None):
        records = games.games if isinstance(games, GameIndex) else list(games)
        if grammar is None:
            grammar = games.grammar if isinstance(games, GameIndex) else "patch"
        self.grammar = check_mode(grammar)
        self._games = {g.task_id: g for g in records}
        self.patched: set[str] = set()  # task ids whose game was patched from the old grammar
        self._engine = None
        self._loaded: str | None = None
        self._task_id: str | None = None
        self._state: EnvState | None = None
        self._raw = None

    def task_ids(self) -> list[str]:
        return sorted(self._games)

    def game(self, task_id: str) -> GameRecord:
        try:
            return self._games[task_id]
        except KeyError:
            raise KeyError(f"unknown task id {task_id!r} ({len(self._games)} games indexed)") from None

    @property
    def state(self) -> EnvState:
        if self._state is None:
            raise RuntimeError("call reset(task_id) first")
        return self._state

    @property
    def task_id(self) -> str | None:
        return self._task_id

    def reset(self, task_id: str) -> EnvState:
        record = self.game(task_id)
        if self._engine is None:
            self._engine = _make_engine()
        try:
            if self._loaded != record.path:
                self._loaded = None
                self._engine.load(self._game_data(record))
                self._loaded = record.path
            raw = self._engine.reset()
        except OldGrammarError:
            raise
        except Exception as exc:  # the engine's own errors (e.g. KeyError('val1') on broken games)
            raise EnvError(f"{task_id}: engine failed to load or reset: {exc!r}") from exc
        self._task_id = task_id
        self._raw = raw
        feedback = raw.feedback
        match = _TASK_RE.search(feedback)
        task = match.group(1).rstrip(".") if match else ""
        self._state = EnvState(
            observation=feedback.strip(),
            admissible_commands=list(raw["admissible_commands"]),
            task=task,
            won=bool(raw["won"]),
            done=bool(raw["won"]),
            env_steps=0,
        )
        return self._state

    def _game_data(self, record: GameRecord) -> dict:
        data, patched = load_game(record.path, self.grammar)
        if patched:
            self.patched.add(record.task_id)
        return data

    def step(self, command: str) -> EnvState:
        if self._state is None:
            raise RuntimeError("call reset(task_id) first")
        try:
            raw, _, done = self._engine.step(command)
        except Exception as exc:
            raise EnvError(f"{self._task_id}: engine failed on {command!r}: {exc!r}") from exc
        self._raw = raw
        self._state = EnvState(
            observation=raw.feedback.strip(),
            admissible_commands=list(raw["admissible_commands"]),
            task=self._state.task,
            won=bool(raw["won"]),
            done=bool(done),
            env_steps=1,
        )
        return self._state

    def replay(self, task_id: str, commands: Sequence[str]) -> EnvState:
        return replay_commands(self, task_id, commands)

    def inventory(self) -> list[str]:
        if self._raw is None:
            return []
        infos = self._raw["_entity_infos"]
        held = []
        for fact in self._raw["_facts"]:
            if fact.name == "holds":
                held.append(infos[fact.arguments[1].name].name.strip())
        return sorted(held)
