"""The turn format, transcript and episode host of BFCL multi-turn (selskill/benchmarks/bfcl/env.py).

The paper's BFCL setting (its Appendix G): non-thinking turns, skill metadata and few-shot
examples in the system prompt, and BFCL's own tool-calling syntax: Python-syntax call lists
with literal arguments, `[func(a=1), func2(b='x')]`, as BFCL's prompting handlers decode them.
What is ours, and why:

- **One decision per turn, in the ALFWorld tags.** A call list is written as an action,
  `<action>[cd(folder='docs'), ls()]</action>`; a skill call as on ALFWorld,
  `<tool_call>{"name": ...}</tool_call>`. So act-vs-invoke is one explicit choice that the
  fork stage can force (`<action>` / `<tool_call>{"name": "<skill>"`) and the branch stage
  can score, and the parser, the forks and the labels are the ALFWorld ones.
- **Ending a user turn.** BFCL moves to the next user turn when a response holds no call.
  Here that is an action with no call: `<action>[]</action>` (what demonstrations write),
  or a plain-text answer inside the tags. It is recorded as the env command `""`, so a
  replayed prefix ends the same turns. A malformed turn ends the user turn too, as BFCL
  treats a response it cannot decode, at no env step: a turn with no valid decision, and an
  action that looks like a call list but does not parse (`[cd(folder='a']`, `f(x=1`): BFCL
  would end the turn on it as well, but it is the model's error, so it counts as malformed
  (`reason: bad_call_list`): the Malformed metric sees it, it is no branch point, and the
  label never chooses a side that holds it.
- **Function docs differ per task**, so the system message is built per episode from the
  docs the env shows at turn 0 (`BfclEnv.functions`: miss_func's withheld functions are
  left out until their turn, when the env's observation reveals them). `doc_style` is
  `compact` (signatures, descriptions, parameter notes), `brief` (no notes) or `json`
  (BFCL's own rendering; 31-48k characters for two classes, too long for small contexts).
  `initial_config` is never shown: BFCL does not show it either.
- **Messages.** A new user request is a `user` message; the results of a call step come
  back as a `tool` message (`call -> output` per call); a skill's return is a `tool`
  message as on ALFWorld. The names of the callable functions can follow each observation
  (`show_admissible_commands`), names only: a call's arguments are open-ended literals, so
  no list of complete commands exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from selskill.agent.hooks import EpisodeHooks
from selskill.agent.listings import prefix_after_skill
from selskill.agent.transcript import after_skill
from selskill.agent.turn_format import (
    ACTION_CLOSE,
    ACTION_OPEN,
    TurnFormat,
    _context_section,
    _skills_section,
    render_action,
    render_skill_call,
)
from selskill.benchmarks.bfcl.config import DOC_STYLES
from selskill.benchmarks.bfcl.decoding import decode
from selskill.benchmarks.bfcl.docs import render_function_docs
from selskill.skills.step_records import EpisodePrefix, call_steps

if TYPE_CHECKING:
    from selskill.data.records import Turn
    from selskill.envs.base import Env, EnvState

# what a demonstration writes to end a user turn (BFCL: a response with no call)
END_TURN = "[]"
# the env command recorded for a turn that ended the user turn (BfclEnv.step("") ends it)
END_TURN_COMMAND = ""
MALFORMED_FEEDBACK = "(That reply was not one decision: the turn ended without a call.)"

BFCL_INTRO = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions. Based on the question, you will need to make one or more function calls to achieve "
    "the purpose. If none of the functions can be used, point it out. If the given question lacks the "
    "parameters required by the function, also point it out."
)
MULTITURN_BEHAVIOR = (
    "At each turn, try your best to complete the user's request within the current turn. Continue to "
    "call functions until you have fulfilled the request to the best of your ability; the results of "
    "each call come back to you. Once you have no more functions to call, reply with no call: the "
    "system then considers the current turn complete and proceeds to the next one."
)
# fixed few-shot examples (App. G): an act, an end of turn, a skill call
EXAMPLE_CALLS = "[cd(folder='reports'), mv(source='draft.txt', destination='archive')]"
EXAMPLE_SKILL = ("place_stock_order", {"symbol": "NVDA", "amount": 10})


def render_calls(calls: list[str] | tuple[str, ...]) -> str:
    """Assistant text for one call step: the calls as one BFCL call list."""
    return render_action("[" + ", ".join(calls) + "]")


def render_end_turn() -> str:
    """Assistant text that ends the user turn (an action with no call)."""
    return render_action(END_TURN)


def _format_section(tool: bool) -> str:
    lines = [
        "Reply with exactly one decision per turn, nothing else:",
        f"{ACTION_OPEN}[func_name1(param1=value1, param2=value2), func_name2(param=value)]{ACTION_CLOSE} - call "
        "one or more of the available functions, in Python syntax, every argument written as name=literal value;",
        f"{render_end_turn()} - no call: the request is done, or cannot be done; this ends your turn",
    ]
    if tool:
        lines[-1] += ";"
        lines.append(
            f'{render_skill_call("skill_name")} - invoke one listed skill (optional "arguments" object).'
        )
    else:
        lines[-1] += "."
    return "\n".join(lines)


def _examples_section(tool: bool) -> str:
    lines = [
        "Examples:",
        "User: Go into the folder 'reports' and move 'draft.txt' into 'archive'.",
        f"Assistant: {render_action(EXAMPLE_CALLS)}",
        'Tool: cd(folder=\'reports\') -> {"current_working_directory": "reports"}',
        "mv(source='draft.txt', destination='archive') -> {\"result\": \"'draft.txt' moved to 'archive/draft.txt'\"}",
        f"Assistant: {render_end_turn()}",
    ]
    if tool:
        lines += [
            "User: Buy 10 shares of NVDA at the current price.",
            f"Assistant: {render_skill_call(*EXAMPLE_SKILL)}",
        ]
    return "\n".join(lines)


@dataclass(frozen=True)
class BfclTurnFormat(TurnFormat):
    """The BFCL turn format (non-thinking). The system text takes the task's function docs."""

    style: str = "compact"
    show_admissible_commands: bool = False  # the names of the functions callable now, after each observation
    intro: str = BFCL_INTRO
    doc_style: str = "compact"  # json | compact | brief (selskill.benchmarks.bfcl.docs.render_function_docs)
    examples: bool = True  # few-shot examples in the system prompt (the paper's App. G)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.style != "compact":
            raise ValueError(f"BFCL turns are non-thinking: style must be 'compact', got {self.style!r}")
        if self.doc_style not in DOC_STYLES:
            raise ValueError(f"doc_style must be one of {DOC_STYLES}, got {self.doc_style!r}")

    def system_text(self, listing: str, docs: str = "") -> str:
        """`listing`: the skill listing ("listed") or skill bodies ("context"); `docs`: the rendered functions."""
        tool = self.skills_section == "listed"
        parts = [self.intro.strip()]
        if tool:
            parts.append(_skills_section(self.style, listing))
        elif self.skills_section == "context":
            parts.append(_context_section(listing))
        if self.instruction.strip():
            parts.append(self.instruction.strip())
        parts += [_format_section(tool), MULTITURN_BEHAVIOR]
        if self.examples:
            parts.append(_examples_section(tool))
        parts.append(f"Here is the list of functions you can call:\n{docs.strip() or '(none)'}")
        return "\n\n".join(parts)

    def system_message(self, listing: str, docs: str = "") -> dict:
        return {"role": "system", "content": self.system_text(listing, docs)}

    def observation_text(self, observation, admissible_commands=None, task=None) -> str:
        parts = [observation.strip()]
        if self.show_admissible_commands and admissible_commands is not None:
            parts.append("Available functions: " + ", ".join(admissible_commands))
        return "\n".join(p for p in parts if p)

    def docs_text(self, functions: list[dict]) -> str:
        return render_function_docs(functions, self.doc_style)


# --- the transcript (one builder for rollouts and demonstrations) ---------------------------


def opening_messages(fmt: BfclTurnFormat, listing: str, functions: list[dict], state: EnvState) -> list[dict]:
    """System message (protocol, skills, examples, this task's functions) and the first request."""
    return [
        fmt.system_message(listing, fmt.docs_text(functions)),
        {"role": "user", "content": fmt.observation_text(state.observation, state.admissible_commands)},
    ]


def ended_turn(state: EnvState) -> bool:
    """Whether the step that produced `state` ended the user turn (no call ran)."""
    return not state.info.get("call_results")


def after_step(fmt: BfclTurnFormat, state: EnvState) -> dict:
    """The reply to an action: the call results (`tool`), or the next user request (`user`)."""
    role = "user" if ended_turn(state) else "tool"
    return {"role": role, "content": fmt.observation_text(state.observation, state.admissible_commands)}


def after_malformed(fmt: BfclTurnFormat, state: EnvState) -> dict:
    """A malformed turn ended the user turn: say so, then the next request."""
    text = fmt.observation_text(state.observation, state.admissible_commands)
    return {"role": "user", "content": f"{MALFORMED_FEEDBACK}\n{text}"}


def action_command(action: str) -> str:
    """The env command of an action: the call list, or "" for one with no call BFCL decodes (it ends the turn)."""
    return action if decode(action).calls else END_TURN_COMMAND


_CALL_START = re.compile(r"^\[|^[A-Za-z_][\w.]*\s*\(")


def broken_call_list(action: str) -> bool:
    """An action that is no call list but starts like one (`[...` or `name(`), or that a bound refused:
    not a clean end of turn."""
    decoded = decode(action)
    if decoded.calls or not decoded.error:
        return False
    return decoded.refused or bool(_CALL_START.match(action.strip("`\n ")))


# --- what retrieval sees (the host and the BFCL demonstrations) -------------------------------


def bfcl_first_prefix(state: EnvState) -> EpisodePrefix:
    """The first request is the task `task` mode retrieves for; later requests are goals."""
    return EpisodePrefix(task=state.task, observation=state.observation, goal=state.task, api=True)


def bfcl_prefix_after_step(prefix: EpisodePrefix, state: EnvState) -> EpisodePrefix:
    """Each call of an action is a step; a turn with none (an end of turn, a malformed or
    broken call list) adds no step but may bring the next request, the new goal."""
    return prefix.extend(*call_steps(state.info), observation=state.observation, goal=state.task)


def bfcl_prefix_after_skill(
    prefix: EpisodePrefix, library, name: str, call, state: EnvState
) -> EpisodePrefix:
    return prefix_after_skill(prefix, library, name, call).extend(goal=state.task)


# --- the episode host --------------------------------------------------------------------


class BfclHooks(EpisodeHooks):
    """The episode hooks of `BfclEnv`: per-task system prompt, turn ends, the checker's verdict."""

    def opening(self, fmt: BfclTurnFormat, env: Env, state: EnvState, listing: str) -> list[dict]:
        return opening_messages(fmt, listing, env.functions, state)

    def first_prefix(self, env: Env, state: EnvState) -> EpisodePrefix:
        return bfcl_first_prefix(state)

    def extend_prefix(
        self, library, prefix: EpisodePrefix, record: Turn, state: EnvState, call
    ) -> EpisodePrefix:
        if record.kind == "skill":
            return bfcl_prefix_after_skill(prefix, library, record.skill, call, state)
        return bfcl_prefix_after_step(prefix, state)

    def act(self, fmt: BfclTurnFormat, env: Env, action: str) -> tuple[EnvState, list[str], dict]:
        command = action_command(action)
        state = env.step(command)
        reply = after_malformed(fmt, state) if broken_call_list(action) else after_step(fmt, state)
        return state, [command], reply

    def classify(self, record: Turn) -> None:
        if record.kind == "action" and broken_call_list(record.action or ""):
            record.kind, record.reason = "malformed", "bad_call_list"

    def malformed(self, fmt: BfclTurnFormat, env: Env) -> tuple[EnvState, list[str], dict]:
        state = env.step(END_TURN_COMMAND)
        return state, [END_TURN_COMMAND], after_malformed(fmt, state)

    def ended(self, state: EnvState) -> tuple[str, str | None] | None:
        if not (state.done and not state.won):
            return None
        # BFCL's checker judged the last turn (or the 20-step limit quit the task): the row's
        # `error` keeps the checker's error_type, e.g. multi_turn:instance_state_mismatch
        error = (state.info.get("verdict") or {}).get("error_type") or None
        return ("step_limit" if error == "multi_turn:force_terminated" else "failed"), error


__all__ = [
    "END_TURN",
    "MALFORMED_FEEDBACK",
    "BfclHooks",
    "BfclTurnFormat",
    "after_malformed",
    "after_skill",
    "after_step",
    "bfcl_first_prefix",
    "bfcl_prefix_after_skill",
    "bfcl_prefix_after_step",
    "opening_messages",
    "render_calls",
    "render_end_turn",
]
