"""The run directory contract every stage follows (DESIGN.md, "Run directory").

runs/<exp>/round_<r>/<stage>/{config.yaml, shards/NNNNN.parquet, completions/NNNNN, stats/NNNNN.json}
A rank's completion marker is written only after its shard is durably in place, so a rank
with a marker is skipped on rerun and a crash never leaves a half-written shard visible.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

STAGES = ("sample", "branch", "fork", "label", "train", "eval")


@dataclass(frozen=True)
class StageDir:
    path: Path

    @classmethod
    def of(cls, runs_dir: str | Path, exp: str, round_: int, stage: str) -> StageDir:
        return cls(round_dir(runs_dir, exp, round_) / stage)

    @property
    def shards(self) -> Path:
        return self.path / "shards"

    @property
    def completions(self) -> Path:
        return self.path / "completions"

    @property
    def stats(self) -> Path:
        return self.path / "stats"

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    def shard(self, rank: int) -> Path:
        return self.shards / f"{rank:05d}.parquet"

    def marker(self, rank: int) -> Path:
        return self.completions / f"{rank:05d}"

    def stats_file(self, rank: int) -> Path:
        return self.stats / f"{rank:05d}.json"

    def is_complete(self, rank: int) -> bool:
        return self.marker(rank).exists() and self.shard(rank).exists()

    def completed_ranks(self) -> list[int]:
        if not self.completions.is_dir():
            return []
        return sorted(int(p.name) for p in self.completions.iterdir() if p.name.isdigit())

    def shard_files(self) -> list[Path]:
        return sorted(self.shards.glob("*.parquet")) if self.shards.is_dir() else []


def round_dir(runs_dir: str | Path, exp: str, round_: int) -> Path:
    return Path(runs_dir) / exp / f"round_{round_}"


def policy_dir(runs_dir: str | Path, exp: str, round_: int) -> Path:
    """The policy round r samples with: round r-1's trained model (round_0 = the init policy)."""
    return round_dir(runs_dir, exp, round_ - 1) / "train" / "model"


def resolve_round_policy(run, policy) -> tuple[str, str]:
    """The policy round `run.round` starts from: (model path or hub id, how it was chosen).

    Round r starts from round r-1's trained model; round 1 from `model_name_or_path` when set,
    else the run's init policy. Sampling, branching, forking and training all use this.
    """
    if run.round <= 1 and policy.model_name_or_path:
        source = policy.model_name_or_path
        if Path(source).exists() or os.path.isabs(source) or source.startswith(".") or source.count("/") > 1:
            if not Path(source).is_dir():
                raise FileNotFoundError(f"model_name_or_path {source} is not a model directory")
            return source, "model_name_or_path (local)"
        return source, "model_name_or_path (hub id)"
    path = policy_dir(run.runs_dir, run.exp, run.round)
    if not path.is_dir():
        hint = (
            "build the init policy first (`make init`) or set model_name_or_path"
            if run.round <= 1
            else f"finish round {run.round - 1} first (its train stage writes that directory)"
        )
        raise FileNotFoundError(f"no policy at {path} for round {run.round}: {hint}")
    return str(path), f"round {run.round - 1} model"
