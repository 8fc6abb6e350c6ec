"""`train_objective: sft_wins`: rejection-sampling fine-tuning on a round's own winning samples.

The simplest baseline for DPO on the same rollouts ("SFT on wins"): every successful episode
of the round's sample stage is a target, each of a task's K samples that won, not one per
task. A failed episode is left out, and so is a win with a malformed turn (label never
chooses a side that holds one; the paper removes malformed positives). A row is the
episode's token ids as the policy saw and produced them, the way every other reader takes
them (chat templates are not prefix-stable: nothing is re-tokenized), and the loss is on its
assistant tokens (`ROLE_ASSISTANT`: each turn's generated tokens and its end of turn; sample
rows hold no forced tokens). The prompt, the observations and the skill returns are context,
and the tokens after the last assistant turn, which no loss reaches, are cut. A win longer
than `max_length` is skipped and counted (`train_overflow: error` refuses it): a truncated
episode teaches an unfinished one. The training is `selskill.train.sft`, the init's SFT.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from selskill.data.contract import read_stage
from selskill.data.layout import StageDir
from selskill.data.schema import ROLE_ASSISTANT
from selskill.data.shards import write_json_atomic
from selskill.train.dataset import NoTrainablePairs

logger = logging.getLogger(__name__)

WINS_STATS_FILE = "wins_stats.json"
COLUMNS = ("rollout_id", "task_id", "success", "n_malformed", "token_ids", "role")


@dataclass
class WinStats:
    """What happened to every sample episode read; written to train/wins_stats.json and logged."""

    episodes: int = 0  # sample rows read
    failed: int = 0
    malformed: int = 0  # wins with a malformed turn
    too_long: int = 0  # clean wins longer than max_length
    trained: int = 0  # episodes trained
    tasks: int = 0  # tasks with a trained episode
    tokens: int = 0  # tokens of the trained rows (per epoch)
    assistant_tokens: int = 0  # of them, those that carry the loss

    def to_dict(self) -> dict:
        return asdict(self)

    def report(self) -> str:
        return (
            f"sft_wins: {self.trained} winning episodes of {self.tasks} tasks trained ({self.assistant_tokens} "
            f"assistant tokens of {self.tokens}); of {self.episodes} sampled, left out: {self.failed} failed, "
            f"{self.malformed} wins with a malformed turn, {self.too_long} wins longer than max_length"
        )


def win_rows(table, max_length: int | None, overflow: str = "skip") -> tuple[list[dict], WinStats]:
    """The token rows (`input_ids`, `assistant_masks`) of `table`'s clean wins, in table order, and the counts."""
    stats = WinStats(episodes=table.num_rows)
    rows, tasks = [], set()
    for ep in table.select(list(COLUMNS)).to_pylist():
        if not ep["success"]:
            stats.failed += 1
            continue
        if ep["n_malformed"]:
            stats.malformed += 1
            continue
        mask = [int(r == ROLE_ASSISTANT) for r in ep["role"]]
        end = max((i + 1 for i, bit in enumerate(mask) if bit), default=0)
        if max_length is not None and end > max_length:
            if overflow == "error":
                raise ValueError(
                    f"train: the winning episode {ep['rollout_id']} has {end} tokens through its last assistant "
                    f"turn, more than max_length={max_length}: raise max_length, or set train_overflow: skip to "
                    "leave such wins out (counted)"
                )
            stats.too_long += 1
            continue
        rows.append({"input_ids": ep["token_ids"][:end], "assistant_masks": mask[:end]})
        tasks.add(ep["task_id"])
        stats.tokens += end
        stats.assistant_tokens += sum(mask[:end])
    stats.trained, stats.tasks = len(rows), len(tasks)
    return rows, stats


def load_win_dataset(run, cfg, sample: StageDir, is_main: bool, stage_path: Path):
    """The round's winning episodes as token rows (every process builds the same rows from the verified sample
    shards; the main process logs and writes their counts)."""
    from selskill.train.sft import rows_dataset

    table = read_stage(sample, "rollout", run.world_size, columns=COLUMNS)
    rows, stats = win_rows(table, cfg.max_length, cfg.train_overflow)
    if is_main:
        logger.info(stats.report())
        write_json_atomic(stats.to_dict(), stage_path / WINS_STATS_FILE)
    if not rows:
        raise NoTrainablePairs(
            f"round {run.round} has no winning episode to train on (train_objective sft_wins: {stats.episodes} "
            f"sampled, {stats.failed} failed, {stats.malformed} wins with a malformed turn, {stats.too_long} longer "
            "than max_length). Sample more (sample_k, sample_max_tasks), give episodes more steps "
            "(max_decisions), raise max_length, or start from a stronger policy"
        )
    return rows_dataset(rows)
