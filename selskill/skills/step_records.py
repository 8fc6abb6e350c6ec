"""What retrieval may see of an episode at one decision point (`EpisodePrefix`), its steps as each
benchmark records them, and JitSkill's explicit record B_t built from them by deterministic rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from selskill.skills.scorers import count_tokens, excerpt, truncate_tokens

RECORD_STYLES: tuple[str, ...] = ("auto", "trajectory", "api")
# ALFWorld answers this to every command that changed nothing: a failed step for retrieval's
# record, a failed action inside an executable skill, and the answer to a malformed turn
NO_EFFECT_FEEDBACK = "Nothing happens."


@dataclass(frozen=True)
class Step:
    """One past action of the episode and what it returned.

    `kind`: "action" (an env command), "call" (one function call of an API task) or "skill"
    (a skill invocation; `action` is then the skill's name).
    """

    action: str
    observation: str = ""
    failed: bool = False
    kind: str = "action"


@dataclass(frozen=True)
class EpisodePrefix:
    """What retrieval may look at, at one decision point: nothing from later in the episode.

    `task` is the task as first given (all `task` mode sees); `goal` the current goal when it
    changed since (BFCL: the latest user request); `observation` the one the decision is
    taken on; `api` selects the API form of the record (goal, latest calls, latest failures).
    """

    task: str
    steps: tuple[Step, ...] = ()
    observation: str = ""
    goal: str | None = None
    api: bool = False

    @property
    def current_goal(self) -> str:
        return self.goal if self.goal is not None else self.task

    def extend(self, *steps: Step, observation: str | None = None, goal: str | None = None) -> EpisodePrefix:
        """The prefix one decision later (a new value, this one is unchanged)."""
        return EpisodePrefix(
            task=self.task,
            steps=self.steps + tuple(steps),
            observation=self.observation if observation is None else observation,
            goal=self.goal if goal is None else goal,
            api=self.api,
        )


def text_step(command: str, observation: str) -> Step:
    """A text command; an engine that changed nothing says NO_EFFECT_FEEDBACK (as ALFWorld's does)."""
    return Step(command, observation, failed=observation.strip() == NO_EFFECT_FEEDBACK)


def skill_step(name: str, observation: str, precise: bool) -> Step:
    """A skill invocation (`SkillCallRecord.precise` False: it failed)."""
    return Step(name, observation, failed=not precise, kind="skill")


def call_steps(info: dict) -> tuple[Step, ...]:
    """The calls of one function-call step, from `EnvState.info["call_results"]` (as BFCL's env reports them)."""
    return tuple(
        Step(r["call"], str(r["output"]), failed=bool(r["error"]), kind="call")
        for r in info.get("call_results", [])
    )


def _entry(step: Step, chars: int) -> str:
    what = f"skill {step.action}" if step.kind == "skill" else step.action
    return f"- {what} -> {excerpt(step.observation, chars)}" if chars > 0 else f"- {what}"


@dataclass(frozen=True)
class RecordConfig:
    """How B_t is built (JitSkill App. E.2's deterministic rules)."""

    style: str = "auto"  # auto: "api" when the prefix says so, else "trajectory"
    # the record's token budget: all-MiniLM-L6-v2 (JitSkill's record embedder) reads 256
    # word pieces, so a longer record would be cut by the encoder anyway
    budget: int = 256
    excerpt_chars: int = 80  # observation excerpt per completed action / call
    api_recent_calls: int = 6
    api_recent_failed: int = 6

    def __post_init__(self):
        if self.style not in RECORD_STYLES:
            raise ValueError(f"unknown record style {self.style!r} (allowed: {', '.join(RECORD_STYLES)})")
        for name in ("budget", "excerpt_chars", "api_recent_calls", "api_recent_failed"):
            if getattr(self, name) < 0:
                raise ValueError(f"RecordConfig.{name} must be >= 0")


def build_record(
    prefix: EpisodePrefix,
    config: RecordConfig | None = None,
    token_counter: Callable[[str], int] = count_tokens,
) -> str:
    """JitSkill's explicit record B_t of `prefix`, within `config.budget` tokens.

    trajectory: "Goal:", then "Completed:" (each action with an observation excerpt) and
    "Failed:" (each failed action and what it said), in episode order. api: the goal, the
    latest calls (with excerpts) and the latest failed calls. Over budget, the oldest
    completed entries go first, then the oldest failed ones, then the goal is cut.
    """
    cfg = config or RecordConfig()
    style = cfg.style if cfg.style != "auto" else ("api" if prefix.api else "trajectory")
    steps = prefix.steps
    if style == "api":
        recent = list(steps[-cfg.api_recent_calls :]) if cfg.api_recent_calls else []
        failed_steps = [s for s in steps if s.failed]
        failed_steps = failed_steps[-cfg.api_recent_failed :] if cfg.api_recent_failed else []
        done = [_entry(s, cfg.excerpt_chars) for s in recent]
        failed = [_entry(s, cfg.excerpt_chars) for s in failed_steps]
        titles = ("Recent calls:", "Failed calls:")
    else:
        done = [_entry(s, cfg.excerpt_chars) for s in steps if not s.failed]
        failed = [_entry(s, cfg.excerpt_chars) for s in steps if s.failed]
        titles = ("Completed:", "Failed:")
    goal = "Goal: " + " ".join(prefix.current_goal.split())

    def render(goal_text: str, d: list[str], f: list[str]) -> str:
        lines = [goal_text]
        if d:
            lines += [titles[0], *d]
        if f:
            lines += [titles[1], *f]
        return "\n".join(lines)

    text = render(goal, done, failed)
    while token_counter(text) > cfg.budget and (done or failed):
        if done:
            done = done[1:]
        else:
            failed = failed[1:]
        text = render(goal, done, failed)
    if token_counter(text) > cfg.budget:
        text = truncate_tokens(text, cfg.budget)
    return text


def step_text(prefix: EpisodePrefix, chars: int = 1200) -> str:
    """The current step's local context: the latest action and the end of the current observation."""
    last = prefix.steps[-1].action if prefix.steps else ""
    obs = prefix.observation[-chars:] if chars > 0 else ""
    return f"{last}\n{obs}".strip()
