"""The run directory contract every stage follows (DESIGN.md, "Run directory").

runs/<exp>/round_<r>/<stage>/{config.yaml, shards/NNNNN.parquet, completions/NNNNN, stats/NNNNN.json}
A rank's completion marker is written only after its shard is durably in place, so a rank
with a marker is skipped on rerun and a crash never leaves a half-written shard visible.
"""

from __future__ import annotations

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
