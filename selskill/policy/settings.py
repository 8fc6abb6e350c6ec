"""What a policy backend is built with, and the one place a recipe becomes that.

Each backend takes one frozen settings object whose defaults are the backend's defaults, so a
caller states only what it changes and a new knob is added in one place. `backend_settings`
is the only code that reads the recipe's policy and rollout sections for a backend; stages,
benchmarks and tests that build a policy by hand pass settings objects directly. The backends
import their settings from here, and `selskill.policy.backends.open_policy` opens one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from selskill.config.rollout import RolloutConfig
from selskill.config.run import PolicyConfig


@dataclass(frozen=True)
class HFSettings:
    """The transformers backend (`selskill.policy.hf.HFPolicy`)."""

    device: str = "cpu"
    dtype: str = "float32"
    trust_remote_code: bool = False
    batch_size: int = 32  # rows per forward pass (a request with n samples takes n rows)
    max_cached_sequences: int = 256  # stored KV sequences kept for prefix reuse (least recent go first)
    # ...and their bytes: a sequence's KV grows with the model's depth and width, so a count alone lets a
    # deep model's store outgrow the machine (the recipe's `policy_kv_cache_gib`)
    max_cached_bytes: int = 4 * 2**30
    entropy_chunk_rows: int = 8  # rows per full-vocabulary log-softmax, to bound memory
    exact_entropy: bool = True  # False only to measure what the entropy costs (bench)
    # per-row prefill pays on a CPU, where prefill is compute-bound and padding is pure waste;
    # on a GPU one padded batch keeps the device busy (None = on for CPU only)
    ragged_prefill: bool | None = None


@dataclass(frozen=True)
class VLLMSettings:
    """The vLLM backend (`selskill.policy.vllm_backend.VLLMPolicy`; its module docstring says why
    each default is what it is)."""

    dtype: str = "auto"
    seed: int = 0  # the engine's seed
    logprobs_k: int = 20  # top-k logprobs per generated token: the entropy estimate's k
    exact_entropy_rescore: bool | int = False  # False, True (full vocabulary) or the first m positions
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    trust_remote_code: bool = False
    enable_prefix_caching: bool = True
    per_request_seeds: bool = True
    kv_cache_memory_bytes: int | None = None  # None: 1 GiB on CPU (or VLLM_CPU_KVCACHE_SPACE), vLLM's on GPU
    max_num_seqs: int | None = None
    in_process: bool | None = None  # None: in-process on CPU, vLLM's engine process on GPU
    tokenizer_path: str | None = None  # None: the model's directory
    engine_kwargs: Mapping[str, object] = field(default_factory=dict)  # any other `vllm.LLM` argument


def backend_settings(
    policy: PolicyConfig, rollout: RolloutConfig, seed: int = 0
) -> HFSettings | VLLMSettings:
    """The settings of the backend the recipe's policy section names."""
    if policy.policy_backend == "vllm":
        return VLLMSettings(dtype=policy.policy_dtype, seed=seed, trust_remote_code=policy.trust_remote_code)
    return HFSettings(
        device=policy.policy_device,
        dtype=policy.policy_dtype,
        trust_remote_code=policy.trust_remote_code,
        batch_size=rollout.policy_batch_size,
        max_cached_bytes=int(policy.policy_kv_cache_gib * 2**30),
    )
