"""Demonstrations for an offline BFCL init policy: BFCL's ground truth with skill calls mixed in.

The ALFWorld init (selskill/sft/demos.py) has an exploring expert; on BFCL the expert is
the ground truth itself: each train task is played through `BfclEnv` call by call, one call
per step, with `[]` ending each user turn, and kept only if BFCL's checker judges it won. As
on ALFWorld, skill calls are mixed in so that the init policy behaves like the paper's
RL-Init (it invokes too often and at the wrong time), each executed for real through
`SkillExecutor`, so every returned text and state change is true:

| call | when | default |
|---|---|---|
| opening memory (`multi_turn_strategy`, or the tool reference of an involved class) | first turn | 0.5 |
| useful executable skill replacing the ground-truth calls it reproduces | where its steps match a run of ground-truth calls | 0.8 |
| tool reference of the class about to be used (redundant after the first) | a turn with calls, before them | 0.15 |
| wrong executable skill: one whose functions this task lacks (fails `precondition_failed`) | per user turn | 0.15 |
| `missing_function_strategy` | miss_func: the turn whose request needs a function not shown yet | 0.8 |

A skill *matches* a run of ground-truth calls when its call steps name the same functions in
the same order, every literal of a template equals the call's, every placeholder that is a
skill parameter takes one consistent, well-typed value, no call has an argument the template
lacks, and every required parameter gets a value (placeholders bound from an earlier result
take whatever the result gives: the checker then decides). If a substituted skill fails, or
the task is then lost, the task is played again without substitutions.

Messages come from `selskill.benchmarks.bfcl.episode`'s transcript builders, the ones the episode host
uses, so the policy is trained on exactly what it is sampled with. Deterministic per
(seed, task).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence

from selskill.agent.turn_format import render_skill_call
from selskill.benchmarks.bfcl import load_bfcl_skills
from selskill.benchmarks.bfcl.env import BfclEnv, BfclTask, function_docs, keyword_ground_truth
from selskill.benchmarks.bfcl.episode import (
    BfclTurnFormat,
    after_skill,
    after_step,
    bfcl_first_prefix,
    bfcl_prefix_after_skill,
    bfcl_prefix_after_step,
    opening_messages,
    render_calls,
    render_end_turn,
)
from selskill.benchmarks.bfcl.init_config import BfclDemoMix
from selskill.sft.demos import Demo, DemoPrompts, DemoReport, DemoSetup
from selskill.skills import CallStep, Skill, SkillLibrary
from selskill.skills.call_templates import Call, parse_one_call
from selskill.skills.executor import template_fields, value_has_type

DEMO_FORMAT = BfclTurnFormat(doc_style="brief")
DEMO_LISTING_STYLE = "compact"
REFERENCE_SKILL = {
    "GorillaFileSystem": "file_system_reference",
    "MathAPI": "math_reference",
    "MessageAPI": "message_reference",
    "TicketAPI": "ticket_reference",
    "TradingBot": "trading_reference",
    "TravelAPI": "travel_reference",
    "TwitterAPI": "twitter_reference",
    "VehicleControlAPI": "vehicle_reference",
}
STRATEGY_SKILL = "multi_turn_strategy"
MISSING_SKILL = "missing_function_strategy"
BFCL_PROMPTS = DemoPrompts(DEMO_FORMAT, DEMO_LISTING_STYLE)


# --- matching executable skills to ground-truth calls ------------------------------------------

_SLOT_BASE = 7_000_000_000


def template_shape(template: str) -> tuple[str, dict[str, tuple[str, object]]]:
    """(function, {argument: ("slot", placeholder) | ("value", literal)}) of one call template."""
    fields = list(dict.fromkeys(template_fields(template)))
    sentinels = {f: _SLOT_BASE + i for i, f in enumerate(fields)}
    call = parse_one_call(template.format(**{f: repr(v) for f, v in sentinels.items()}))
    slots = {v: f for f, v in sentinels.items()}
    shape = {}
    for arg, value in call.kwargs.items():
        is_slot = type(value) is int and value in slots
        shape[arg] = ("slot", slots[value]) if is_slot else ("value", value)
    return call.name, shape


def match_skill(skill: Skill, calls: Sequence[Call]) -> dict | None:
    """The arguments with which `skill` makes exactly `calls` (None: it does not match them)."""
    steps = skill.steps
    if not steps or len(calls) != len(steps) or not all(isinstance(s, CallStep) for s in steps):
        return None
    params = {p.name: p for p in skill.parameters}
    values: dict[str, object] = {}
    for step, call in zip(steps, calls, strict=True):
        name, shape = template_shape(step.call)
        if call.name != name or set(call.kwargs) - set(shape):
            return None
        for arg, (kind, x) in shape.items():
            if kind == "value":
                if arg not in call.kwargs or call.kwargs[arg] != x:
                    return None
                continue
            param = params.get(x)
            if param is None:
                continue  # bound from an earlier step's result: the played demo decides
            given = call.kwargs.get(arg, param.default)
            if given is None or not value_has_type(param.type, given):
                return None
            if x in values and values[x] != given:
                return None
            values[x] = given
    if any(p.name not in values for p in skill.parameters if p.default is None):
        return None
    return {k: v for k, v in values.items() if v != params[k].default}


def plan_turn(
    calls: Sequence[str], library: SkillLibrary, rng: random.Random, useful: float
) -> list[tuple[str, object]]:
    """The turn's ground truth as ("call", text) and ("skill", (name, arguments, the calls it makes)) items."""
    parsed = [parse_one_call(c) for c in calls]
    executable = [s for s in library.values() if s.is_executable]
    out: list[tuple[str, object]] = []
    i = 0
    while i < len(parsed):
        match = None
        for skill in executable:
            n = len(skill.steps)
            args = match_skill(skill, parsed[i : i + n]) if i + n <= len(parsed) else None
            if args is not None:
                match = (skill.name, args, n)
                break
        if match is not None and rng.random() < useful:
            out.append(("skill", (*match[:2], [c.render() for c in parsed[i : i + match[2]]])))
            i += match[2]
        else:
            out.append(("call", parsed[i].render()))
            i += 1
    return out


# --- one demonstration --------------------------------------------------------------------------


class _Episode:
    """Drives the env and the executor for one demonstration, writing the transcript (and each
    decision's listing, `selskill.agent.listings`) as the host does."""

    def __init__(self, setup: DemoSetup, task_id: str):
        self.env, self.executor, self.fmt = setup.env, setup.executor, setup.fmt
        self.listings = setup.listings
        self.state = self.env.reset(task_id)
        self.prefix = bfcl_first_prefix(self.state)
        self.listed = self.listings.listed(self.prefix)
        self.messages = opening_messages(
            self.fmt, self.listings.system_listing(self.listed, setup.listing), self.env.functions, self.state
        )
        self.messages[-1] = self.listings.step_message(self.messages[-1], self.listed)
        self.calls: list[dict] = []
        self.env_steps = 0

    def _reply(self, message: dict) -> None:
        if not self.state.done:  # the runner's transcript ends at the last assistant turn
            self.listed, message = self.listings.after_turn(self.prefix, message, self.listed)
            self.messages.append(message)

    def act(self, command: str) -> None:
        self.messages.append({"role": "assistant", "content": render_calls([command])})
        self.state = self.env.step(command)
        self.env_steps += self.state.env_steps
        self.prefix = bfcl_prefix_after_step(self.prefix, self.state)
        self._reply(after_step(self.fmt, self.state))

    def end_turn(self) -> None:
        self.messages.append({"role": "assistant", "content": render_end_turn()})
        self.state = self.env.step("")
        self.prefix = bfcl_prefix_after_step(self.prefix, self.state)
        self._reply(after_step(self.fmt, self.state))

    def call(self, name: str, arguments: dict | None, role: str) -> bool | None:
        """Whether the call was precise; None (and no call) where the decision does not list `name`."""
        if name not in self.listed:
            return None
        self.messages.append({"role": "assistant", "content": render_skill_call(name, arguments or None)})
        rec = self.executor.execute(self.env, name, arguments or None)
        self.state = self.env.state
        self.env_steps += rec.env_steps
        self.prefix = bfcl_prefix_after_skill(self.prefix, self.executor.library, name, rec, self.state)
        self._reply(after_skill(self.fmt, rec.observation, self.state))
        turn = sum(1 for m in self.messages if m["role"] == "assistant") - 1
        self.calls.append({"role": role, "skill": name, "precise": rec.precise, "error": rec.error,
                           "env_steps": rec.env_steps, "turn": turn})  # fmt: skip
        return rec.precise


def _wrong_executable(library: SkillLibrary, available: Iterable[str]) -> list[str]:
    """Executable skills whose `available:` preconditions fail here (calling one changes nothing)."""
    have = set(available)
    return [s.name for s in library.values()
            if s.is_executable and any(p.split(":", 1)[1] not in have for p in s.preconditions)]  # fmt: skip


def play_task(
    setup: DemoSetup, task: BfclTask, task_id: str, mix: BfclDemoMix, seed: int, substitute: bool = True
) -> tuple[Demo | None, str | None]:
    """One demonstration of `task` (Demo, None), or (None, why it was dropped). A skill the mix
    draws where the decision does not list it is not called; a useful one's calls are made instead."""
    library = setup.executor.library
    rng = random.Random(f"selskill-bfcl-demo:{seed}:{task.id}")
    owner = {d["name"]: c for c in task.involved_classes for d in function_docs([c])}
    ep = _Episode(setup, task_id)
    references = [REFERENCE_SKILL[c] for c in task.involved_classes if REFERENCE_SKILL.get(c) in library]
    if rng.random() < mix.opening_memory:
        ep.call(rng.choice([STRATEGY_SKILL, *references]), None, "opening")
    for turn, calls in enumerate(keyword_ground_truth(task)):
        r_wrong, r_ref, r_missing = rng.random(), rng.random(), rng.random()
        plan = plan_turn(calls, library, rng, mix.useful if substitute else 0.0)
        if r_wrong < mix.wrong_executable:
            wrong = _wrong_executable(library, ep.state.admissible_commands)
            if wrong:
                ep.call(rng.choice(wrong), None, "wrong_exec")
        if calls and r_ref < mix.reference_memory:
            first = parse_one_call(calls[0]).name
            if REFERENCE_SKILL.get(owner.get(first, "")) in library:
                ep.call(REFERENCE_SKILL[owner[first]], None, "reference")
        if not calls and (turn + 1) in task.withheld and r_missing < mix.missing_function:
            ep.call(MISSING_SKILL, None, "missing_function")
        for kind, item in plan:
            if kind == "call":
                ep.act(item)
                continue
            name, arguments, calls_made = item
            if name not in ep.listed:
                for command in calls_made:
                    ep.act(command)
            elif not ep.call(name, arguments, "useful"):
                return None, "skill_failed"
        ep.end_turn()
    if not ep.state.won:
        return None, "lost"
    return (
        Demo(
            task_id=task_id,
            task_type=task.category,
            messages=ep.messages,
            n_skill_calls=len(ep.calls),
            n_precise=sum(1 for c in ep.calls if c["precise"]),
            env_steps=ep.env_steps,
            calls=ep.calls,
        ),
        None,
    )


def build_bfcl_demos(
    env: BfclEnv,
    *,
    prompts: DemoPrompts = BFCL_PROMPTS,
    mix: BfclDemoMix | None = None,
    seed: int = 0,
    task_ids: Sequence[str] | None = None,
) -> DemoReport:
    """One demonstration per task of `env` (or of `task_ids`); a task lost with skills mixed in is played
    again without substitutions, and dropped only if that loses too. The prompts' library and
    retriever are the rounds': each decision lists what their episodes will list."""
    mix = mix or BfclDemoMix()
    setup = DemoSetup.of(env, prompts, load_bfcl_skills())
    report = DemoReport(demos=[])
    for task_id in task_ids if task_ids is not None else env.task_ids():
        report.attempted += 1
        task = env.task(task_id)
        demo, reason = play_task(setup, task, task_id, mix, seed)
        if demo is None:
            report.dropped[f"substituted_{reason}"] += 1
            demo, reason = play_task(setup, task, task_id, mix, seed, substitute=False)
        if demo is None:
            report.dropped[reason] += 1
        else:
            report.demos.append(demo)
    return report


def bfcl_tokenizer_corpus(demos: Iterable[Demo], library: SkillLibrary | None = None) -> Iterator[str]:
    """Texts to train the tokenizer on: skill texts and every demo message (system prompts included:
    they hold each task's function docs)."""
    library = library or load_bfcl_skills()
    for skill in library.values():
        yield skill.description
        yield skill.body
        yield render_skill_call(skill.name)
    seen: set[str] = set()
    for demo in demos:
        for message in demo.messages:
            if message["content"] not in seen:
                seen.add(message["content"])
                yield message["content"]
