"""The policy protocol: token ids in, token ids with per-token logprob and entropy out.

Both backends (transformers, vLLM) implement it, so the episode runner, the branch and
fork stages and the evaluation never know which one runs. Requests carry token ids, never
text: the runner owns the exact sequence the model sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()  # generation ends after emitting one of these (kept in the output)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    seed: int = 0  # per-request seed: a request's samples do not depend on what it is batched with
    n: int = 1  # samples from this prompt; they share its prefix (KV cache / prefix caching)
    # KV reuse hints (a backend may ignore them): the sequence is stored under `cache_key`
    # (with n > 1, sample j under f"{cache_key}:{j}") and a later request with that key or
    # naming it in `cache_from` reuses the longest common token prefix.
    cache_key: str | None = None
    cache_from: str | None = None
    # restricts which tokens may be chosen (`selskill.agent.action_choice.ActionChoice`: `mask()`
    # and `push(token_id)`); recorded logprobs stay the unconstrained policy's. n must be 1.
    constraint: object | None = None


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]  # log p(token) under the T=1 distribution
    entropies: list[float]  # entropy (nats) of the T=1 next-token distribution at each position
    finish_reason: str  # stop | length
    entropy_exact: bool = True  # False for a top-k estimate (vLLM)
    leftover_mass: list[float] | None = None  # with top-k estimates: probability mass outside the top k


@dataclass
class ThroughputStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    # the part of `seconds` spent reading prompts into the KV cache (the rest decodes), where the
    # backend can tell them apart: prefill is compute-bound and decoding memory-bound, so one
    # tokens/s figure for both says little
    prefill_seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0


@runtime_checkable
class Policy(Protocol):
    policy_id: str  # where the weights came from (path or hub id), recorded in every rollout row

    @property
    def tokenizer(self): ...

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[Generation]]:
        """`n` generations per request, in request order."""

    def score(
        self, prompt_ids: Sequence[int], continuation_ids: Sequence[int]
    ) -> tuple[list[float], list[float]]:
        """Teacher-forced (logprob, entropy) of each continuation token (exact, full vocabulary)."""

    def stats(self) -> ThroughputStats:
        """Tokens and seconds spent in generate() since construction."""
