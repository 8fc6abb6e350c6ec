"""What every data stage shares: rank sharding, atomic outputs, completion markers, stats.

A stage is a pure function of (inputs, config, seed, rank, world_size). `run_rank` wraps
it with the run-directory contract: a rank whose completion marker exists is skipped
(unless `redo`), its shard is written to `*.tmp` then renamed, stats go next to it, and the
marker is written last. Any rank can run as its own process on any machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import yaml

from selskill.data.layout import StageDir
from selskill.data.shards import read_shards, write_json_atomic, write_shard


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


def write_stage_config(stage: StageDir, configs: Sequence) -> None:
    """The resolved recipe of this stage (all dataclasses), for reproducibility.

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
    merged = {}
    for cfg in configs:
        for f in dataclasses.fields(cfg):
            value = getattr(cfg, f.name)
            if isinstance(value, (str, int, float, bool, type(None), list, tuple, dict)):
                merged[f.name] = list(value) if isinstance(value, tuple) else value
    stage.path.mkdir(parents=True, exist_ok=True)
    tmp = stage.config.with_name("config.yaml.tmp")
    tmp.write_text(yaml.safe_dump(merged, sort_keys=True))
    tmp.replace(stage.config)


def run_rank(
    stage: StageDir,
    kind: str,
    rank: int,
    redo: bool,
    compute: Callable[[StageStats], list[dict]],
    log: Callable[[str], None] = print,
) -> bool:
    """Compute and persist one rank; returns False when it was already complete and skipped."""
    if stage.is_complete(rank) and not redo:
        log(f"{stage.path.name}: rank {rank} already complete, skipping ({stage.marker(rank)})")
        return False
    stage.marker(rank).unlink(missing_ok=True)
    stats = StageStats()
    t0 = time.perf_counter()
    rows = compute(stats)
    stats.seconds = time.perf_counter() - t0
    stats.rows = len(rows)
    write_shard(rows, stage.shard(rank), kind)
    write_json_atomic(stats.to_dict(), stage.stats_file(rank))
    stage.marker(rank).parent.mkdir(parents=True, exist_ok=True)
    stage.marker(rank).write_text(json.dumps({"rows": stats.rows, "finished": time.time()}) + "\n")
    return True


def read_stage(stage: StageDir, kind: str, world_size: int | None = None):
    """All shards of a completed upstream stage; fails naming what is missing and the fix."""
    files = stage.shard_files()
    if not files:
        raise FileNotFoundError(
            f"no {kind} shards in {stage.shards}: run the {stage.path.name} stage for this round first"
        )
    done = set(stage.completed_ranks())
    incomplete = [f for f in files if int(f.stem) not in done]
    if incomplete:
        raise FileNotFoundError(
            f"{stage.path.name} shards {[f.name for f in incomplete]} have no completion marker: the stage was "
            f"interrupted; rerun it (completed ranks are skipped)"
        )
    if world_size is not None and len(done) < world_size:
        missing = sorted(set(range(world_size)) - done)
        raise FileNotFoundError(f"{stage.path.name}: ranks {missing} have not finished; run them first")
    return read_shards(files, kind)


def collect_stats(stage: StageDir) -> dict:
    """Sum of the per-rank stats files of a stage."""
    total: dict = {"rows": 0, "tokens": 0, "seconds": 0.0, "failures": Counter()}
    for f in sorted(stage.stats.glob("*.json")) if stage.stats.is_dir() else []:
        s = json.loads(f.read_text())
        total["rows"] += s.get("rows", 0)
        total["tokens"] += s.get("tokens", 0)
        total["seconds"] += s.get("seconds", 0.0)
        total["failures"].update(s.get("failures", {}))
    total["failures"] = dict(total["failures"])
    return total


def progress_bar(total: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="ep", dynamic_ncols=True)
