"""Check that games are playable before any policy touches them.

A game that starts won, has no task text, or whose known solution does not win would
silently corrupt success rates and preference labels downstream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from selskill.envs.alfworld import AlfworldEnv, GameIndex, GameRecord
from selskill.envs.base import EnvError


@dataclass
class VerifyReport:
    total: int = 0
    winnable: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (task_id, reason)

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.winnable == self.total


def known_solution(record: GameRecord) -> list[str] | None:
    """The walkthrough stored with the game (generated games always carry one)."""
    with open(record.path) as f:
        walkthrough = json.load(f).get("walkthrough")
    return list(walkthrough) if walkthrough else None


def verify_game(env: AlfworldEnv, record: GameRecord) -> str | None:
    """None when the game is sound, else the reason it is not."""
    try:
        state = env.reset(record.task_id)
    except EnvError as exc:
        return f"load_error: {exc}"
    if not state.task or "UNKNOWN GOAL" in state.observation:
        return "no_task_text"
    if state.won:
        return "won_at_start"
    solution = known_solution(record)
    if solution is None:
        return "no_known_solution"
    for i, command in enumerate(solution):
        if command not in state.admissible_commands:
            return f"solution_step_{i}_inadmissible: {command!r}"
        state = env.step(command)
    return None if state.won else "solution_does_not_win"


def verify_games(index: GameIndex, progress: bool = False) -> VerifyReport:
    env = AlfworldEnv(index)
    report = VerifyReport()
    games = index.games
    if progress:
        from tqdm.auto import tqdm

        games = tqdm(games, desc="verify-games", unit="game")
    for record in games:
        report.total += 1
        reason = verify_game(env, record)
        if reason is None:
            report.winnable += 1
        else:
            report.failures.append((record.task_id, reason))
    return report
