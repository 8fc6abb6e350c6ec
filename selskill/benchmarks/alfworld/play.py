"""Play a game in the terminal the way the agent does: actions, skill calls, the same engine.

Seeing the text, the admissible commands and what a skill call really does is the fastest
way to judge a generated game or a skill file.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from selskill.agent.parser import parse_turn
from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.benchmarks.alfworld.env import AlfworldEnv, record_for_trial
from selskill.benchmarks.alfworld.episode import NAVIGATION
from selskill.benchmarks.alfworld.verify import known_solution
from selskill.envs.base import EnvState
from selskill.skills import SkillExecutor, render_listing

HELP = (
    "Type an admissible command, /<skill> [JSON arguments], a <tool_call>...</tool_call>, /skills, or /quit."
)


def _show(state: EnvState, out: Callable[[str], None]) -> None:
    out(state.observation)
    out("  [admissible] " + "; ".join(state.admissible_commands))


class _Session:
    """One game being played by hand: the env, what the player sees, and the steps spent."""

    def __init__(self, env: AlfworldEnv, state: EnvState, out: Callable[[str], None]):
        self.env, self.state, self.out = env, state, out
        self.library = load_alfworld_skills()
        self.executor = SkillExecutor(self.library, NAVIGATION)
        self.steps = 0

    def act(self, command: str) -> None:
        self.state = self.env.step(command)
        self.steps += self.state.env_steps
        _show(self.state, self.out)

    def call(self, skill: str, arguments) -> None:
        record = self.executor.execute(self.env, skill, arguments)
        self.steps += record.env_steps
        self.state = self.env.state
        self.out(
            f"[skill {record.skill}: precise={record.precise} error={record.error} env_steps={record.env_steps}]"
        )
        self.out(record.observation)
        self.out("  [admissible] " + "; ".join(self.state.admissible_commands))

    def handle(self, line: str) -> bool:
        """Play one typed line; False when the player quits."""
        if line in ("/quit", "/exit"):
            return False
        if line == "/skills":
            self.out(render_listing(self.library, style="full"))
        elif line.startswith("/"):
            name, _, raw_args = line[1:].partition(" ")
            try:
                arguments = json.loads(raw_args) if raw_args.strip() else None
            except ValueError:
                self.out('arguments must be a JSON object, e.g. /heat_object {"object": "mug 1"}')
                return True
            self.call(name, arguments)
        elif line.startswith("<"):
            self._turn(line)
        else:
            self.act(line)
        return True

    def _turn(self, line: str) -> None:
        """A turn written as the agent writes it."""
        turn = parse_turn(line, self.library.names)
        if turn.kind == "malformed":
            self.out(f"[malformed: {turn.reason}]")
            self.act(line)  # the environment answers as to any invalid command
        elif turn.kind == "action":
            self.act(turn.action)
        else:
            self.call(turn.skill, turn.arguments)

    def result(self) -> str:
        return f"won={self.state.won} env_steps={self.steps}"


def play_game(
    game_dir: str,
    walkthrough: bool = False,
    read: Callable[[str], str] = input,
    out: Callable[[str], None] = print,
    grammar: str = "patch",
) -> int:
    """Interactive play; `walkthrough` replays the stored solution, or (real data has none) the expert's play."""
    record = record_for_trial(game_dir)
    env = AlfworldEnv([record], grammar=grammar)
    session = _Session(env, env.reset(record.task_id), out)
    _show(session.state, out)
    if walkthrough:
        return _replay(session, record)
    out(HELP)
    while not session.state.done:
        try:
            line = read("> ").strip()
        except EOFError:
            break
        if line and not session.handle(line):
            break
    out(session.result())
    return 0


def _replay(session: _Session, record) -> int:
    """Play the stored solution, or the expert's moves where the game stores none; 0 when it wins."""
    solution = known_solution(record)
    if not solution:
        solution = _expert_moves(session, record)
    for command in solution:
        session.out(f"> {command}")
        session.act(command)
    session.out(session.result())
    return 0 if session.state.won else 1


def _expert_moves(session: _Session, record) -> list[str]:
    from selskill.benchmarks.alfworld.expert import play_expert
    from selskill.benchmarks.alfworld.verify import DEFAULT_MAX_STEPS

    session.out(
        f"[{record.path} stores no walkthrough (real ALFWorld data carries none): "
        "selskill's expert plays it instead, without skill calls]"
    )
    solution, _, reason = play_expert(session.env, record, max_env_steps=DEFAULT_MAX_STEPS)
    if reason:
        session.out(f"[the expert did not win ({reason}) in {len(solution)} steps; its moves follow]")
    session.state = session.env.reset(record.task_id)
    return solution
