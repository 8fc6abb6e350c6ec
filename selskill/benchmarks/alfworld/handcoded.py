"""alfworld's own hand-coded TextWorld expert, as a second opinion on whether a game is winnable.

`verify-games --expert handcoded` uses it for games without a stored walkthrough. It reads
the engine's facts, which `AlfworldEnv` does not request, so it runs on an engine of its
own (created once per player: every engine loads its own libdownward copy). Games are
loaded the way `AlfworldEnv` loads them (old grammar patched in memory or refused). Its
fallback moves are random: they are drawn from a generator seeded per game.
"""

from __future__ import annotations

import random

from selskill.benchmarks.alfworld.env import GameRecord
from selskill.benchmarks.alfworld.grammar import check_mode, load_game


class HandcodedPlayer:
    def __init__(self, grammar: str = "patch"):
        self.grammar = check_mode(grammar)
        self._engine = None

    def _make(self):
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert
        from textworld.envs.pddl import PddlEnv

        infos = textworld.EnvInfos(admissible_commands=True, won=True, facts=True)
        return AlfredExpert(AlfredDemangler(PddlEnv(infos)), expert_type="handcoded")

    def play(self, record: GameRecord, max_steps: int) -> tuple[int, bool, str | None]:
        """(steps played, won, None if won else the reason)."""
        data, _ = load_game(record.path, self.grammar)
        if self._engine is None:
            self._engine = self._make()
        saved = random.getstate()
        random.seed(f"selskill-handcoded:{record.task_id}")
        try:
            self._engine.load(data)
            self._engine.gamefile = record.path  # its expert finds traj_data.json next to this
            state = self._engine.reset()
            steps = 0
            while not state["won"] and steps < max_steps:
                plan = state.get("extra.expert_plan") or ["look"]
                state, _, _ = self._engine.step(plan[0])
                steps += 1
        except Exception as exc:  # its own timeout ("Timeout") and engine errors
            return 0, False, f"handcoded_error: {exc!r}"
        finally:
            random.setstate(saved)
        return steps, bool(state["won"]), None if state["won"] else "step_limit"
