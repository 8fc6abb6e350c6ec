"""What a stage's output depends on: its recorded inputs, their fingerprint, and how two records differ.

Every stage that writes a run directory, train included, records these inputs next to its
output (a rank's completion marker, train's COMPLETED and each of its checkpoints) and
compares them on every rerun: an output computed from other inputs is refused naming the
keys that differ, never silently reused (docs/design.md, "The stage contract"). They live
here, below the stages and the trainer, so that both record them one way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from selskill.data.layout import StageDir, is_local_path
from selskill.data.manifest import content_identity, file_hashes, manifest_store
from selskill.data.shards import file_sha256

logger = logging.getLogger(__name__)
_NOTED: set = set()  # the policies whose sampled records this process has noted

# Keys that say where, as whom or how fast a stage runs, or how it reports, not what it computes:
# they are not part of a rank's recorded inputs (each episode samples from its own seeded
# generator, so batching and concurrency change results only at float rounding; docs/design.md).
NOT_INPUTS = frozenset(
    {
        "exp",
        "runs_dir",
        "rank",
        "redo",
        "dry_run",
        "report_to",
        "log_level",
        "wandb_project",
        "policy_device",
        "trust_remote_code",
        "concurrent_episodes",
        "policy_batch_size",
        "env_overlap",
    }
)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def changed_settings(old: dict, new: dict) -> list[str]:
    """`key: old -> new` for every (nested, dotted) key whose value differs; `(none)` where one lacks it."""
    a, b = _flatten(old), _flatten(new)
    return [
        f"{k}: {a.get(k, '(none)')!r} -> {b.get(k, '(none)')!r}"
        for k in sorted(set(a) | set(b))
        if a.get(k, "(none)") != b.get(k, "(none)")
    ]


def with_nested(configs: Sequence) -> list:
    """`configs` and the sections they hold (the run section holds its benchmark's own section): the
    keys of both are inputs of a stage that is given the run section."""
    out = []
    for cfg in configs:
        out.append(cfg)
        out += [
            getattr(cfg, f.name)
            for f in dataclasses.fields(cfg)
            if dataclasses.is_dataclass(getattr(cfg, f.name)) and not isinstance(getattr(cfg, f.name), type)
        ]
    return out


def config_values(configs: Sequence) -> dict:
    """The plain-valued fields of the recipe sections `configs` and of those they hold (tuples as lists)."""
    merged = {}
    for cfg in with_nested(configs):
        for f in dataclasses.fields(cfg):
            value = getattr(cfg, f.name)
            if isinstance(value, (str, int, float, bool, type(None), list, tuple, dict)):
                merged[f.name] = list(value) if isinstance(value, tuple) else value
    return merged


CONTENT_PREFIX = "sha256:"  # a policy fingerprinted by every byte (a record without it sampled the files)


def policy_fingerprint(source: str, runs_dir: str | Path) -> str:
    """Identity of a model: for a directory, the sha256 of every byte of each of its files; else the hub id.

    Content, not path: an experiment that links another's round 0 has the same policy. Every
    byte, because a weight changed in the middle of a file changes what the model samples. The
    hashes come from a manifest under `runs_dir` (`selskill.data.manifest`), so a rerun rehashes
    only files whose stat changed (docs/benchmarks.md, "The policy by content").
    """
    if not is_local_path(source):
        return f"hub:{source}"
    path = Path(source).expanduser()
    if not path.is_dir():
        return f"missing:{source}"
    files = {p.name: p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")}
    hashes = file_hashes(files, manifest_store(runs_dir, "policy", path))
    return f"{CONTENT_PREFIX}{content_identity(hashes)['sha256']}"


def sampled_policy_fingerprint(source: str) -> str:
    """What a record written before policies were fingerprinted by every byte holds: the files' names and
    sizes and their first and last MiB. Read only to recognise such a record as this policy."""
    path = Path(source).expanduser()
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
    """What a stage's output depends on: recorded with it, compared on every rerun.

    `configs` are the recipe sections the stage reads (keys in `not_inputs` left out),
    `code_version` the stage module's `CODE_VERSION` (bump it when a change alters its
    output), `policy` the model it runs, `upstream` the stages of the same round it reads,
    `games` what the tasks it plays are made of, per split (`selskill.stages.task_source.games_identity`):
    content, not path, so regenerated games in the same folder are a changed input.
    """

    configs: Sequence
    seed: int
    code_version: int
    policy: str | None = None
    upstream: Sequence[str] = ()
    not_inputs: frozenset = NOT_INPUTS
    games: dict | None = None

    def upstream_stages(self, stage: StageDir) -> list[StageDir]:
        return [StageDir(stage.path.parent / name) for name in self.upstream]

    def record(self, stage: StageDir) -> dict:
        """As JSON stores it (an enum as its value), so that a record read back compares equal."""
        out = {k: v for k, v in config_values(self.configs).items() if k not in self.not_inputs}
        out["seed"] = int(self.seed)
        out["code_version"] = self.code_version
        if self.policy is not None:
            out["policy"] = policy_fingerprint(self.policy, stage.runs_dir)
        for up in self.upstream_stages(stage):
            out[f"{up.path.name} shards"] = stage_fingerprint(up)
        if self.games is not None:
            out["games"] = self.games
        return json.loads(json.dumps(out, default=str))

    def changes(self, recorded: dict, now: dict) -> list[str]:
        """`key: recorded -> now` for each input that differs.

        A key added to a recipe section after the record was written counts as unchanged
        while it keeps its default; a key that no longer exists is ignored, and so are the
        games of a record written before records held them (`run_rank` says so). A policy
        recorded before policies were fingerprinted by every byte is compared the way it was
        recorded, with a note: such a record cannot tell a change in the middle of a file.
        """
        now = {k: v for k, v in now.items() if k != "games" or k in recorded}
        if self._sampled_policy_matches(recorded.get("policy"), now.get("policy")):
            now = now | {"policy": recorded["policy"]}
        defaults = {}
        for cfg in with_nested(self.configs):
            for f in dataclasses.fields(cfg):
                if f.default is not dataclasses.MISSING:
                    defaults[f.name] = f.default
        defaults = json.loads(json.dumps(defaults, default=str))
        old = {k: recorded[k] if k in recorded else defaults.get(k, recorded.get(k)) for k in now}
        return changed_settings(old, now)

    def _sampled_policy_matches(self, recorded, now) -> bool:
        if not (
            isinstance(recorded, str)
            and isinstance(now, str)
            and now.startswith(CONTENT_PREFIX)
            and not recorded.startswith((CONTENT_PREFIX, "hub:", "missing:"))
        ):
            return False
        if sampled_policy_fingerprint(self.policy) != recorded:
            return False
        if self.policy not in _NOTED:
            _NOTED.add(self.policy)
            logger.info(
                f"{self.policy}: recorded by a selskill that fingerprinted policies by their first and last MiB: "
                "compared that way (--redo records every byte)"
            )
        return True
