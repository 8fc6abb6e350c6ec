"""Reads one assistant turn back into a decision.

The parser is strict on structure (exactly one decision, nothing outside the tags)
because a malformed turn is a training signal: the label stage never keeps a chosen side
with one, and Exec. Prec. counts calls that are not well-formed. It is lenient on what
does not change the decision: whitespace around tags, a missing `<think>` opening (some
chat templates put it in the generation prompt), trailing end-of-turn tokens. It never
raises, since rollouts must survive whatever a policy writes.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from typing import Literal

from selskill.agent.turn_format import (
    ACTION_CLOSE,
    ACTION_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
)

Kind = Literal["action", "skill", "malformed"]

# Special tokens a decoder may leave in the text when they are not skipped on decode.
END_OF_TURN_TOKENS: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "</s>")


@dataclass(frozen=True)
class ParsedTurn:
    """One assistant turn's decision.

    For an `unknown_skill` turn `skill` and `arguments` keep what was written, so that
    reports can show which names the policy invents; consumers must branch on `kind`.
    `decision_start` is the character offset of the decision's opening tag in the text
    given to `parse_turn`: branch scoring starts at the decision, not at the think block.
    """

    kind: Kind
    action: str | None = None
    skill: str | None = None
    arguments: dict = field(default_factory=dict)
    think: str | None = None
    reason: str | None = None
    decision_start: int | None = None

    @property
    def ok(self) -> bool:
        return self.kind != "malformed"

    @property
    def decision(self) -> str | None:
        """`invoke` / `skip` in the vocabulary of forks; None when malformed."""
        return {"skill": "invoke", "action": "skip"}.get(self.kind)

    def to_dict(self) -> dict:
        return asdict(self)


def _malformed(reason: str, **fields) -> ParsedTurn:
    return ParsedTurn(kind="malformed", reason=reason, **fields)


def _content_end(text: str) -> int:
    end = len(text)
    while True:
        stripped = text[:end].rstrip()
        for token in END_OF_TURN_TOKENS:
            if stripped.endswith(token):
                end = len(stripped) - len(token)
                break
        else:
            return len(stripped)


def parse_turn(text: str, skill_names: Collection[str], listed: Collection[str] | None = None) -> ParsedTurn:
    """Parse one assistant turn; malformed turns come back with a `reason`, never an error.

    `listed` (None: all of `skill_names`) are the skills this turn's prompt showed. A call to a
    library skill that was not shown is `unlisted_skill:<name>`, apart from `unknown_skill`, so
    that reports tell a policy that recalls hidden skills from one that invents names; neither
    is executed, or the listing would not bound what the policy can do.
    """
    if not isinstance(text, str):
        return _malformed("not_text")
    end = _content_end(text)
    body = text[:end]
    lead = len(body) - len(body.lstrip())

    # Think block: `<think>…</think>` at the start, or only `…</think>` when the template
    # already opened it; a `</think>` after the first decision tag is left as stray text.
    think: str | None = None
    pos = lead
    first_open = min((i for i in (body.find(ACTION_OPEN), body.find(TOOL_CALL_OPEN)) if i >= 0), default=end)
    if body.startswith(THINK_OPEN, lead):
        close = body.find(THINK_CLOSE, lead + len(THINK_OPEN))
        if close < 0:
            return _malformed("unclosed_tag", think=body[lead + len(THINK_OPEN) :].strip())
        think = body[lead + len(THINK_OPEN) : close].strip()
        pos = close + len(THINK_CLOSE)
    else:
        close = body.find(THINK_CLOSE)
        if 0 <= close < first_open and THINK_OPEN not in body[:close]:
            think = body[lead:close].strip()
            pos = close + len(THINK_CLOSE)

    rest = body[pos:]
    n_action = rest.count(ACTION_OPEN)
    n_call = rest.count(TOOL_CALL_OPEN)
    if n_action + n_call == 0:
        return _malformed("missing_tags", think=think)
    if n_action + n_call > 1:
        return _malformed("multiple_decisions", think=think)

    is_action = n_action == 1
    open_tag, close_tag = (ACTION_OPEN, ACTION_CLOSE) if is_action else (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
    start = pos + rest.find(open_tag)
    inner_start = start + len(open_tag)
    inner_end = body.find(close_tag, inner_start)
    if inner_end < 0:
        return _malformed("unclosed_tag", think=think, decision_start=start)
    outside = body[pos:start] + body[inner_end + len(close_tag) :]
    if outside.strip():
        return _malformed("text_outside_tags", think=think, decision_start=start)
    inner = body[inner_start:inner_end].strip()

    if is_action:
        if not inner:
            return _malformed("empty_action", think=think, decision_start=start)
        return ParsedTurn(kind="action", action=inner, think=think, decision_start=start)

    try:
        call = json.loads(inner)
    except (ValueError, RecursionError):
        return _malformed("bad_json", think=think, decision_start=start)
    if not isinstance(call, dict):
        return _malformed("bad_json", think=think, decision_start=start)
    name = call.get("name")
    if not isinstance(name, str) or not name.strip():
        return _malformed("missing_name", think=think, decision_start=start)
    name = name.strip()
    arguments = call.get("arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return _malformed("bad_arguments", skill=name, think=think, decision_start=start)
    if name not in skill_names:
        return _malformed(
            f"unknown_skill:{name}", skill=name, arguments=arguments, think=think, decision_start=start
        )
    if listed is not None and name not in listed:
        return _malformed(
            f"unlisted_skill:{name}", skill=name, arguments=arguments, think=think, decision_start=start
        )
    return ParsedTurn(kind="skill", skill=name, arguments=arguments, think=think, decision_start=start)
