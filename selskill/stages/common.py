"""What every data stage shares: rank sharding, atomic outputs, completion markers, stats.

A stage is a pure function of (inputs, config, seed, rank, world_size). `run_rank` wraps
it with the run-directory contract (docs/design.md, "The stage contract"):
- one writer per rank: the rank holds `locks/NNNNN.lock` (flock) while it runs, and a
  second process on the same rank is refused with a message naming the holder;
- a rank is skipped only when its completion marker verifies (its shard has exactly the
  bytes and sha256 the marker records) and the inputs the marker records (the material
  config keys, seed, code version, policy and upstream shards) equal this run's; recorded
  inputs that differ are refused naming the keys that differ (`--redo` recomputes), and a
  marker that does not verify is recomputed;
- shard, stats and marker are each written to a unique temporary file then renamed, the
  marker last, so a crash at any point leaves the rank incomplete, never half-written.
Any rank can run as its own process on any machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from selskill.config.checks import changed_settings
from selskill.data.layout import StageDir, is_local_path
from selskill.data.shards import (
    ShardError,
    file_sha256,
    read_shards,
    shard_digest,
    stale_tmp_files,
    write_json_atomic,
    write_shard,
    write_text_atomic,
)
from selskill.errors import ExplainedError

# Keys that say where, as whom or how fast a stage runs, not what it computes: they are not
# part of a rank's recorded inputs (each episode samples from its own seeded generator, so
# batching and concurrency change results only at float rounding; docs/design.md).
NOT_INPUTS = frozenset(
    {
        "exp",
        "runs_dir",
        "rank",
        "redo",
        "wandb_project",
        "policy_device",
        "trust_remote_code",
        "concurrent_episodes",
        "policy_batch_size",
        "env_overlap",
        # which executor ran a rank, and with what resources (selskill/executors/)
        "executor",
        "local_workers",
        "slurm_partition",
        "slurm_time",
        "slurm_cpus_per_task",
        "slurm_gpus_per_task",
        "slurm_train_gpus",
        "slurm_mem",
        "slurm_array_parallelism",
        "slurm_sbatch_args",
        "ray_address",
        "ray_cpus_per_task",
        "ray_gpus_per_task",
        "ray_train_gpus",
    }
)


class StageRefused(ExplainedError):
    """A rank cannot run as asked: another process holds it, or what it recorded differs from this run."""


def stable_seed(*parts: object) -> int:
    """A 62-bit seed from any parts, identical in every process (unlike hash())."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 62) - 1)


def shard_items(items: Sequence, rank: int, world_size: int) -> list:
    """Round-robin split of a sorted item list: deterministic and balanced."""
    return list(items[rank::world_size])


def balanced_tasks(records, max_tasks: int) -> list[str]:
    """Task ids interleaved across task types (sorted within each), cut at `max_tasks` (0 = all).

    A prefix of a sorted id list would be all one task type; interleaving keeps any cut balanced.
    """
    by_type: dict[str, list[str]] = {}
    for g in sorted(records, key=lambda g: g.task_id):
        by_type.setdefault(g.task_type, []).append(g.task_id)
    out = []
    queues = [by_type[t] for t in sorted(by_type)]
    for i in range(max((len(q) for q in queues), default=0)):
        out += [q[i] for q in queues if i < len(q)]
    return out[:max_tasks] if max_tasks > 0 else out


@dataclass
class StageStats:
    rows: int = 0
    tokens: int = 0
    seconds: float = 0.0
    failures: Counter = field(default_factory=Counter)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "rows": self.rows,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "failures": dict(sorted(self.failures.items())),
            **self.extra,
        }


def config_values(configs: Sequence) -> dict:
    """The plain-valued fields of the recipe sections `configs` (tuples as lists)."""
    merged = {}
    for cfg in configs:
        for f in dataclasses.fields(cfg):
            value = getattr(cfg, f.name)
            if isinstance(value, (str, int, float, bool, type(None), list, tuple, dict)):
                merged[f.name] = list(value) if isinstance(value, tuple) else value
    return merged


def write_stage_config(stage: StageDir, configs: Sequence, seed: int | None = None) -> None:
    """The resolved recipe of this stage (all dataclasses, and the seed), for reproducibility.

    A stage whose ranks are all complete keeps the config it was computed with (a rerun
    that skips it, possibly from another experiment linking to it, must not relabel it);
    `redo` rewrites it.
    """
    run = next((c for c in configs if hasattr(c, "world_size") and hasattr(c, "redo")), None)
    if (
        run is not None
        and not run.redo
        and stage.config.is_file()
        and len(stage.completed_ranks()) >= run.world_size
    ):
        return
    merged = config_values(configs)
    if seed is not None:
        merged["seed"] = int(seed)
    write_text_atomic(yaml.safe_dump(merged, sort_keys=True), stage.config)


def policy_fingerprint(source: str) -> str:
    """Identity of a model: for a directory, its files' names, sizes and first and last MiB; else the hub id.

    Content, not path: an experiment that links another's round 0 has the same policy.
    """
    if not is_local_path(source):
        return f"hub:{source}"
    path = Path(source).expanduser()
    if not path.is_dir():
        return f"missing:{source}"
    h = hashlib.sha256()
    for p in sorted(path.iterdir()):
        if not p.is_file() or p.name.startswith("."):
            continue
        size = p.stat().st_size
        h.update(f"{p.name}:{size}\n".encode())
        with open(p, "rb") as f:
            h.update(f.read(1 << 20))
            if size > 2 << 20:
                f.seek(size - (1 << 20))
                h.update(f.read())
    return h.hexdigest()[:16]


def stage_fingerprint(stage: StageDir) -> str:
    """Identity of a stage's output: the sha256 of each completed rank's shard (as its marker records it)."""
    ranks = stage.completed_ranks()
    if not ranks:
        return "missing"
    h = hashlib.sha256()
    for r in ranks:
        digest = (stage.read_marker(r) or {}).get("sha256")
        if digest is None:  # a marker written before markers recorded it
            digest = file_sha256(stage.shard(r)) if stage.shard(r).is_file() else "missing"
        h.update(f"{r}:{digest}\n".encode())
    return h.hexdigest()[:16]


def fingerprint(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class StageInputs:
    """What a stage's rows depend on: recorded in each rank's completion marker, compared on every rerun.

    `configs` are the recipe sections the stage reads (keys in `NOT_INPUTS` left out),
    `code_version` the stage module's `CODE_VERSION` (bump it when a change alters the
    rows), `policy` the model it runs, `upstream` the stages of the same round it reads,
    `games` what the tasks it plays are made of, per split (`context.games_identity`):
    content, not path, so regenerated games in the same folder are a changed input.
    """

    configs: Sequence
    seed: int
    code_version: int
    policy: str | None = None
    upstream: Sequence[str] = ()
    games: dict | None = None

    def record(self, stage: StageDir) -> dict:
        out = {k: v for k, v in config_values(self.configs).items() if k not in NOT_INPUTS}
        out["seed"] = int(self.seed)
        out["code_version"] = self.code_version
        if self.policy is not None:
            out["policy"] = policy_fingerprint(self.policy)
        for name in self.upstream:
            out[f"{name} shards"] = stage_fingerprint(StageDir(stage.path.parent / name))
        if self.games is not None:
            out["games"] = self.games
        return out

    def changes(self, recorded: dict, now: dict) -> list[str]:
        """`key: recorded -> now` for each input that differs.

        A key added to a recipe section after the marker was written counts as unchanged
        while it keeps its default; a key that no longer exists is ignored, and so are the
        games of a marker written before markers recorded them (`run_rank` says so).
        """
        now = {k: v for k, v in now.items() if k != "games" or k in recorded}
        defaults = {}
        for cfg in self.configs:
            for f in dataclasses.fields(cfg):
                if f.default is not dataclasses.MISSING:
                    defaults[f.name] = f.default
        old = {k: recorded[k] if k in recorded else defaults.get(k, recorded.get(k)) for k in now}
        return changed_settings(old, now)


@contextmanager
def rank_lock(stage: StageDir, rank: int, log: Callable[[str], None] = print) -> Iterator[None]:
    """Hold `locks/NNNNN.lock` of this rank (flock, released by the kernel if the process dies)."""
    import fcntl
    import socket

    path = stage.lock(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = path.read_text().strip() or "another process"
            raise StageRefused(
                f"{stage.path.name}: rank {rank} is being computed by another process ({holder}; lock {path}). "
                "Two writers on one rank are refused: wait for that one to finish (a rerun then skips the rank) "
                "or stop it, then rerun"
            ) from None
        except OSError as exc:  # a filesystem without locks: say so, do not refuse to work
            log(
                f"{stage.path.name}: cannot lock {path} ({exc}): concurrent writers of rank {rank} are not detected"
            )
        os.ftruncate(fd, 0)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode())
        yield
    finally:
        os.close(fd)


def _refuse_changed(stage: StageDir, rank: int, changes: list[str], what: str) -> None:
    if changes:
        raise StageRefused(
            f"{stage.path.name}: {what} was computed with other inputs than this run: {'; '.join(changes)} "
            f"(recorded in {stage.marker(rank)}, config in {stage.config}). Rerun with --redo to recompute "
            "(every rank of the stage), or restore the recorded values"
        )


def recorded_games(stage: StageDir) -> dict:
    """The games (split -> identity) the complete ranks of `stage` recorded playing."""
    games: dict = {}
    for r in stage.completed_ranks():
        games |= ((stage.read_marker(r) or {}).get("inputs") or {}).get("games") or {}
    return games


def _refuse_games_changed_since_upstream(stage: StageDir, inputs: StageInputs) -> None:
    """A stage that plays on from an upstream stage's episodes (fork from sample) must play the games those
    episodes were played on: recomputing this stage alone would not help, the upstream one must be redone."""
    for name in inputs.upstream:
        before = recorded_games(StageDir(stage.path.parent / name))
        changes = changed_settings(
            {s: g for s, g in before.items() if s in (inputs.games or {})},
            {s: g for s, g in (inputs.games or {}).items() if s in before},
        )
        if changes:
            raise StageRefused(
                f"{stage.path.name}: the games changed since the {name} stage played them: "
                f"{'; '.join(f'games.{c}' for c in changes)}. Rerun the round's stages from {name} with --redo, "
                "or restore the games"
            )


def run_rank(
    stage: StageDir,
    kind: str,
    run,
    inputs: StageInputs,
    compute: Callable[[StageStats], list[dict]],
    log: Callable[[str], None] = print,
) -> bool:
    """Compute and persist rank `run.rank` under its lock; returns False when it was complete and skipped.

    Refused (`StageRefused`): another process holds the rank, or without `run.redo` this
    rank or another complete rank of the stage recorded other inputs than `inputs`.
    """
    rank, name = run.rank, stage.path.name
    with rank_lock(stage, rank, log):
        for path in (stage.shard(rank), stage.stats_file(rank), stage.marker(rank)):
            for tmp in stale_tmp_files(path):  # left by a writer of this rank that was killed
                tmp.unlink(missing_ok=True)
        record = inputs.record(stage)
        marker = stage.read_marker(rank)
        if marker is not None and not run.redo:
            problem = stage.problem(rank)
            if problem is None:
                if "inputs" not in marker:
                    log(
                        f"{name}: rank {rank}'s marker predates recorded inputs: reused unchecked (--redo recomputes)"
                    )
                else:
                    _refuse_changed(stage, rank, inputs.changes(marker["inputs"], record), f"rank {rank}")
                    if "games" in record and "games" not in marker["inputs"]:
                        log(
                            f"{name}: rank {rank}'s marker predates recorded games: reused unchecked (--redo recomputes)"
                        )
                log(f"{name}: rank {rank} already complete, skipping ({stage.marker(rank)})")
                return False
            log(f"{name}: rank {rank} is recomputed: {problem}")
        if not run.redo:
            for other in stage.completed_ranks():
                recorded = (stage.read_marker(other) or {}).get("inputs") if other != rank else None
                if recorded is not None:
                    _refuse_changed(stage, other, inputs.changes(recorded, record), f"its rank {other}")
        _refuse_games_changed_since_upstream(stage, inputs)
        stage.marker(rank).unlink(missing_ok=True)
        write_stage_config(stage, inputs.configs, inputs.seed)
        stats = StageStats()
        t0 = time.perf_counter()
        rows = compute(stats)
        stats.seconds = time.perf_counter() - t0
        stats.rows = len(rows)
        write_shard(rows, stage.shard(rank), kind)
        write_json_atomic(stats.to_dict(), stage.stats_file(rank))
        marker = {**shard_digest(stage.shard(rank)), "finished": time.time()}
        write_json_atomic(marker | {"fingerprint": fingerprint(record), "inputs": record}, stage.marker(rank))
    return True


def read_stage(stage: StageDir, kind: str, world_size: int | None = None):
    """All shards of a completed upstream stage; fails naming what is missing or wrong and the fix.

    Every rank of the stage must be complete: 0 .. n-1 for the world size its markers
    record (else `world_size`), each shard matching its marker, all ranks with the same
    recorded inputs.
    """
    name, files = stage.path.name, stage.shard_files()
    done = stage.completed_ranks()
    if not files and not done:
        raise FileNotFoundError(
            f"no {kind} shards in {stage.shards}: run the {name} stage for this round first"
        )
    markers = {r: stage.read_marker(r) or {} for r in done}
    unmarked = [f for f in files if not f.stem.isdigit() or int(f.stem) not in markers]
    if unmarked:
        raise FileNotFoundError(
            f"{name} shards {[f.name for f in unmarked]} have no completion marker: the stage was "
            f"interrupted; rerun it (completed ranks are skipped)"
        )
    recorded_sizes = {r: m["inputs"].get("world_size") for r, m in markers.items() if "inputs" in m}
    sizes = sorted(set(recorded_sizes.values()) - {None})
    if len(sizes) > 1:
        by_size = {s: [r for r, v in recorded_sizes.items() if v == s] for s in sizes}
        raise FileNotFoundError(
            f"{name}: its ranks were computed with different world sizes ({by_size}, world size: ranks): rerun "
            f"the stage with --redo at one world size, or delete the ranks of the other one from {stage.path}"
        )
    expected = sizes[0] if sizes else world_size
    if expected is not None:
        missing = sorted(set(range(expected)) - set(markers))
        if missing:
            raise FileNotFoundError(
                f"{name}: rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of world size "
                f"{expected} {'have' if len(missing) > 1 else 'has'} not finished (no completion marker in "
                f"{stage.completions}): run the {name} stage with --rank R --world_size {expected} for "
                f"{'them' if len(missing) > 1 else 'it'} first (complete ranks are skipped)"
            )
        extra = sorted(r for r in markers if r >= expected) if sizes else []
        if extra:
            raise FileNotFoundError(
                f"{name}: ranks {extra} lie outside the world size {expected} the other ranks recorded (left from "
                f"an earlier run): delete their shards and markers ({stage.shards}, {stage.completions}) or rerun "
                f"the stage with --redo"
            )
    for r in sorted(markers):
        problem = stage.problem(r)
        if problem:
            raise ShardError(
                f"{name} rank {r}: {problem}. Rerun the {name} stage: a rank whose shard does not match its "
                f"marker is recomputed (complete ranks are skipped)"
            )
    recorded = {r: m["inputs"] for r, m in markers.items() if "inputs" in m}
    if recorded:
        first = min(recorded)
        for r, rec in recorded.items():
            changes = changed_settings(recorded[first], rec)
            if changes:
                raise StageRefused(
                    f"{name}: ranks {first} and {r} were computed with different inputs ({'; '.join(changes)}): "
                    f"rerun the {name} stage with --redo so that every rank is computed with this recipe"
                )
    return read_shards([stage.shard(r) for r in sorted(markers)], kind, name)


def record_skipped_games(stats: StageStats | None, index, log: Callable[[str], None] = print) -> None:
    """Games the index skipped (unreadable, unsupported, ...): counted in the stage's stats and said."""
    if not index.skipped:
        return
    if stats is not None:
        skipped = Counter(stats.extra.get("games_skipped", {}))
        skipped.update(index.skipped)
        stats.extra["games_skipped"] = dict(sorted(skipped.items()))
    log(f"games: {index.summary()}")


def collect_stats(stage: StageDir) -> dict:
    """Sum of the per-rank stats files of a stage."""
    total: dict = {"rows": 0, "tokens": 0, "seconds": 0.0, "failures": Counter(), "games_skipped": Counter()}
    for f in sorted(stage.stats.glob("*.json")) if stage.stats.is_dir() else []:
        s = json.loads(f.read_text())
        total["rows"] += s.get("rows", 0)
        total["tokens"] += s.get("tokens", 0)
        total["seconds"] += s.get("seconds", 0.0)
        total["failures"].update(s.get("failures", {}))
        total["games_skipped"].update(s.get("games_skipped", {}))
    total["failures"] = dict(total["failures"])
    total["games_skipped"] = dict(total["games_skipped"])
    return total


def progress_bar(total: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="ep", dynamic_ncols=True)
