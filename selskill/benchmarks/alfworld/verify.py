"""Check that games are playable before any policy touches them.

A game that starts won, has no task text, or cannot be won would silently corrupt success
rates and preference labels downstream. A game with a stored walkthrough (every generated
game) is checked by replaying it. Real ALFWorld data carries none, so there a player must
win the game instead: our expert (selskill/benchmarks/alfworld/expert.py, no skill calls; the default) or
alfworld's hand-coded expert (`expert="handcoded"`). A game a player loses is reported
lost with the reason ("expert_stuck", "step_limit"): not proof that it is unwinnable, but
a game the demonstrations cannot use either.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from selskill.benchmarks.alfworld.env import AlfworldEnv, GameIndex, GameRecord
from selskill.envs.base import EnvError

EXPERTS = ("ours", "handcoded")
DEFAULT_MAX_STEPS = 150  # per game, for the players; real scenes take up to ~60 steps


@dataclass
class VerifyReport:
    total: int = 0
    winnable: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (task_id, reason)
    won_by: Counter = field(default_factory=Counter)  # "walkthrough" | "ours" | "handcoded" -> games
    skipped: Counter = field(default_factory=Counter)  # the index's skip reasons
    patched: int = 0  # games patched from alfworld's old grammar

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.winnable == self.total

    def summary(self) -> str:
        by = ", ".join(f"{k} {v}" for k, v in sorted(self.won_by.items())) or "none"
        skipped = ", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())) or "none"
        lost = Counter(reason.split(":", 1)[0] for _, reason in self.failures)
        lost_text = ", ".join(f"{k}={v}" for k, v in sorted(lost.items())) or "none"
        return (
            f"won {self.winnable} (by {by}); lost {len(self.failures)} ({lost_text}); "
            f"skipped {sum(self.skipped.values())} ({skipped}); patched from old grammar {self.patched}"
        )


def known_solution(record: GameRecord) -> list[str] | None:
    """The walkthrough stored with the game (generated games always carry one; real data none)."""
    with open(record.path) as f:
        walkthrough = json.load(f).get("walkthrough")
    return list(walkthrough) if walkthrough else None


def verify_game(
    env: AlfworldEnv,
    record: GameRecord,
    expert: str = "ours",
    max_steps: int = DEFAULT_MAX_STEPS,
    handcoded=None,
    walkthrough: bool = True,
) -> tuple[str | None, str]:
    """(None when the game is sound, else the reason it is not; what showed it: walkthrough | ours | handcoded)."""
    try:
        state = env.reset(record.task_id)
    except EnvError as exc:
        return f"load_error: {exc}", "load"
    if not state.task or "UNKNOWN GOAL" in state.observation:
        return "no_task_text", "load"
    if state.won:
        return "won_at_start", "load"
    solution = known_solution(record) if walkthrough else None
    if solution is not None:
        for i, command in enumerate(solution):
            if command not in state.admissible_commands:
                return f"solution_step_{i}_inadmissible: {command!r}", "walkthrough"
            state = env.step(command)
        return (None if state.won else "solution_does_not_win"), "walkthrough"
    if expert == "handcoded":
        from selskill.benchmarks.alfworld.handcoded import HandcodedPlayer

        player = handcoded or HandcodedPlayer(env.grammar)
        _, won, reason = player.play(record, max_steps)
        return (None if won else reason), "handcoded"
    from selskill.benchmarks.alfworld.expert import play_expert

    try:
        _, _, reason = play_expert(env, record, max_env_steps=max_steps)
    except (EnvError, OSError, ValueError, KeyError) as exc:
        reason = f"expert_error: {exc!r}"
    return reason, "ours"


def verify_games(
    index: GameIndex,
    progress: bool = False,
    expert: str = "ours",
    max_steps: int = DEFAULT_MAX_STEPS,
    walkthrough: bool = True,
) -> VerifyReport:
    """Verify every indexed game; games without a walkthrough (all, with `walkthrough=False`) are played by `expert`."""
    if expert not in EXPERTS:
        raise ValueError(f"expert must be one of {', '.join(EXPERTS)}; got {expert!r}")
    env = AlfworldEnv(index)
    handcoded = None
    if expert == "handcoded":
        from selskill.benchmarks.alfworld.handcoded import HandcodedPlayer

        handcoded = HandcodedPlayer(env.grammar)
    report = VerifyReport(skipped=Counter(index.skipped))
    games = index.games
    if progress:
        from tqdm.auto import tqdm

        games = tqdm(games, desc="verify-games", unit="game")
    for record in games:
        report.total += 1
        reason, by = verify_game(
            env, record, expert=expert, max_steps=max_steps, handcoded=handcoded, walkthrough=walkthrough
        )
        if reason is None:
            report.winnable += 1
            report.won_by[by] += 1
        else:
            report.failures.append((record.task_id, reason))
    report.patched = len(env.patched)
    return report
