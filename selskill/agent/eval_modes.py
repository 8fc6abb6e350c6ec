"""The paper's engineering baselines (Appendix D) as prompt/library variants of one policy.

Each mode answers "can a prompt or listing change replace selectivity training?" without
touching the model, so each is a pure transformation of what the runner is given: the skill
library the executor accepts, the turn format (system prompt), and the skill text the
system prompt shows. Only evaluation uses them: sampling and forking always play the
`skills` mode, the one the policy is trained in.

- `skills`: the listing of the recipe (descriptions only; bodies on invocation).
- `no_skills`: no skill section and no skill tool; the policy can only act.
- `skills_as_context`: every skill body in the system message, no skill tool.
- `conservative`: the usual listing plus an instruction to prefer direct actions.
- `explicit_skip`: the usual listing plus `self_reasoning`, a memory skill whose listed
  purpose is "no other skill applies". Its calls are skill calls in every metric: they
  cost a turn and go through the tool like any other call.
- `listing_noise` (SelSkill's App. F): the usual listing of a library that the caller has
  padded with distractor skills (`selskill.stages.runner_setup.runner_library`, to
  `eval_listing_size`); here it is the `skills` mode, since only the library differs.
- `capability_check` (SkillDreamer's Capability-aware Skill Invocation, Table 7): the usual
  listing plus the paper's instruction to write SUBGOAL / EVIDENCE / CAPABILITY / DECISION /
  NEXT before acting. A turn here is tags only, so the five lines go in its think block
  (`CSI_PLACEMENT`, ours); `capability_check_stats` measures how often a policy writes them
  and whether its DECISION line agrees with what the turn then does. The paper's periodic
  checkpoint (Table 8) is not injected: its text is missing from our copy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from selskill.agent.parser import parse_turn
from selskill.agent.turn_format import THINK_CLOSE, THINK_OPEN, TurnFormat
from selskill.config.names import EVAL_MODES as MODES
from selskill.skills import Skill, SkillLibrary, render_listing
from selskill.skills.pseudo_skills import CAPABILITY_CHECK_INSTRUCTION, parse_capability_check

SKIP_SKILL = "self_reasoning"
SELF_REASONING = Skill(
    name=SKIP_SKILL,
    description=(
        "Use it when no other skill is applicable: reason about the observation yourself "
        "and then act directly."
    ),
    kind="memory",
    body=(
        "No skill applies here. Read the last observation, decide the next admissible "
        "command yourself and act directly."
    ),
)
CONSERVATIVE_INSTRUCTION = (
    "Prefer direct environment actions. Invoke a skill only when it is clearly necessary: "
    "when its preconditions hold now and acting directly would take more steps. "
    "Unneeded skill calls waste turns and can fail."
)
# ours: where the five lines go in a turn that must hold nothing but its tags
CSI_PLACEMENT = (
    f"Here a response is one turn: write the five lines inside {THINK_OPEN} ... {THINK_CLOSE} at its "
    "start, then the turn's single decision."
)
# which decision each DECISION line announces: a call for MATCH / PARTIAL_MATCH, an action otherwise
_ANNOUNCES_CALL = {"MATCH": True, "PARTIAL_MATCH": True, "NO_MATCH": False, "NO_CAPABILITY_GAP": False}


@dataclass(frozen=True)
class PromptSetup:
    """What the runner plays with: the callable skills, the turn format and the skill text."""

    library: SkillLibrary
    fmt: TurnFormat
    skill_text: str


def skill_bodies(library: SkillLibrary) -> str:
    """Every skill as `### name` + description + body, in library order."""
    return "\n\n".join(f"### {s.name}\n{s.description}\n{s.body.strip()}" for s in library.values())


def prompt_setup(mode: str, library: SkillLibrary, fmt: TurnFormat, listing_style: str) -> PromptSetup:
    if mode not in MODES:
        raise ValueError(f"unknown eval mode {mode!r}; choose one of: {', '.join(MODES)}")
    if mode == "no_skills":
        return PromptSetup(SkillLibrary(), dataclasses.replace(fmt, skills_section="none"), "")
    if mode == "skills_as_context":
        return PromptSetup(
            SkillLibrary(), dataclasses.replace(fmt, skills_section="context"), skill_bodies(library)
        )
    if mode == "explicit_skip":
        if SKIP_SKILL in library:
            raise ValueError(f"the skill library already has a skill named {SKIP_SKILL!r}")
        library = SkillLibrary({**library, SKIP_SKILL: SELF_REASONING})
    if mode == "conservative":
        fmt = dataclasses.replace(fmt, instruction=CONSERVATIVE_INSTRUCTION)
    if mode == "capability_check":
        fmt = dataclasses.replace(fmt, instruction=f"{CAPABILITY_CHECK_INSTRUCTION} {CSI_PLACEMENT}")
    return PromptSetup(library, fmt, render_listing(library, style=listing_style))


def _think(turn: dict) -> str:
    return parse_turn(turn["text"], [turn["skill"]] if turn["skill"] else ()).think or ""


def capability_check_stats(rows: list[dict]) -> dict:
    """How a policy followed the capability check, over the policy's own decisions (forced
    tokens and malformed turns excluded): the share of turns with all five lines in their think
    block, the same among skill calls, and among checked turns the share whose DECISION agrees
    with the turn (a call after MATCH / PARTIAL_MATCH, an action after NO_MATCH /
    NO_CAPABILITY_GAP) and, for calls after a MATCH line, the share that call the skill it named.
    """
    turns = [t for r in rows for t in r["turns"] if not t["forced"] and t["kind"] in ("action", "skill")]
    checks = [(t, parse_capability_check(_think(t))) for t in turns]
    checked = [(t, c) for t, c in checks if c is not None]
    calls = [t for t in turns if t["kind"] == "skill"]
    agree = [(t["kind"] == "skill") == _ANNOUNCES_CALL[c["decision"]] for t, c in checked]
    named = [
        t["skill"] == c["skill"] for t, c in checked if t["kind"] == "skill" and c["decision"] == "MATCH"
    ]

    def share(xs) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {
        "decisions": len(turns),
        "checked_share": share([c is not None for _, c in checks]),
        "calls": len(calls),
        "calls_checked_share": share([c is not None for t, c in checks if t["kind"] == "skill"]),
        "decision_agrees_share": share(agree),
        "match_names_called_skill_share": share(named),
    }
