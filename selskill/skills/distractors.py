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
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Domain:
    key: str  # name prefix
    app: str  # "the calendar app"
    verbs: tuple[tuple[str, str], ...]  # (base, past participle)
    items: tuple[str, ...]
    conditions: tuple[str, ...]  # "... and <condition>"
    details: tuple[str, ...]  # a procedural hint for the body


DOMAINS: tuple[Domain, ...] = (
    Domain(
        "calendar",
        "the calendar app",
        (
            ("schedule", "scheduled"),
            ("reschedule", "rescheduled"),
            ("cancel", "cancelled"),
            ("duplicate", "duplicated"),
            ("summarize", "summarized"),
            ("color_label", "color-labelled"),
            ("export", "exported"),
        ),
        (
            "meeting",
            "recurring event",
            "all-day event",
            "focus block",
            "out-of-office block",
            "availability slot",
            "event reminder",
        ),
        ("the date and time are known", "the attendees are named", "it falls in the current week"),
        (
            "check the time zone of every attendee",
            "keep the original description and agenda",
            "warn about overlaps with existing events",
        ),
    ),
    Domain(
        "music",
        "the music streaming app",
        (
            ("create", "created"),
            ("rename", "renamed"),
            ("reorder", "reordered"),
            ("download", "downloaded"),
            ("remove", "removed"),
            ("restore", "restored"),
            ("recommend", "recommended"),
        ),
        ("playlist", "album", "liked song", "radio mix", "listening queue", "artist follow", "lyrics view"),
        (
            "the artist or song title is named",
            "the library belongs to the user",
            "offline listening is enabled",
        ),
        (
            "match songs by artist and title, not by cover art",
            "keep the current playback running",
            "respect the explicit-content filter",
        ),
    ),
    Domain(
        "podcast",
        "the podcast player",
        (
            ("subscribe_to", "subscribed to"),
            ("download", "downloaded"),
            ("bookmark", "bookmarked"),
            ("skip", "skipped"),
            ("rate", "rated"),
            ("transcribe", "transcribed"),
            ("archive", "archived"),
        ),
        (
            "podcast episode",
            "show subscription",
            "download queue",
            "listening bookmark",
            "episode transcript",
            "playback speed preset",
            "show rating",
        ),
        ("the show title is known", "the episode number is given", "storage space is available"),
        (
            "resume from the last listened position",
            "keep downloads under the storage limit",
            "mark finished episodes as played",
        ),
    ),
    Domain(
        "shop",
        "the online shop",
        (
            ("add", "added"),
            ("remove", "removed"),
            ("compare", "compared"),
            ("track", "tracked"),
            ("return", "returned"),
            ("review", "reviewed"),
            ("apply", "applied"),
        ),
        (
            "wishlist item",
            "product review",
            "return request",
            "coupon code",
            "delivery address",
            "gift wrap option",
            "price alert",
        ),
        (
            "the product name is known",
            "the purchase was made in the last 30 days",
            "the shopper is signed in to the shop",
        ),
        (
            "check sizes and colours before confirming",
            "show the final total with taxes",
            "keep the receipt number for later",
        ),
    ),
    Domain(
        "fitness",
        "the fitness tracker",
        (
            ("plan", "planned"),
            ("log", "logged"),
            ("adjust", "adjusted"),
            ("review", "reviewed"),
            ("pause", "paused"),
            ("compare", "compared"),
            ("celebrate", "celebrated"),
        ),
        (
            "workout plan",
            "running route",
            "daily step goal",
            "heart-rate zone",
            "strength session",
            "rest day",
            "personal record",
        ),
        ("the sport and duration are known", "the tracker has synced today", "the user sets a weekly target"),
        (
            "warm up before any high-intensity interval",
            "keep weekly load increases below ten percent",
            "sync the wearable before reading totals",
        ),
    ),
    Domain(
        "sleep",
        "the sleep tracker",
        (
            ("set", "set"),
            ("review", "reviewed"),
            ("adjust", "adjusted"),
            ("log", "logged"),
            ("silence", "silenced"),
            ("compare", "compared"),
            ("reset", "reset"),
        ),
        (
            "sleep schedule",
            "wind-down reminder",
            "sleep score",
            "nap log",
            "snore recording",
            "wake-up range",
            "sleep goal",
        ),
        ("the usual wake-up time is known", "last night's data has synced", "the weekend schedule differs"),
        (
            "keep at least seven hours between wind-down and wake-up",
            "dim the screen reminders at night",
            "compare against the seven-day average",
        ),
    ),
    Domain(
        "mindful",
        "the meditation app",
        (
            ("start", "started"),
            ("schedule", "scheduled"),
            ("log", "logged"),
            ("review", "reviewed"),
            ("customize", "customized"),
            ("pause", "paused"),
            ("recommend", "recommended"),
        ),
        (
            "breathing exercise",
            "guided session",
            "mood entry",
            "gratitude journal entry",
            "calm streak",
            "session reminder",
            "focus soundscape",
        ),
        ("the preferred length is given", "the user reports feeling stressed", "notifications are allowed"),
        (
            "begin with two minutes of slow breathing",
            "keep the streak count unchanged on rest days",
            "offer a shorter session when time is short",
        ),
    ),
    Domain(
        "weather",
        "the weather service",
        (
            ("check", "checked"),
            ("subscribe_to", "subscribed to"),
            ("compare", "compared"),
            ("summarize", "summarized"),
            ("pin", "pinned"),
            ("mute", "muted"),
            ("explain", "explained"),
        ),
        (
            "hourly forecast",
            "severe weather alert",
            "pollen report",
            "weekly outlook",
            "saved location",
            "uv index summary",
            "rain radar view",
        ),
        ("the city or postcode is known", "the user plans an outdoor activity", "alerts are enabled"),
        (
            "state the forecast time and its source",
            "give temperatures in the user's units",
            "give the chance of rain as a percentage",
        ),
    ),
    Domain(
        "photo",
        "the photo editor",
        (
            ("crop", "cropped"),
            ("retouch", "retouched"),
            ("caption", "captioned"),
            ("organize", "organized"),
            ("export", "exported"),
            ("restore", "restored"),
            ("tag", "tagged"),
        ),
        (
            "photo album",
            "filter preset",
            "portrait shot",
            "collage layout",
            "panorama",
            "duplicate photo set",
            "raw image",
        ),
        ("the album name is known", "the original resolution must be kept", "faces are already tagged"),
        (
            "work on a copy and keep the original",
            "keep the aspect ratio unless told otherwise",
            "export at full resolution",
        ),
    ),
    Domain(
        "stream",
        "the video streaming service",
        (
            ("resume", "resumed"),
            ("rate", "rated"),
            ("hide", "hidden"),
            ("download", "downloaded"),
            ("restrict", "restricted"),
            ("recommend", "recommended"),
            ("queue", "queued"),
        ),
        (
            "series season",
            "subtitle track",
            "parental control profile",
            "continue-viewing row",
            "film rating",
            "offline download",
            "viewing history",
        ),
        ("the title is named", "a profile for children exists", "the subscription plan allows it"),
        (
            "pick the profile before changing anything",
            "keep subtitles in the chosen language",
            "respect the age rating of the profile",
        ),
    ),
    Domain(
        "lingo",
        "the language course app",
        (
            ("practice", "practiced"),
            ("review", "reviewed"),
            ("create", "created"),
            ("reset", "reset"),
            ("translate", "translated"),
            ("grade", "graded"),
            ("extend", "extended"),
        ),
        (
            "flashcard deck",
            "vocabulary list",
            "pronunciation drill",
            "grammar lesson",
            "daily streak",
            "placement quiz",
            "conversation practice",
        ),
        ("the target language is known", "the learner's level is given", "today's lesson is finished"),
        (
            "space reviews out over several days",
            "say each new word aloud twice",
            "stay at the learner's level",
        ),
    ),
    Domain(
        "gamenight",
        "the game night planner",
        (
            ("organize", "organized"),
            ("score", "scored"),
            ("set_up", "set up"),
            ("shuffle", "shuffled"),
            ("rank", "ranked"),
            ("record", "recorded"),
            ("vote_on", "voted on"),
        ),
        (
            "game night",
            "scorecard",
            "tournament bracket",
            "house rules sheet",
            "player roster",
            "dice log",
            "game collection",
        ),
        ("the number of players is known", "the date is agreed", "every player has joined the group"),
        (
            "seat new players beside experienced ones",
            "write the house rules down before starting",
            "break ties with a sudden-death round",
        ),
    ),
    Domain(
        "chess",
        "the chess club app",
        (
            ("solve", "solved"),
            ("analyze", "analyzed"),
            ("study", "studied"),
            ("pair", "paired"),
            ("rate", "rated"),
            ("replay", "replayed"),
            ("annotate", "annotated"),
        ),
        (
            "chess puzzle",
            "opening repertoire",
            "rated game",
            "tournament pairing",
            "endgame drill",
            "game analysis",
            "club ladder",
        ),
        ("the game notation is given", "the player's rating is known", "the round has started"),
        (
            "check every capture and check first",
            "record the moves in algebraic notation",
            "compare the computer's best line with the played move",
        ),
    ),
    Domain(
        "pet",
        "the pet care app",
        (
            ("schedule", "scheduled"),
            ("log", "logged"),
            ("update", "updated"),
            ("remind_about", "reminded about"),
            ("review", "reviewed"),
            ("plan", "planned"),
            ("track", "tracked"),
        ),
        (
            "vaccination record",
            "vet appointment",
            "feeding schedule",
            "dog walk",
            "grooming session",
            "pet profile",
            "medication reminder",
        ),
        ("the pet's name and species are known", "the vet clinic is saved in the app", "the dose is given"),
        (
            "note the pet's weight with every entry",
            "keep feeding times consistent",
            "flag overdue vaccinations",
        ),
    ),
    Domain(
        "jobs",
        "the job board",
        (
            ("apply_to", "applied to"),
            ("save", "saved"),
            ("tailor", "tailored"),
            ("withdraw", "withdrawn"),
            ("prepare", "prepared"),
            ("compare", "compared"),
            ("follow_up_on", "followed up on"),
        ),
        (
            "job application",
            "cv version",
            "interview slot",
            "job alert",
            "cover letter draft",
            "recruiter note",
            "salary comparison",
        ),
        ("the role and employer are named", "the deadline is known", "the profile is complete"),
        (
            "match the wording of the job advert",
            "keep one cv version per role",
            "record the date of every application",
        ),
    ),
    Domain(
        "homes",
        "the home listings site",
        (
            ("save", "saved"),
            ("compare", "compared"),
            ("schedule", "scheduled"),
            ("estimate", "estimated"),
            ("filter", "filtered"),
            ("report", "reported"),
            ("inquire_about", "inquired about"),
        ),
        (
            "rental listing",
            "viewing appointment",
            "mortgage estimate",
            "neighbourhood report",
            "saved search",
            "rent comparison",
            "landlord inquiry",
        ),
        ("the area and price range are known", "the move-in date is given", "pets must be allowed"),
        (
            "compare prices per square metre",
            "note commute times to work",
            "keep the listing reference number",
        ),
    ),
    Domain(
        "nutrition",
        "the nutrition tracker",
        (
            ("log", "logged"),
            ("set", "set"),
            ("review", "reviewed"),
            ("adjust", "adjusted"),
            ("plan", "planned"),
            ("scan", "scanned"),
            ("summarize", "summarized"),
        ),
        (
            "meal log",
            "calorie goal",
            "water intake reminder",
            "macro breakdown",
            "grocery list",
            "fasting period",
            "allergy profile",
        ),
        (
            "the portion size is known",
            "dietary restrictions are in the profile",
            "today's entries are complete",
        ),
        (
            "weigh portions when possible",
            "flag anything on the allergy profile",
            "compare totals with the daily target",
        ),
    ),
    Domain(
        "stars",
        "the stargazing app",
        (
            ("plan", "planned"),
            ("log", "logged"),
            ("identify", "identified"),
            ("predict", "predicted"),
            ("export", "exported"),
            ("calibrate", "calibrated"),
            ("follow", "followed"),
        ),
        (
            "star chart",
            "meteor shower alert",
            "telescope session",
            "observing log",
            "constellation guide",
            "moon phase calendar",
            "satellite pass",
        ),
        ("the observing site is known", "the sky is forecast to be clear", "the telescope model is given"),
        (
            "let eyes adapt to the dark for twenty minutes",
            "note the time in universal time",
            "record the seeing conditions",
        ),
    ),
    Domain(
        "family",
        "the family tree site",
        (
            ("add", "added"),
            ("merge", "merged"),
            ("verify", "verified"),
            ("cite", "cited"),
            ("research", "researched"),
            ("attach", "attached"),
            ("compare", "compared"),
        ),
        (
            "tree branch",
            "ancestor profile",
            "census record",
            "dna match",
            "birth record",
            "family archive",
            "surname study",
        ),
        ("names and approximate dates are known", "the source is cited", "the relative has consented"),
        (
            "keep every claim tied to a source",
            "record dates as day month year",
            "mark uncertain links as unverified",
        ),
    ),
    Domain(
        "volunteer",
        "the volunteer portal",
        (
            ("sign_up_for", "signed up for"),
            ("log", "logged"),
            ("organize", "organized"),
            ("confirm", "confirmed"),
            ("swap", "swapped"),
            ("thank_donors_of", "thanked"),
            ("review", "reviewed"),
        ),
        (
            "volunteer shift",
            "donation drive",
            "event signup",
            "hours log",
            "charity pledge",
            "team roster",
            "helper briefing",
        ),
        ("the charity is named", "the date and hours are known", "a coordinator has approved it"),
        (
            "confirm the meeting point one day before",
            "record hours on the same day",
            "thank every helper by name",
        ),
    ),
    Domain(
        "notes",
        "the notes app",
        (
            ("create", "created"),
            ("pin", "pinned"),
            ("tag", "tagged"),
            ("merge", "merged"),
            ("summarize", "summarized"),
            ("lock", "locked"),
            ("restore", "restored"),
        ),
        (
            "notebook",
            "checklist note",
            "voice memo",
            "meeting minutes",
            "tag group",
            "pinned note",
            "notebook section",
        ),
        ("the note title is known", "the notebook exists", "the device has synced"),
        ("keep headings short and dated", "turn action items into a checklist", "never delete the original"),
    ),
    Domain(
        "cycling",
        "the cycling app",
        (
            ("plan", "planned"),
            ("record", "recorded"),
            ("review", "reviewed"),
            ("join", "joined"),
            ("schedule", "scheduled"),
            ("compare", "compared"),
            ("export", "exported"),
        ),
        (
            "bike ride",
            "cycling route",
            "group ride",
            "maintenance reminder",
            "climb segment",
            "gear checklist",
            "training block",
        ),
        ("the start point is known", "the bike profile is set", "the ride is under three hours"),
        (
            "check the chain and pressure gauge reading before long rides",
            "avoid roads without a cycle lane",
            "pace climbs by heart rate",
        ),
    ),
    Domain(
        "hiking",
        "the hiking app",
        (
            ("plan", "planned"),
            ("download", "downloaded"),
            ("check", "checked"),
            ("log", "logged"),
            ("report", "reported"),
            ("pack_for", "packed for"),
            ("print", "printed"),
        ),
        (
            "trail map",
            "hike plan",
            "elevation profile",
            "trail condition report",
            "summit log",
            "packing list",
            "check-in plan",
        ),
        ("the trail name is known", "the group size is given", "the forecast is settled"),
        ("leave the route with someone at home", "turn back at the agreed time", "carry the offline map"),
    ),
    Domain(
        "party",
        "the event planner",
        (
            ("draft", "drafted"),
            ("update", "updated"),
            ("confirm", "confirmed"),
            ("arrange", "arranged"),
            ("estimate", "estimated"),
            ("review", "reviewed"),
            ("finalize", "finalized"),
        ),
        (
            "guest list",
            "seating chart",
            "vendor quote",
            "rsvp tracker",
            "theme board",
            "toast draft",
            "party timeline",
        ),
        ("the date and venue are set", "the guest count is known", "dietary needs are collected"),
        ("confirm vendors two weeks ahead", "seat families together", "keep a buffer in the timeline"),
    ),
    Domain(
        "craft",
        "the crafting app",
        (
            ("start", "started"),
            ("track", "tracked"),
            ("resize", "resized"),
            ("log", "logged"),
            ("photograph", "photographed"),
            ("count", "counted"),
            ("plan", "planned"),
        ),
        (
            "knitting pattern",
            "yarn stash",
            "row counter",
            "craft project",
            "stitch guide",
            "needle size chart",
            "finished piece gallery",
        ),
        ("the pattern name is known", "the yarn weight is given", "the gauge swatch is done"),
        ("knit a gauge swatch first", "note the dye lot of every skein", "count rows after each repeat"),
    ),
    Domain(
        "karaoke",
        "the karaoke app",
        (
            ("queue", "queued"),
            ("transpose", "transposed"),
            ("score", "scored"),
            ("record", "recorded"),
            ("rank", "ranked"),
            ("duet", "duetted"),
            ("favorite", "favorited"),
        ),
        (
            "karaoke track",
            "singer queue",
            "key change",
            "duet pairing",
            "performance recording",
            "scoreboard",
            "song request",
        ),
        ("the song title is known", "the singer has joined the session", "the microphone is connected"),
        (
            "lower the key for untrained voices",
            "keep the queue fair: one song per singer per round",
            "show lyrics two lines ahead",
        ),
    ),
)

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
