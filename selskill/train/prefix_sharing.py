"""Shared-prefix DPO: a branch point's history is computed once for all the pairs that share it.

A local pair's prompt is the whole episode up to the branch point, and its trained window is a
few turns after it (selskill.train.pairs trims the rest), so most of a pair is prompt. The
unpacked trainer runs that prompt twice per pair (chosen and rejected row) and twice more for
the reference. Here a batch is laid out as prefix trees instead, one row per tree:

    [prompt[:-1]] [prompt[-1] + continuation 1] [prompt[-1] + continuation 2] ... [pad]

- `pair`: one tree per pair (its chosen and rejected continuations);
- `branch`: one tree per distinct prompt in the batch, each distinct continuation once (a
  continuation in two pairs of the branch point is computed once; a pair gathers its two).

Every continuation restarts with the prompt's last token, at that token's position: the hidden
state that predicts a completion's first token is then computed inside the continuation that
owns it (a shared one would need two labels at one position), and a continuation's position
ids continue from the prompt as if it followed it directly (RoPE sees the unpacked positions).
The attention is a prefix-tree mask: the prefix is causal; a continuation sees the whole
prefix and itself, causally, never a sibling. So every trained token sees exactly the tokens
it sees in the unpacked batch, and the per-token log-probs are the same up to float rounding.

TRL's loss is left untouched: the batch still carries the unpacked `input_ids`,
`attention_mask` and `completion_mask` (labels, metrics, token counts are computed from them as
before) plus the packed tensors (`PACKED_KEYS`). `enable` wraps the model's fused-LM-head
forward: given packed tensors it runs the packed rows and scatters the per-token outputs back
to the unpacked (2 x pairs, length - 1) layout, so log-prob sums, the sft term, reference
log-probs (on the fly or precomputed), per-kind metrics, DDP and ZeRO see what they saw before.

The attention mask reaches the model in the form its attention implementation takes
(transformers hands a 4D mask to the attention function untouched):
- `sdpa` (transformers' default) is switched to `TREE_SDPA`, SDPA called per tree segment
  (prefix with `is_causal`, each continuation against prefix + itself). A dense 4D mask
  through one SDPA call is exact too, but computes every masked-out score: on a CPU it makes
  the packed attention as slow as the unpacked one. Per segment it does only the needed part.
- `eager`: a dense additive 4D mask.
- `flex_attention`: a FlexAttention block mask (its blocks outside the tree are skipped).
Model types whose attention goes through `AttentionInterface` with full (not sliding) attention
and explicit position ids take these masks; `MODEL_TYPES` are the ones the exactness tests run.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from selskill.config.train import PREFIX_SHARING_CHOICES

MODES = PREFIX_SHARING_CHOICES  # the values of the recipe key train_prefix_sharing
MODEL_TYPES = ("qwen3", "qwen2", "llama")
TREE_SDPA = "selskill_prefix_tree_sdpa"
DENSE_MASK_ATTENTIONS = ("eager",)
ATTENTIONS = (TREE_SDPA, "sdpa", "flex_attention", *DENSE_MASK_ATTENTIONS)
PACKED_KEYS = ("packed_input_ids", "packed_position_ids", "packed_segments", "packed_labels", "packed_index")
PAD_SEGMENT = -1
IGNORE = -100


# --- the layout -------------------------------------------------------------------------------------------


@dataclass
class _Tree:
    prompt: list[int]
    continuations: list[tuple[list[int], list[int]]] = field(default_factory=list)
    seen: dict[tuple, int] = field(default_factory=dict)

    def add(self, ids: Sequence[int], mask: Sequence[int]) -> int:
        ids, mask = [int(t) for t in ids], [int(m) for m in mask]
        key = (tuple(ids), tuple(mask))
        if key not in self.seen:
            self.seen[key] = len(self.continuations)
            self.continuations.append((ids, mask))
        return self.seen[key]


def pack_pairs(
    examples: Sequence[dict[str, Any]], mode: str, unpacked_length: int, pad_token_id: int
) -> dict[str, torch.Tensor]:
    """The packed tensors (`PACKED_KEYS`) for pair rows that MaskedPreferenceCollator lays out unpacked.

    `unpacked_length` is the unpacked batch's padded length: `packed_index` maps each position of
    the unpacked (2 x pairs, length - 1) per-token outputs (chosen rows first) to the packed
    position that predicts the same token, or -1 where nothing is trained.
    """
    if mode not in ("pair", "branch"):
        raise ValueError(f"pack_pairs packs for mode pair or branch; got {mode!r}")
    trees: list[_Tree] = []
    by_prompt: dict[tuple, int] = {}
    refs = []  # (tree, chosen continuation, rejected continuation) per pair
    for ex in examples:
        prompt = tuple(int(t) for t in ex["prompt_ids"])
        t = by_prompt.get(prompt) if mode == "branch" else None
        if t is None:
            t = len(trees)
            trees.append(_Tree(list(prompt)))
            by_prompt[prompt] = t
        c = trees[t].add(ex["chosen_ids"], ex["chosen_loss_mask"])
        r = trees[t].add(ex["rejected_ids"], ex["rejected_loss_mask"])
        refs.append((t, c, r))
    sides = [(t, c) for t, c, _ in refs] + [(t, r) for t, _, r in refs]  # unpacked rows: chosen first

    rows, starts = [], []  # per tree: (ids, positions, segments, labels); where each continuation starts
    for tree in trees:
        p = len(tree.prompt)
        lead = 1 if p else 0  # the prompt's last token, repeated at the head of every continuation
        ids, pos = tree.prompt[: p - lead], list(range(p - lead))
        seg, lab = [0] * len(ids), [IGNORE] * len(ids)
        tree_starts = []
        for k, (cont, mask) in enumerate(tree.continuations, start=1):
            tree_starts.append(len(ids))
            toks = tree.prompt[p - lead :] + cont
            ids += toks
            pos += range(p - lead, p - lead + len(toks))
            seg += [k] * len(toks)
            # position i predicts toks[i + 1]: completion token j = i + 1 - lead
            nxt = [cont[j] if mask[j] else IGNORE for j in range(1 - lead, len(cont))]
            lab += nxt + [IGNORE]
        rows.append((ids, pos, seg, lab))
        starts.append(tree_starts)

    width = max(len(r[0]) for r in rows)
    fills = (pad_token_id, 0, PAD_SEGMENT, IGNORE)
    packed = [
        torch.tensor([r[i] + [fills[i]] * (width - len(r[i])) for r in rows], dtype=torch.long)
        for i in range(4)
    ]
    index = torch.full((len(sides), unpacked_length - 1), -1, dtype=torch.long)
    for row, (t, c) in enumerate(sides):
        p = len(trees[t].prompt)
        lead = 1 if p else 0
        _, mask = trees[t].continuations[c]
        for j, m in enumerate(mask):
            if m and p + j >= 1:
                # unpacked position p + j - 1 predicts completion token j; packed: start + lead + j - 1
                index[row, p + j - 1] = t * width + starts[t][c] + lead + j - 1
    return dict(zip(PACKED_KEYS, [*packed, index], strict=True))


def packed_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens a packed batch runs through the model (padding excluded)."""
    return int((batch["packed_segments"] != PAD_SEGMENT).sum())


@dataclass
class TreeLayout:
    """Per packed row: the prefix length and each continuation's [start, end), as Python ints.

    Read once per forward (one device sync) and handed to every layer's attention call; the
    continuation masks are built once per shape and reused by every layer.
    """

    rows: list[tuple[int, list[tuple[int, int]]]]
    _masks: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, segments: torch.Tensor) -> TreeLayout:
        rows = []
        for seg in segments.tolist():
            prefix = next((i for i, s in enumerate(seg) if s != 0), len(seg))
            spans, start = [], prefix
            for i in range(prefix, len(seg) + 1):
                if i == len(seg) or seg[i] != seg[start]:
                    if seg[start] != PAD_SEGMENT:
                        spans.append((start, i))
                    start = i
            rows.append((prefix, spans))
        return cls(rows)

    def continuation_mask(self, prefix: int, n: int, device) -> torch.Tensor:
        """(n, prefix + n) bool: every prefix token, then causal within the continuation."""
        key = (prefix, n, str(device))
        if key not in self._masks:
            mask = torch.ones(n, prefix + n, dtype=torch.bool, device=device)
            mask[:, prefix:] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
            self._masks[key] = mask
        return self._masks[key]


def dense_mask(segments: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(rows, 1, L, L) additive mask of the prefix trees; a padding position attends to itself only."""
    n = segments.shape[1]
    pos = torch.arange(n, device=segments.device)
    q, k = segments[:, :, None], segments[:, None, :]
    allowed = (pos[:, None] >= pos[None, :]) & (k != PAD_SEGMENT) & ((k == 0) | (k == q))
    allowed |= torch.eye(n, dtype=torch.bool, device=segments.device)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=segments.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def block_mask(segments: torch.Tensor):
    """The same tree as a FlexAttention BlockMask (its blocks outside the tree are never computed)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def tree(b, h, q, kv):
        sq, sk = segments[b, q], segments[b, kv]
        return ((kv <= q) & (sk != PAD_SEGMENT) & ((sk == 0) | (sk == sq))) | (q == kv)

    rows, n = segments.shape
    return create_block_mask(tree, rows, None, n, n, device=segments.device)


# --- the attention ------------------------------------------------------------------------------------------


def _tree_sdpa(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    is_causal=None,
    prefix_tree=None,
    **kwargs,
):
    """transformers' sdpa attention; on packed rows (`prefix_tree` given), SDPA per tree segment."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if prefix_tree is None:
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
    sdpa = functools.partial(
        torch.nn.functional.scaled_dot_product_attention,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    out = []
    for r, (prefix, spans) in enumerate(prefix_tree.rows):
        q, k, v = query[r : r + 1], key[r : r + 1], value[r : r + 1]
        parts = []
        if prefix:
            parts.append(sdpa(q[:, :, :prefix], k[:, :, :prefix], v[:, :, :prefix], is_causal=True))
        for start, end in spans:
            if prefix:
                kk = torch.cat([k[:, :, :prefix], k[:, :, start:end]], dim=2)
                vv = torch.cat([v[:, :, :prefix], v[:, :, start:end]], dim=2)
                mask = prefix_tree.continuation_mask(prefix, end - start, query.device)
                parts.append(sdpa(q[:, :, start:end], kk, vv, attn_mask=mask))
            else:
                parts.append(sdpa(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], is_causal=True))
        used = spans[-1][1] if spans else prefix
        if used < query.shape[2]:  # padding: its outputs are never read
            parts.append(q.new_zeros(1, q.shape[1], query.shape[2] - used, q.shape[3]))
        out.append(torch.cat(parts, dim=2))
    return torch.cat(out, dim=0).transpose(1, 2).contiguous(), None


@functools.cache
def register_tree_sdpa() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(TREE_SDPA, _tree_sdpa)
    AttentionMaskInterface.register(TREE_SDPA, sdpa_mask)  # unpacked calls get the masks sdpa gets


# --- the model --------------------------------------------------------------------------------------------


def check_model(model, mode: str) -> None:
    """Raise, naming the fix, unless `model` takes prefix-tree masks (see the module docstring)."""
    config = model.config
    fix = "or set train_prefix_sharing: none"
    if config.model_type not in MODEL_TYPES:
        raise ValueError(
            f"train_prefix_sharing: {mode} runs pairs as prefix trees through a custom attention mask, checked "
            f"for model types {', '.join(MODEL_TYPES)}; this policy is {config.model_type!r}: {fix}"
        )
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(config, "use_sliding_window", False):
        raise ValueError(
            f"train_prefix_sharing: {mode} needs full attention in every layer; this {config.model_type} policy "
            f"has sliding-window layers ({sorted(set(layer_types))}): turn use_sliding_window off {fix}"
        )
    impl = config._attn_implementation
    if impl not in ATTENTIONS:
        raise ValueError(
            f"train_prefix_sharing: {mode} needs an attention that takes a custom mask; the policy runs {impl!r}: "
            f"load it with attn_implementation sdpa (the default), eager or flex_attention (model_init_kwargs) {fix}"
        )


def enable(model, mode: str) -> None:
    """Let `model` (TRL's fused-LM-head forward already added) run packed batches. Idempotent."""
    if getattr(model, "_prefix_tree_forward", False):
        return
    check_model(model, mode)
    if model.config._attn_implementation == "sdpa":
        register_tree_sdpa()
        model.set_attn_implementation(TREE_SDPA)
    inner = model.forward

    @functools.wraps(type(model).forward)
    def forward(
        self,
        *args,
        packed_input_ids=None,
        packed_position_ids=None,
        packed_segments=None,
        packed_labels=None,
        packed_index=None,
        **kwargs,
    ):
        if packed_input_ids is None:
            return inner(*args, **kwargs)
        if args or not kwargs.pop("fused_lm_head", False):
            raise ValueError(
                "a packed batch (train_prefix_sharing) gives per-token log-probs only, through TRL's fused LM head; "
                "logits (compute_metrics, return_outputs) need train_prefix_sharing: none"
            )
        for name in ("input_ids", "attention_mask", "labels", "shift_labels", "position_ids"):
            kwargs.pop(name, None)  # the unpacked batch's: TRL computes its labels and metrics from them
        impl = self.config._attn_implementation
        if impl == TREE_SDPA:
            # a 4D tensor reaches the attention function untouched; the layout rides along as a kwarg,
            # which gradient checkpointing replays with the layer
            mask = packed_segments[:, None, None, :]
            kwargs["prefix_tree"] = TreeLayout.of(packed_segments)
        elif impl == "flex_attention":
            mask = block_mask(packed_segments)
        else:
            mask = dense_mask(packed_segments, self.dtype)
        out = inner(
            input_ids=packed_input_ids,
            position_ids=packed_position_ids,
            attention_mask=mask,
            shift_labels=packed_labels,
            fused_lm_head=True,
            **kwargs,
        )
        return unpack(out, packed_index)

    model.forward = types.MethodType(forward, model)
    model._prefix_tree_forward = True


def unpack(out, index: torch.Tensor):
    """The fused-head output of packed rows, laid out as the unpacked batch's (rows, length - 1)."""
    valid = index >= 0
    flat = index.clamp(min=0)

    def take(x):
        return None if x is None else x.reshape(-1)[flat].masked_fill(~valid, 0)

    fields = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
    return type(out)(
        loss=out.loss,
        label_mask=valid,
        aux_loss=out.aux_loss,
        **{name: take(getattr(out, name)) for name in fields},
    )


# --- batches by branch point --------------------------------------------------------------------------------


def prompt_groups(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    """Row indices grouped by identical prompt (a branch point after fitting), in first-seen order."""
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(tuple(p), []).append(i)
    return list(groups.values())


class BranchPointSampler(torch.utils.data.Sampler):
    """Every row once per epoch, the rows of one branch point next to each other.

    Branch points come in a seeded random order that changes with the epoch (the Trainer calls
    `set_epoch`), so consecutive rows, and so a batch, share their prompt where the batch size
    allows. The same seed and epoch give the same order on every process and on resume.
    """

    def __init__(self, groups: list[list[int]], seed: int = 0):
        self.groups, self.seed, self.epoch = groups, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return sum(len(g) for g in self.groups)

    def __iter__(self):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        for g in torch.randperm(len(self.groups), generator=gen).tolist():
            yield from self.groups[g]
