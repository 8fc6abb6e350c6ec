"""SkillDreamer's prompts (App. C.3) as pure functions: pseudo-skills and the capability check.

Prospective Skill Generation (PSG) asks the model for the task's capability requirements
U (at most 5) and its semantic anchors A (Table 5), then for one skill-like pseudo-skill per
capability (Table 6). `task` retrieval (`selskill.skills.retrieval`) scores skills against
the task and each pseudo-skill. Capability-aware Skill Invocation (CSI, Table 7) makes the
agent write SUBGOAL / EVIDENCE / CAPABILITY / DECISION / NEXT before acting, and a runtime
checkpoint (Table 8) asks for that check again every few steps.

What our copy of the paper has: the text of Table 7 (kept verbatim in
`CAPABILITY_CHECK_INSTRUCTION`) and one-sentence descriptions of Tables 5, 6 and 8, whose
prompt texts are missing. `CAPABILITY_PROMPT`, `PSEUDO_SKILL_PROMPT` and `CHECKPOINT_PROMPT`
are therefore written from those descriptions and marked as ours. Outputs are asked for in
a line format (``CAPABILITY: ...``, ``ANCHORS: ...``) rather than JSON, which small policies
break; the parsers also accept JSON and numbered lists.

Nothing here calls a model: `generate_pseudo_skills` takes any text generator
(`prompt -> completion`), so the policy (either backend) plugs in where a round needs it.
Pseudo-skills must be generated once per episode and recorded with it, so that a fork or
replay passes the same ones to retrieval (`SkillRetriever.listing` is then pure).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MAX_CAPABILITIES = 5  # "PSG infers at most five capability requirements for each task" (§3.1)

# Ours, from the description of Table 5 (the capability-inference prompt P_PSG^inf).
CAPABILITY_PROMPT = """\
Prospective skill identification, step 1: capability inference.
Task:
{task}

Before anyone acts, infer the capabilities this task requires. A capability is an
independent piece of know-how that needs specialised skill guidance (how to do something
in this environment), not the task's objective restated and not a trivial operation the
agent can do by itself. List at most {max_capabilities}, most important first.
Also list the task's semantic anchors: the concrete entities, values and constraints named
in the task that any guidance must respect.

Answer with one line per capability and one line of anchors, nothing else:
CAPABILITY: <a short phrase naming the capability>
ANCHORS: <anchor>; <anchor>; ..."""

# Ours, from the description of Table 6 (the prospective-generation prompt P_PSG^gen).
PSEUDO_SKILL_PROMPT = """\
Prospective skill identification, step 2: imagine the skill.
Task:
{task}
Capability required: {capability}
Semantic anchors: {anchors}

Write the skill document that would provide this capability, as a skill library would
store it: a name, one sentence saying when to use it, and 3 to 6 concrete procedural
steps. Keep the task's anchors where they matter. Answer with the document only:
NAME: <snake_case_name>
WHEN TO USE: <one sentence>
STEPS:
1. ..."""

# Verbatim: Table 7 of the paper, the capability-aware invocation instruction P_CSI.
CAPABILITY_CHECK_INSTRUCTION = (
    "Capability-aware Skill Invocation. Complete the task with the available tools and the fixed set of "
    "candidate skills exposed by the runtime. Do not search for, install, or create additional skills. "
    "Inputs. Use the sub-task sequence formed so far, the metadata of all retrieved candidate skills, and "
    "the runtime context supplied at the current checkpoint. Goal. Before the next action, reassess the "
    "current objective, infer the capability required to accomplish it, and determine whether an "
    "appropriate candidate skill should be invoked. If no candidate skill provides the required "
    "capability, proceed without additional skill guidance. When to Check. Run a check whenever the "
    "runtime issues a RUNTIME CAPABILITY CHECKPOINT. Also check when the required capability may have "
    "changed, the next step is unclear, an approach fails, attempts repeat, or new evidence makes the "
    "current skill match uncertain. Check and Match. Before any tool call, begin the response with "
    "exactly five concise lines: SUBGOAL: the immediate subgoal EVIDENCE: relevant evidence and "
    "unresolved constraints CAPABILITY: the capability needed to resolve the most important unresolved "
    "issue DECISION: MATCH, PARTIAL_MATCH, NO_MATCH, or NO_CAPABILITY_GAP; include the selected skill "
    "when applicable NEXT: one bounded action and its observable success check Infer CAPABILITY from "
    "the unresolved objective, requirement, failure, or constraint, not from the tool action or method "
    "already planned. Compare it with all visible candidate-skill metadata before choosing "
    "NO_CAPABILITY_GAP. Use MATCH when a skill covers the required capability, PARTIAL_MATCH when it "
    "covers a necessary part, and NO_MATCH when none does. Prefer the most specific skill that "
    "addresses the unresolved issue. Do not select a skill merely because it is the closest candidate. "
    "Use NO_CAPABILITY_GAP only when the available evidence supports the current method, it satisfies "
    "the known constraints, and no unresolved failure or issue could invalidate NEXT. Act and Verify. "
    "For MATCH or PARTIAL_MATCH, load the selected skill before any other tool action. Follow its "
    "applicable procedure and use its available implementation unless observed evidence shows that it "
    "is unsuitable. Load a different skill only when new evidence changes the match. For "
    "NO_CAPABILITY_GAP, perform NEXT. For NO_MATCH, decompose the subgoal or make one small, materially "
    "different attempt with the permitted tools; continue independent work and report any remaining "
    "blocker. Execute NEXT and verify its stated success check. If it fails or conflicts with known "
    "evidence, run another check before continuing. Do not repeat a failed approach without new "
    "evidence or a different method. Before completion, inspect the persisted result itself and "
    "validate its structure, content, and required outputs against the task's observable requirements."
)

# Ours, from the description of Table 8 (the periodic checkpoint X_n, "injected after every
# fixed number of execution steps ... while accounting for the remaining execution budget").
CHECKPOINT_PROMPT = (
    "RUNTIME CAPABILITY CHECKPOINT (step {step} of at most {max_steps}; {left} left). Reassess the "
    "current objective and run the capability check before your next action."
)

CHECK_FIELDS: tuple[str, ...] = ("SUBGOAL", "EVIDENCE", "CAPABILITY", "DECISION", "NEXT")
DECISIONS: tuple[str, ...] = ("MATCH", "PARTIAL_MATCH", "NO_MATCH", "NO_CAPABILITY_GAP")

_THINK_RE = re.compile(r"<think>.*?</think>", re.S)
_FENCE_RE = re.compile(r"^```[a-zA-Z]*\s*$", re.M)
_LIST_RE = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")
_CAP_RE = re.compile(r"^\s*(?:[-*]\s*)?(?:\d+[.)]\s*)?capability(?:\s*\d+)?\s*[:=-]\s*(.+)$", re.I)
_ANCHOR_RE = re.compile(r"^\s*(?:[-*]\s*)?(?:semantic\s+)?anchors?\s*[:=-]\s*(.*)$", re.I)


def _clean(text: str) -> str:
    text = _THINK_RE.sub("", text)
    if "</think>" in text:  # a template that opened the think block itself
        text = text.split("</think>", 1)[1]
    return _FENCE_RE.sub("", text).strip()


def capability_prompt(task: str, max_capabilities: int = MAX_CAPABILITIES) -> str:
    """P_PSG^inf for `task` (ours: the paper's Table 5 text is not in our copy)."""
    return CAPABILITY_PROMPT.format(task=task.strip(), max_capabilities=max_capabilities)


def pseudo_skill_prompt(task: str, capability: str, anchors: tuple[str, ...] | list[str] = ()) -> str:
    """P_PSG^gen for one capability (ours: the paper's Table 6 text is not in our copy)."""
    return PSEUDO_SKILL_PROMPT.format(
        task=task.strip(), capability=capability.strip(), anchors="; ".join(anchors) or "(none)"
    )


@dataclass(frozen=True)
class Capabilities:
    capabilities: tuple[str, ...]
    anchors: tuple[str, ...]


def _from_json(text: str) -> Capabilities | None:
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        return None
    caps, anchors = [], []
    if isinstance(value, dict):
        for key, v in value.items():
            k = key.lower()
            if "capab" in k or "requirement" in k:
                caps = v if isinstance(v, list) else [v]
            elif "anchor" in k:
                anchors = v if isinstance(v, list) else [v]
    elif isinstance(value, list):
        caps = value
    out = []
    for c in caps:
        if isinstance(c, dict):
            c = c.get("capability") or c.get("name") or c.get("description") or ""
        if isinstance(c, str) and c.strip():
            out.append(c)
    return Capabilities(tuple(out), tuple(str(a) for a in anchors if str(a).strip()))


def parse_capabilities(text: str, max_capabilities: int = MAX_CAPABILITIES) -> Capabilities:
    """Capabilities and anchors from the model's answer to `capability_prompt`.

    Reads ``CAPABILITY: ...`` / ``ANCHORS: a; b`` lines, else a JSON object or list, else
    the lines of a bulleted or numbered list. Duplicates (case-insensitive) are dropped,
    at most `max_capabilities` are kept; an answer with nothing usable gives none.
    """
    body = _clean(text)
    caps: list[str] = []
    anchors: list[str] = []
    for line in body.splitlines():
        if m := _CAP_RE.match(line):
            caps.append(m.group(1))
        elif m := _ANCHOR_RE.match(line):
            anchors.extend(a for a in re.split(r"[;,]", m.group(1)))
    if not caps:
        parsed = _from_json(body)
        if parsed is not None and parsed.capabilities:
            caps, anchors = list(parsed.capabilities), list(parsed.anchors)
        else:
            caps = [_LIST_RE.sub("", ln) for ln in body.splitlines() if _LIST_RE.match(ln)]
    seen: set[str] = set()
    unique: list[str] = []
    for c in caps:
        c = " ".join(c.split()).strip(" .")
        if c and c.lower() not in seen:
            seen.add(c.lower())
            unique.append(c)
    clean_anchors = tuple(dict.fromkeys(" ".join(a.split()).strip(" .") for a in anchors if a.strip()))
    return Capabilities(tuple(unique[:max_capabilities]), clean_anchors)


def parse_pseudo_skill(text: str, max_chars: int = 2000) -> str:
    """The pseudo-skill document from the model's answer (think blocks and fences removed)."""
    return _clean(text)[:max_chars].strip()


@dataclass(frozen=True)
class PseudoSkills:
    """One episode's PSG output: what `task` retrieval scores against (record it with the episode)."""

    task: str
    capabilities: tuple[str, ...]
    anchors: tuple[str, ...]
    skills: tuple[str, ...]  # one per capability, in the same order

    def to_dict(self) -> dict:
        return {
            "task": self.task,
            "capabilities": list(self.capabilities),
            "anchors": list(self.anchors),
            "skills": list(self.skills),
        }


def generate_pseudo_skills(
    task: str, generate: Callable[[str], str], max_capabilities: int = MAX_CAPABILITIES
) -> PseudoSkills:
    """PSG with any text generator: one capability-inference call, then one call per capability.

    A capability whose pseudo-skill comes back empty is dropped with it. Deterministic when
    `generate` is (greedy decoding, or a seeded sampler).
    """
    return generate_pseudo_skills_batch([task], lambda ps: [generate(p) for p in ps], max_capabilities)[0]


def generate_pseudo_skills_batch(
    tasks: Sequence[str],
    generate: Callable[[Sequence[str]], list[str]],
    max_capabilities: int = MAX_CAPABILITIES,
) -> list[PseudoSkills]:
    """PSG for many tasks with a batched generator (prompts -> answers, in order): one batch of
    capability inferences, then one batch of every task's pseudo-skill prompts."""
    caps = [
        parse_capabilities(answer, max_capabilities)
        for answer in generate([capability_prompt(t, max_capabilities) for t in tasks])
    ] if tasks else []  # fmt: skip
    jobs = [(i, cap) for i, c in enumerate(caps) for cap in c.capabilities]
    answers = (
        generate([pseudo_skill_prompt(tasks[i], cap, caps[i].anchors) for i, cap in jobs]) if jobs else []
    )
    kept: list[tuple[list[str], list[str]]] = [([], []) for _ in tasks]
    for (i, cap), answer in zip(jobs, answers, strict=True):
        doc = parse_pseudo_skill(answer)
        if doc:
            kept[i][0].append(cap)
            kept[i][1].append(doc)
    return [
        PseudoSkills(t, tuple(k[0]), caps[i].anchors, tuple(k[1]))
        for i, (t, k) in enumerate(zip(tasks, kept, strict=True))
    ]


def checkpoint_message(step: int, max_steps: int) -> str:
    """X_n, the periodic capability checkpoint (ours: Table 8's text is not in our copy)."""
    return CHECKPOINT_PROMPT.format(step=step, max_steps=max_steps, left=max(0, max_steps - step))


def parse_capability_check(text: str) -> dict | None:
    """The five CSI lines of a response (keys lower-cased), or None unless all five are there.

    `decision` is normalised to one of DECISIONS, and `skill` holds the skill it names
    (the rest of the DECISION line), "" if none.
    """
    body = _clean(text)
    found: dict[str, str] = {}
    pattern = re.compile(r"^\s*(" + "|".join(CHECK_FIELDS) + r")\s*:\s*(.*)$", re.I)
    for line in body.splitlines():
        m = pattern.match(line)
        if m and m.group(1).upper() not in found:
            found[m.group(1).upper()] = m.group(2).strip()
    if any(f not in found for f in CHECK_FIELDS):
        return None
    raw = found["DECISION"]
    decision = next((d for d in sorted(DECISIONS, key=len, reverse=True) if raw.upper().startswith(d)), None)
    if decision is None:
        return None
    skill = raw[len(decision) :].strip(" :-,;()")
    out = {f.lower(): found[f] for f in CHECK_FIELDS}
    out["decision"] = decision
    out["skill"] = skill
    return out
