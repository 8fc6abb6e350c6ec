"""How one rank of a stage is written: the writer's half of the run-directory contract.

A stage is a pure function of (inputs, config, seed, rank, world_size). `run_rank` wraps
it with the contract (docs/design.md, "The stage contract"):
- one writer per rank: the rank holds `locks/NNNNN.lock` (flock) while it runs, and a
  second process on the same rank is refused with a message naming the holder;
- a rank is skipped only when its completion marker verifies (its shard has exactly the
  bytes and sha256 the marker records) and the inputs the marker records (the material
  config keys, seed, code version, policy and upstream shards) equal this run's; recorded
  inputs that differ are refused naming the keys that differ (`--redo` recomputes), and a
  marker that does not verify is recomputed;
- shard, stats and marker are each written to a unique temporary file then renamed, the
  marker last, so a crash at any point leaves the rank incomplete, never half-written.
Any rank can run as its own process on any machine. The reader's half is
`selskill.data.contract`; what a marker records is `selskill.data.inputs`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import yaml

from selskill.data.contract import StageRefused, changed_inputs, check_stage, hold_lock
from selskill.data.inputs import StageInputs, changed_settings, config_values, fingerprint
from selskill.data.layout import StageDir
from selskill.data.shards import (
    shard_digest,
    stale_tmp_files,
    write_json_atomic,
    write_shard,
    write_text_atomic,
)
from selskill.data.stage_stats import StageStats

logger = logging.getLogger(__name__)


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


def rank_lock(stage: StageDir, rank: int, log: Callable[[str], None] = logger.info):
    """Hold `locks/NNNNN.lock` of this rank (flock, released by the kernel if the process dies)."""
    return hold_lock(stage.lock(rank), f"{stage.path.name}: rank {rank}", log)


def _refuse_changed(stage: StageDir, rank: int, changes: list[str], what: str) -> None:
    if changes:
        raise changed_inputs(
            f"{stage.path.name}: {what}",
            changes,
            stage.marker(rank),
            f"Rerun with --redo to recompute (every rank of the stage; config in {stage.config})",
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
    for up in inputs.upstream_stages(stage):
        name, before = up.path.name, recorded_games(up)
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


def _reusable(
    stage: StageDir, rank: int, inputs: StageInputs, record: dict, log: Callable[[str], None]
) -> bool:
    """Whether rank `rank`'s marker verifies and recorded `record`'s inputs (other inputs are refused)."""
    name, marker = stage.path.name, stage.read_marker(rank)
    if marker is None:
        return False
    problem = stage.problem(rank)
    if problem is not None:
        log(f"{name}: rank {rank} is recomputed: {problem}")
        return False
    if "inputs" not in marker:
        log(f"{name}: rank {rank}'s marker predates recorded inputs: reused unchecked (--redo recomputes)")
    else:
        if "games" in record and "games" not in marker["inputs"]:
            log(f"{name}: rank {rank}'s marker predates recorded games: reused unchecked (--redo recomputes)")
        _refuse_changed(stage, rank, inputs.changes(marker["inputs"], record), f"rank {rank}")
    log(f"{name}: rank {rank} already complete, skipping ({stage.marker(rank)})")
    return True


def run_rank(
    stage: StageDir,
    kind: str,
    run,
    inputs: StageInputs,
    compute: Callable[[StageStats], list[dict]],
    log: Callable[[str], None] = logger.info,
) -> bool:
    """Compute and persist rank `run.rank` under its lock; returns False when it was complete and skipped.

    Refused (`StageRefused`): another process holds the rank, or without `run.redo` this
    rank or another complete rank of the stage recorded other inputs than `inputs`. The
    upstream stages are verified before this rank's marker is removed, so a run (`--redo`
    included) that fails on a missing or corrupt input leaves every marker as it was.
    """
    rank = run.rank
    with rank_lock(stage, rank, log):
        for path in (stage.shard(rank), stage.stats_file(rank), stage.marker(rank)):
            for tmp in stale_tmp_files(path):  # left by a writer of this rank that was killed
                tmp.unlink(missing_ok=True)
        record = inputs.record(stage)
        if not run.redo:
            if _reusable(stage, rank, inputs, record, log):
                return False
            for other in stage.completed_ranks():
                recorded = (stage.read_marker(other) or {}).get("inputs") if other != rank else None
                if recorded is not None:
                    _refuse_changed(stage, other, inputs.changes(recorded, record), f"its rank {other}")
        # before anything is removed: a run that cannot compute keeps all
        for up in inputs.upstream_stages(stage):
            check_stage(up, run.world_size)
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
