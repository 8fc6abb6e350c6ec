"""Seeded distractor skills: realistic when-to-use text from domains no benchmark touches.

SelSkill's App. F injects "noise skills ... such as calendar management, music streaming,
e-commerce, and fitness tracking, with realistic when-to-use conditions that do not overlap
with any BFCL evaluation task" to grow the 18-skill BFCL listing to 28, 38 and 68. This
module writes such skills for any benchmark library and scales to ~1,000 (the retrieval
benchmark's largest library): 26 domains x 7 actions x 7 items = 1,274 distinct skills.

- **Deterministic**: `distractor_skills(n, seed)` is the first n of one seeded permutation,
  and each skill's wording is drawn from (seed, name) alone, so the 28-skill listing is a
  subset of the 38-skill one and a skill reads the same at every size.
- **Disjoint**: no domain word of either benchmark (`BENCHMARK_TERMS`: ALFWorld's task verbs
  and household nouns, BFCL's eight APIs' nouns) appears in a distractor's name,
  description or body; tests check it against alfworld's own object and receptacle list.
- Distractors are memory skills (a short procedure), valid SKILL.md files when written out.
- The domains' words (app, actions, items, conditions, details) are data:
  `selskill/skills/data/distractor_domains.json`.
"""

from __future__ import annotations

import importlib.resources
import json
import random
import re
from dataclasses import dataclass

from selskill.skills.model import Skill, SkillLibrary

APP_F_SIZES: tuple[int, ...] = (18, 28, 38, 68)  # SelSkill App. F: 18 BFCL skills + 10 / 20 / 50 noise

# Words of the benchmarks' own domains that a distractor must never contain (lower case,
# whole words): ALFWorld's task verbs and household nouns, BFCL's APIs (file system, math,
# messaging, Twitter, tickets, trading, travel, vehicle) and the words their skills lean on.
BENCHMARK_TERMS = frozenset(
    """
    heat hot cool cold chill clean wash examine lamp desklamp light microwave fridge sink sinkbasin
    drawer cabinet shelf countertop receptacle household room object kitchen bathroom toilet
    apple bread egg lettuce potato tomato mug cup plate bowl pan pot knife fork spoon kettle
    book cd box watch pen pencil pillow laptop cellphone phone newspaper vase statue candle towel
    cart safe bed sofa chair desk dresser television tv remote window mirror painting poster
    file files folder directory path math logarithm arithmetic message messages messaging contact
    tweet tweets twitter retweet hashtag mention post ticket tickets stock stocks share shares
    trade trading order orders watchlist broker market flight flights travel airport airline
    booking budget currency exchange insurance invoice card credit car vehicle engine brake door
    doors tire tires fuel gallon login password username
    """.split()
)

_A = ("a", "an")
DOMAINS_FILE = "distractor_domains.json"  # under selskill/skills/data/


@dataclass(frozen=True)
class Domain:
    key: str  # name prefix
    app: str  # "the calendar app"
    verbs: tuple[tuple[str, str], ...]  # (base, past participle)
    items: tuple[str, ...]
    conditions: tuple[str, ...]  # "... and <condition>"
    details: tuple[str, ...]  # a procedural hint for the body


def _load_domains() -> tuple[Domain, ...]:
    """The domains' words, from the package's data file (read once, at import)."""
    text = (
        importlib.resources.files("selskill.skills")
        .joinpath("data")
        .joinpath(DOMAINS_FILE)
        .read_text(encoding="utf-8")
    )
    return tuple(
        Domain(
            key=d["key"],
            app=d["app"],
            verbs=tuple((base, past) for base, past in d["verbs"]),
            items=tuple(d["items"]),
            conditions=tuple(d["conditions"]),
            details=tuple(d["details"]),
        )
        for d in json.loads(text)
    )


DOMAINS: tuple[Domain, ...] = _load_domains()

CAPACITY = sum(len(d.verbs) * len(d.items) for d in DOMAINS)

_DESCRIPTION_FORMS = (
    "{Verb} {a} {item} in {app}. Use it when the user asks to {verb} {a} {item} and {cond}.",
    "How to {verb} {a} {item} with {app}. Use it when the user wants {a} {item} {past} and {cond}.",
    "{Verb} {a} {item} through {app}. Use it when a request refers to {a} {item} to be {past}, once {cond}.",
)
_BODY_FORMS = (
    "1. In {app}, find the {item} the user means (search by its name or date).\n"
    "2. {Verb} it: {detail}.\n"
    "3. Read back what changed and ask before any step that cannot be undone.",
    "Steps for {app}:\n"
    "- Locate the {item}; if several match, list them and let the user choose.\n"
    "- {Verb} it, and {detail}.\n"
    "- Confirm the result in one sentence.",
)


def _article(word: str) -> str:
    return _A[1] if word[0] in "aeiou" else _A[0]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _combos() -> list[tuple[Domain, tuple[str, str], str]]:
    return [(d, v, i) for d in DOMAINS for v in d.verbs for i in d.items]


def _make(domain: Domain, verb: tuple[str, str], item: str, seed: int) -> Skill:
    name = f"{domain.key}_{_slug(verb[0])}_{_slug(item)}"
    rng = random.Random(f"selskill-distractor:{seed}:{name}")
    base = verb[0].replace("_", " ")
    fields = {
        "verb": base,
        "Verb": base[0].upper() + base[1:],
        "past": verb[1],
        "item": item,
        "a": _article(item),
        "app": domain.app,
        "cond": rng.choice(domain.conditions),
        "detail": rng.choice(domain.details),
    }
    description = rng.choice(_DESCRIPTION_FORMS).format(**fields)
    body = rng.choice(_BODY_FORMS).format(**fields)
    return Skill(name=name, description=description, kind="memory", body=body, path=f"distractor:{seed}")


def distractor_skills(n: int, seed: int = 0) -> list[Skill]:
    """`n` distractor skills (at most `CAPACITY`): the first `n` of the seed's permutation."""
    if not 0 <= n <= CAPACITY:
        raise ValueError(f"distractor count must be in [0, {CAPACITY}], got {n}")
    combos = _combos()
    random.Random(f"selskill-distractors:{seed}").shuffle(combos)
    return [_make(d, v, i, seed) for d, v, i in combos[:n]]


def with_distractors(library: SkillLibrary, n: int, seed: int = 0) -> SkillLibrary:
    """`library` plus `n` distractors (a name clash with the library is an error)."""
    extra = distractor_skills(n, seed)
    clash = sorted(set(library) & {s.name for s in extra})
    if clash:
        raise ValueError(f"distractor names clash with the library: {clash[:3]}")
    return SkillLibrary({**library, **{s.name: s for s in extra}})


def library_of_size(library: SkillLibrary, size: int, seed: int = 0) -> SkillLibrary:
    """`library` padded with distractors to `size` skills (18 -> 28 / 38 / 68 is SelSkill's App. F)."""
    if size < len(library):
        raise ValueError(f"size {size} is below the library's own {len(library)} skills")
    return with_distractors(library, size - len(library), seed)


def terms_in(text: str, terms: frozenset[str] = BENCHMARK_TERMS) -> set[str]:
    """The benchmark words that occur in `text` as whole words (case-insensitive)."""
    return {w for w in re.findall(r"[a-z]+", text.lower()) if w in terms}
