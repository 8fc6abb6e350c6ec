"""What a rank records about its own work next to its shard (`stats/NNNNN.json`), and their sum over ranks.

The stats are the stage's account of itself (rows, tokens, seconds, failures by reason, the
games the task index skipped); the round summary, wandb and the replication read them back
from the files, so the figures are the whole stage's whichever processes computed the ranks.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from selskill.data.layout import StageDir


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

    def count_skipped_games(self, skipped: dict) -> None:
        """Add the task index's skipped games (reason -> count) to `games_skipped`."""
        total = Counter(self.extra.get("games_skipped", {}))
        total.update(skipped)
        self.extra["games_skipped"] = dict(sorted(total.items()))


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
