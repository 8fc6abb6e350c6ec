"""Shared-prefix DPO: a branch point's history is computed once for all the pairs that share it.

A local pair's prompt is the whole episode up to the branch point, and its trained window is a
few turns after it (selskill.train.pairs trims the rest), so most of a pair is prompt. The
unpacked trainer runs that prompt twice per pair (chosen and rejected row) and twice more for
the reference. Here a batch is laid out as prefix trees instead, side by side in one row (no
padding):

    [prompt[:-1]] [prompt[-1] + continuation 1] [prompt[-1] + continuation 2] ... [next tree] ...

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
forward: given packed tensors it runs the packed row, hands only the trained positions to the
LM head (a tree is mostly prompt, whose positions predict nothing), and scatters the per-token
outputs back to the unpacked (2 x pairs, length - 1) layout, so log-prob sums, the sft term,
reference log-probs (on the fly or precomputed), per-kind metrics, DDP and ZeRO see what they
saw before.

The attention mask reaches the model in the form its attention implementation takes
(transformers hands a 4D mask to the attention function untouched):
- `sdpa` (transformers' default) is switched to `TREE_SDPA`, SDPA called per tree segment
  (prefix with `is_causal`, each continuation against prefix + itself). A dense 4D mask
  through one SDPA call is exact too, but computes every masked-out score: on a CPU it makes
  the packed attention as slow as the unpacked one. Per segment it does only the needed part.
- `eager`: a dense additive 4D mask over the whole row (memory grows with its square).
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
ATTENTIONS = (TREE_SDPA, "sdpa", "eager", "flex_attention")  # the ones a prefix-tree mask reaches
PACKED_KEYS = (
    "packed_input_ids",
    "packed_position_ids",
    "packed_trees",
    "packed_segments",
    "packed_labels",
    "packed_index",
)
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
    examples: Sequence[dict[str, Any]], mode: str, unpacked_length: int
) -> dict[str, torch.Tensor]:
    """The packed tensors (`PACKED_KEYS`) for pair rows that MaskedPreferenceCollator lays out unpacked.

    The trees sit side by side in one row of shape (1, tokens), so a batch of trees of different
    lengths needs no padding: `packed_trees` numbers each token's tree, `packed_segments` is 0 on
    its tree's prefix and k on its k-th continuation. `unpacked_length` is the unpacked batch's
    padded length: `packed_index` maps each position of the unpacked (2 x pairs, length - 1)
    per-token outputs (chosen rows first) to the packed position that predicts the same token,
    counted among the labelled packed positions (the only ones the LM head scores), or -1 where
    nothing is trained.
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

    ids, pos, tree_ids, seg, lab = [], [], [], [], []
    starts = []  # per tree, where each continuation starts in the row
    for t, tree in enumerate(trees):
        p = len(tree.prompt)
        lead = 1 if p else 0  # the prompt's last token, repeated at the head of every continuation
        ids += tree.prompt[: p - lead]
        pos += range(p - lead)
        seg += [0] * (p - lead)
        lab += [IGNORE] * (p - lead)
        starts.append([])
        for k, (cont, mask) in enumerate(tree.continuations, start=1):
            starts[t].append(len(ids))
            toks = tree.prompt[p - lead :] + cont
            ids += toks
            pos += range(p - lead, p - lead + len(toks))
            seg += [k] * len(toks)
            # position i predicts toks[i + 1]: completion token j = i + 1 - lead
            lab += [cont[j] if mask[j] else IGNORE for j in range(1 - lead, len(cont))] + [IGNORE]
        tree_ids += [t] * (len(ids) - len(tree_ids))
    packed = [torch.tensor([x], dtype=torch.long) for x in (ids, pos, tree_ids, seg, lab)]
    # the LM head scores only the labelled positions, in order: a position's rank among them
    rank = ((packed[4][0] != IGNORE).cumsum(0) - 1).tolist()
    index = torch.full((len(sides), unpacked_length - 1), -1, dtype=torch.long)
    for row, (t, c) in enumerate(sides):
        p = len(trees[t].prompt)
        lead = 1 if p else 0
        _, mask = trees[t].continuations[c]
        for j, m in enumerate(mask):
            if m and p + j >= 1:
                # unpacked position p + j - 1 predicts completion token j; packed: start + lead + j - 1
                index[row, p + j - 1] = rank[starts[t][c] + lead + j - 1]
    return dict(zip(PACKED_KEYS, [*packed, index], strict=True))


def packed_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens a packed batch runs through the model (there is no padding)."""
    return int(batch["packed_input_ids"].numel())


@dataclass
class TreeLayout:
    """Each tree's prefix [start, end) and its continuations' [start, end), as Python ints.

    Read once per forward (one device sync) and handed to every layer's attention call; the
    continuation masks are built once per shape and reused by every layer.
    """

    trees: list[tuple[int, int, list[tuple[int, int]]]]
    _masks: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, trees: torch.Tensor, segments: torch.Tensor) -> TreeLayout:
        out: list[tuple[int, int, list[tuple[int, int]]]] = []
        tree, seg = trees[0].tolist(), segments[0].tolist()
        start = 0
        for i in range(1, len(seg) + 1):
            if i == len(seg) or (tree[i], seg[i]) != (tree[start], seg[start]):
                if seg[start] == 0:
                    out.append((start, i, []))
                elif out and tree[start] == tree[out[-1][0]]:
                    out[-1][2].append((start, i))
                else:  # a tree without prefix (a one-token prompt)
                    out.append((start, start, [(start, i)]))
                start = i
        return cls(out)

    def continuation_mask(self, prefix: int, n: int, device) -> torch.Tensor:
        """(n, prefix + n) bool: every prefix token, then causal within the continuation."""
        key = (prefix, n, str(device))
        if key not in self._masks:
            mask = torch.ones(n, prefix + n, dtype=torch.bool, device=device)
            mask[:, prefix:] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
            self._masks[key] = mask
        return self._masks[key]


def _allowed(trees: torch.Tensor, segments: torch.Tensor, q, kv):
    """Whether position q attends to position kv: same tree, causal, and kv in the prefix or q's segment."""
    return (
        (trees[0, q] == trees[0, kv])
        & (kv <= q)
        & ((segments[0, kv] == 0) | (segments[0, kv] == segments[0, q]))
    )


def dense_mask(trees: torch.Tensor, segments: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(1, 1, N, N) additive mask of the prefix trees (its size grows with the square of the row)."""
    n = segments.shape[1]
    pos = torch.arange(n, device=segments.device)
    allowed = _allowed(trees, segments, pos[:, None], pos[None, :])
    mask = torch.zeros(allowed.shape, dtype=dtype, device=segments.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def block_mask(trees: torch.Tensor, segments: torch.Tensor):
    """The same trees as a FlexAttention BlockMask (its blocks outside the trees are never computed)."""
    from torch.nn.attention.flex_attention import create_block_mask

    n = segments.shape[1]
    return create_block_mask(
        lambda b, h, q, kv: _allowed(trees, segments, q, kv), 1, None, n, n, device=segments.device
    )


# --- the attention ------------------------------------------------------------------------------------------


def _tree_sdpa(module, query, key, value, attention_mask, prefix_tree=None, **kwargs):
    """transformers' sdpa attention; on a packed row (`prefix_tree` given), SDPA per tree segment."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if prefix_tree is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    groups = query.shape[1] // key.shape[1]
    native_gqa = _native_gqa(query.device)
    if groups > 1 and not native_gqa:
        # as transformers does under a mask: torch's memory-efficient kernel takes a mask but not
        # grouped K/V, and the math fallback would keep every score for the backward
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    sdpa = functools.partial(
        torch.nn.functional.scaled_dot_product_attention,
        dropout_p=kwargs.get("dropout", 0.0),
        scale=kwargs.get("scaling"),
        enable_gqa=native_gqa and groups > 1,  # on a CPU without copying K/V (selskill.policy.hf does too)
    )
    out = []
    for a, b, spans in prefix_tree.trees:
        if b > a:
            out.append(sdpa(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True))
        for start, end in spans:
            if b > a:
                kk = torch.cat([key[:, :, a:b], key[:, :, start:end]], dim=2)
                vv = torch.cat([value[:, :, a:b], value[:, :, start:end]], dim=2)
                mask = prefix_tree.continuation_mask(b - a, end - start, query.device)
                out.append(sdpa(query[:, :, start:end], kk, vv, attn_mask=mask))
            else:
                q, k, v = (x[:, :, start:end] for x in (query, key, value))
                out.append(sdpa(q, k, v, is_causal=True))
    return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None


def _native_gqa(device: torch.device) -> bool:
    return device.type == "cpu"


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
        packed_trees=None,
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
            kwargs["prefix_tree"] = TreeLayout.of(packed_trees, packed_segments)
        elif impl == "flex_attention":
            mask = block_mask(packed_trees, packed_segments)
        else:
            mask = dense_mask(packed_trees, packed_segments, self.dtype)
        keep = (packed_labels != IGNORE).reshape(-1).nonzero().squeeze(1)
        out = inner(
            input_ids=packed_input_ids,
            position_ids=packed_position_ids,
            attention_mask=mask,
            shift_labels=packed_labels.reshape(-1)[keep][None],
            fused_lm_head=True,
            prefix_tree_keep=keep,
            **kwargs,
        )
        return unpack(out, packed_index)

    model.forward = types.MethodType(forward, model)
    model.base_model.register_forward_hook(_keep_labelled, with_kwargs=True)
    model._prefix_tree_forward = True


def _keep_labelled(module, args, kwargs, output):
    """The backbone's output cut to the labelled positions of a packed batch.

    TRL's fused head scores every position where Triton is unavailable (the CPU); a packed row
    is mostly prompt, whose positions predict nothing, so the head would spend most of its work
    there. The trees are run whole; only what reaches the head is cut.
    """
    keep = kwargs.get("prefix_tree_keep")
    if keep is not None:
        hidden = output.last_hidden_state
        output.last_hidden_state = hidden.reshape(-1, hidden.shape[-1])[keep][None]
    return output


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
