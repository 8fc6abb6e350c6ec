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

The scorers are in `selskill.skills.scorers`, the prefix and its record in
`selskill.skills.step_records`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property

import numpy as np

from selskill.config.names import RETRIEVAL_MODES as MODES
from selskill.config.names import RETRIEVAL_SCORERS as SCORERS
from selskill.skills.model import SkillLibrary
from selskill.skills.scorers import (
    DEFAULT_DENSE_MODEL,
    DOC_FIELDS,
    FUSIONS,
    BM25Scorer,
    DenseEncoder,
    DenseScorer,
    FusedScorer,
    count_tokens,
    minmax,
    order_by_score,
    skill_document,
)
from selskill.skills.step_records import EpisodePrefix, RecordConfig, build_record, step_text

BUDGET_TEXTS: tuple[str, ...] = ("content", "listing")
DEMOTE_INVOKED: tuple[str, ...] = ("none", "memory", "all")

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
