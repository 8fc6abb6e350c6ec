"""Two replacements the transformers backend swaps into transformers' decoding on a CPU.

Stock decoding spends most of a small model's CPU time copying KV caches, not computing:
`DynamicLayer` concatenates its whole cache at every step, and the masked sdpa path copies
K/V to every query head under grouped-query attention. `prealloc_layer_class()` is a cache
layer that grows in place (used on any device); `cpu_gqa_sdpa` keeps the heads grouped. Both
give the stock numbers (tests/test_runner.py compares them); they live apart from the policy
because they depend on transformers' cache and attention internals, not on what the policy does.
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=1)
def prealloc_layer_class():
    from transformers.cache_utils import DynamicLayer

    class PreallocLayer(DynamicLayer):
        """A DynamicLayer whose keys/values live in a buffer with room to grow.

        The stock layer concatenates its whole cache at every decode step (a full copy per
        layer per token); here new states are written in place and `keys`/`values` are views.
        """

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, extra: int):
            super().__init__()
            b, h, n, d = keys.shape
            self._k = keys.new_empty(b, h, n + extra, d)
            self._v = values.new_empty(b, h, n + extra, d)
            self._k[:, :, :n] = keys
            self._v[:, :, :n] = values
            self._n = n
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
            self._views()

        @classmethod
        def over(cls, keys: torch.Tensor, values: torch.Tensor, n: int):
            """A layer over existing buffers (no copy): the first `n` positions are filled."""
            layer = cls.__new__(cls)
            DynamicLayer.__init__(layer)
            layer._k, layer._v, layer._n = keys, values, n
            layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
            layer._views()
            return layer

        def _views(self) -> None:
            self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]

        def update(self, key_states, value_states, *args, **kwargs):
            n2 = self._n + key_states.shape[-2]
            if n2 > self._k.shape[2]:  # grow geometrically
                grow = max(n2, 2 * self._k.shape[2]) - self._k.shape[2]
                pad = self._k.new_empty(*self._k.shape[:2], grow, self._k.shape[3])
                self._k, self._v = torch.cat([self._k, pad], 2), torch.cat([self._v, pad.clone()], 2)
            self._k[:, :, self._n : n2] = key_states
            self._v[:, :, self._n : n2] = value_states
            self._n = n2
            self._views()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self._n

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self._k, self._v = self._k[indices], self._v[indices]
            self._views()

        def batch_repeat_interleave(self, repeats: int) -> None:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._views()

    return PreallocLayer


def cpu_gqa_sdpa(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """transformers' sdpa attention, but grouped-query attention stays grouped on CPU under a mask.

    With an attention mask (every batched call here has one), transformers copies K/V to all
    query heads (`repeat_kv`) before calling torch's SDPA: a full copy of every row's KV cache
    per layer per decode step. torch's `enable_gqa` gives the same result without the copy,
    which is most of the attention's time on a CPU (docs/benchmarks.md, "After the engine and
    KV fixes"); the outputs are identical.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (
        query.device.type == "cpu"
        and attention_mask is not None
        and getattr(module, "num_key_value_groups", 1) > 1
        and kwargs.get("position_bias") is None
        and not kwargs.get("output_attentions", False)
    ):
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
        )
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        is_causal=is_causal,
        **kwargs,
    )


CPU_GQA_SDPA = "selskill_cpu_gqa_sdpa"


def register_cpu_gqa_sdpa() -> None:
    """Make `CPU_GQA_SDPA` a name `from_pretrained(attn_implementation=...)` accepts (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(CPU_GQA_SDPA, cpu_gqa_sdpa)
    AttentionMaskInterface.register(CPU_GQA_SDPA, sdpa_mask)  # the same masks sdpa gets (else: none at all)
