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
from selskill.benchmarks.alfworld.verify import known_solution
from selskill.envs.base import EnvState
from selskill.skills import SkillExecutor, render_listing

HELP = (
    "Type an admissible command, /<skill> [JSON arguments], a <tool_call>...</tool_call>, /skills, or /quit."
)


def _show(state: EnvState, out: Callable[[str], None]) -> None:
    out(state.observation)
    out("  [admissible] " + "; ".join(state.admissible_commands))


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
    library = load_alfworld_skills()
    executor = SkillExecutor(library)
    state = env.reset(record.task_id)
    steps = 0
    _show(state, out)
    if walkthrough:
        solution = known_solution(record)
        if not solution:
            from selskill.benchmarks.alfworld.expert import play_expert
            from selskill.benchmarks.alfworld.verify import DEFAULT_MAX_STEPS

            out(
                f"[{record.path} stores no walkthrough (real ALFWorld data carries none): "
                "selskill's expert plays it instead, without skill calls]"
            )
            solution, _, reason = play_expert(env, record, max_env_steps=DEFAULT_MAX_STEPS)
            if reason:
                out(f"[the expert did not win ({reason}) in {len(solution)} steps; its moves follow]")
            state = env.reset(record.task_id)
        for command in solution:
            out(f"> {command}")
            state = env.step(command)
            steps += state.env_steps
            _show(state, out)
        out(f"won={state.won} env_steps={steps}")
        return 0 if state.won else 1
    out(HELP)
    while not state.done:
        try:
            line = read("> ").strip()
        except EOFError:
            break
        if not line:
            continue
        if line in ("/quit", "/exit"):
            break
        if line == "/skills":
            out(render_listing(library, style="full"))
            continue
        if line.startswith("/"):
            name, _, raw_args = line[1:].partition(" ")
            try:
                arguments = json.loads(raw_args) if raw_args.strip() else None
            except ValueError:
                out('arguments must be a JSON object, e.g. /heat_object {"object": "mug 1"}')
                continue
            record_ = executor.execute(env, name, arguments)
        elif line.startswith("<"):
            turn = parse_turn(line, library.names)
            if turn.kind == "malformed":
                out(f"[malformed: {turn.reason}]")
                state = env.step(line)  # the environment answers as to any invalid command
                steps += state.env_steps
                _show(state, out)
                continue
            if turn.kind == "action":
                state = env.step(turn.action)
                steps += state.env_steps
                _show(state, out)
                continue
            record_ = executor.execute(env, turn.skill, turn.arguments)
        else:
            state = env.step(line)
            steps += state.env_steps
            _show(state, out)
            continue
        steps += record_.env_steps
        state = env.state
        out(
            f"[skill {record_.skill}: precise={record_.precise} error={record_.error} env_steps={record_.env_steps}]"
        )
        out(record_.observation)
        out("  [admissible] " + "; ".join(state.admissible_commands))
    out(f"won={state.won} env_steps={steps}")
    return 0
