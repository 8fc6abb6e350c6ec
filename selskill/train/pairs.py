"""Pair rows (PAIR_SCHEMA) -> token rows the DPO trainer consumes.

This module is the one owner of the loss window: pair rows carry no mask, only each
completion token's role and turn-from-branch, and the mask is built here, so one set of
shards serves any window n:

- episode pairs train every assistant token of both trajectories;
- local pairs train the assistant tokens of the first n assistant turns after the branch
  (turn 0 = the branch turn; n = None means every assistant turn, `train_window_n: all`);
- observation (role 2) and skill-return (role 3) tokens are never trained.

Then the max_length policy fits each pair without ever cutting its trained window: tokens
after the last trained token are dropped (they carry no loss and cannot influence earlier
tokens), and if the pair is still too long the oldest prompt messages after the first
`keep_head_messages` (system message, task) are dropped. Pairs that still do not fit are
counted and skipped (or raise), never trained on a silently truncated window.

It is also the one place that selects and mixes pairs (kind, branch pool, local share,
cap): label writes every pair it finds, so that the replication's ablations can reuse one
label stage with different train_* keys.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from selskill.data.schema import PAIR_KINDS, ROLE_ASSISTANT

KIND_IDS = {kind: i for i, kind in enumerate(PAIR_KINDS)}  # episode 0, local 1
TOKEN_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids", "chosen_loss_mask", "rejected_loss_mask")


def loss_mask(role: Sequence[int], turn: Sequence[int], kind: str, n: int | None) -> np.ndarray:
    """1 on the completion tokens DPO trains, 0 elsewhere (int8, one entry per token)."""
    role = np.asarray(role, dtype=np.int64)
    turn = np.asarray(turn, dtype=np.int64)
    if role.shape != turn.shape:
        raise ValueError(f"role and turn must have one entry per token; got {role.shape} and {turn.shape}")
    if n is not None and n < 1:
        raise ValueError(f"window n must be >= 1 or None (every assistant turn); got {n!r}")
    mask = role == ROLE_ASSISTANT
    if kind == "local":
        mask &= turn >= 0
        if n is not None:
            mask &= turn < n
    elif kind != "episode":
        raise ValueError(f"unknown pair kind {kind!r}; expected one of {', '.join(PAIR_KINDS)}")
    return mask.astype(np.int8)


def window_turns(role: Sequence[int], turn: Sequence[int], kind: str, n: int | None) -> list[int]:
    """The completion's assistant turns that DPO trains (those holding a loss-window token): the window in
    message terms, for readers of a pair's messages rather than its tokens."""
    mask = loss_mask(role, turn, kind, n).astype(bool)
    return sorted({int(t) for t in np.asarray(turn)[mask]})


@dataclass(frozen=True)
class FitPolicy:
    """How a pair is fitted into `max_length` tokens per sequence (prompt + completion)."""

    max_length: int | None = None
    keep_head_messages: int = 2
    message_start_id: int | None = None  # token opening each chat message; None = no message boundaries known
    trim_after_window: bool = True


@dataclass
class FittedPair:
    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    chosen_loss_mask: list[int]
    rejected_loss_mask: list[int]
    prompt_tokens_dropped: int = 0
    tail_tokens_trimmed: int = 0


def _last_one(mask: np.ndarray) -> int:
    idx = np.flatnonzero(mask)
    return int(idx[-1]) if idx.size else -1


def fit_pair(
    prompt: Sequence[int],
    chosen: Sequence[int],
    rejected: Sequence[int],
    chosen_mask: np.ndarray,
    rejected_mask: np.ndarray,
    policy: FitPolicy,
) -> FittedPair | str:
    """The pair fitted to the policy, or the reason it cannot be trained ('empty_window' | 'too_long')."""
    chosen_mask = np.asarray(chosen_mask, dtype=np.int8)
    rejected_mask = np.asarray(rejected_mask, dtype=np.int8)
    last_c, last_r = _last_one(chosen_mask), _last_one(rejected_mask)
    if last_c < 0 or last_r < 0:
        return "empty_window"
    chosen, rejected = list(chosen), list(rejected)
    trimmed = 0
    if policy.trim_after_window:
        trimmed = (len(chosen) - last_c - 1) + (len(rejected) - last_r - 1)
        chosen, chosen_mask = chosen[: last_c + 1], chosen_mask[: last_c + 1]
        rejected, rejected_mask = rejected[: last_r + 1], rejected_mask[: last_r + 1]
    prompt = list(prompt)
    dropped = 0
    if policy.max_length is not None:
        excess = len(prompt) + max(len(chosen), len(rejected)) - policy.max_length
        if excess > 0:
            starts = (
                [i for i, t in enumerate(prompt) if t == policy.message_start_id]
                if policy.message_start_id is not None
                else []
            )
            keep = policy.keep_head_messages
            head_end = 0 if keep == 0 else (starts[keep] if keep < len(starts) else len(prompt))
            cut = head_end + excess
            if cut > len(prompt):
                return "too_long"
            # Start the kept context at a message boundary where one follows the cut.
            boundary = next((s for s in starts if s >= cut), None)
            if boundary is not None:
                cut = boundary
            dropped = cut - head_end
            prompt = prompt[:head_end] + prompt[cut:]
    return FittedPair(
        prompt_ids=prompt,
        chosen_ids=chosen,
        rejected_ids=rejected,
        chosen_loss_mask=[int(x) for x in chosen_mask],
        rejected_loss_mask=[int(x) for x in rejected_mask],
        prompt_tokens_dropped=dropped,
        tail_tokens_trimmed=trimmed,
    )


@dataclass
class PairStats:
    """What happened to every pair read, by kind; written to train/pairs_stats.json and logged."""

    window_n: str = "3"
    max_length: int | None = None
    read: Counter = field(default_factory=Counter)
    not_selected: Counter = field(default_factory=Counter)
    other_pool: Counter = field(default_factory=Counter)
    other_reason: Counter = field(default_factory=Counter)
    empty_window: Counter = field(default_factory=Counter)
    too_long: Counter = field(default_factory=Counter)
    dropped_by_mix: Counter = field(default_factory=Counter)
    dropped_by_cap: Counter = field(default_factory=Counter)
    prompt_truncated: Counter = field(default_factory=Counter)
    trained: Counter = field(default_factory=Counter)
    # where the gradient goes: loss-window tokens (chosen + rejected) of the trained pairs, by kind
    trained_tokens: Counter = field(default_factory=Counter)
    prompt_tokens_dropped: int = 0
    tail_tokens_trimmed: int = 0
    too_long_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        out = {}
        for name, value in self.__dict__.items():
            out[name] = dict(sorted(value.items())) if isinstance(value, Counter) else value
        out["too_long_ids"] = self.too_long_ids[:100]
        return out

    def report(self) -> str:
        def fmt(c: Counter) -> str:
            parts = ", ".join(f"{k} {c[k]}" for k in PAIR_KINDS if c[k])
            return f"{sum(c.values())}" + (f" ({parts})" if parts else "")

        lines = [
            f"pairs: read {fmt(self.read)}; trained {fmt(self.trained)} "
            f"[window n={self.window_n}, max_length={self.max_length}]"
        ]
        # (counts, the words before them, the words after): a line for each that counted anything
        notes = [
            (self.trained_tokens, "loss-window tokens (chosen + rejected): ", ""),
            (self.not_selected, "not selected by train_pair_kinds: ", ""),
            (self.other_pool, "local pairs of another branch pool (train_branch_pools): ", ""),
            (self.other_reason, "local pairs of another label reason (train_local_reasons): ", ""),
            (self.dropped_by_mix, "left out by train_local_fraction: ", ""),
            (self.dropped_by_cap, "left out by train_max_pairs: ", ""),
            (
                self.prompt_truncated,
                "oldest prompt messages dropped to fit max_length: ",
                f" pairs, {self.prompt_tokens_dropped} tokens",
            ),
            (
                self.too_long,
                "SKIPPED ",
                f" pairs that do not fit max_length={self.max_length} even with every droppable prompt message "
                f"removed (raise max_length or lower train_keep_head_messages); e.g. {', '.join(self.too_long_ids[:3])}",
            ),
            (self.empty_window, "skipped ", " pairs with no trainable token on one side"),
        ]
        lines += [
            f"  {before}{fmt(counts)}{after}" for counts, before, after in notes if sum(counts.values())
        ]
        return "\n".join(lines)


def _mix(kinds: list[str], local_fraction: float, seed: int) -> np.ndarray:
    """Indices kept so that local pairs make up `local_fraction` of the result (downsampling only)."""
    kinds_arr = np.asarray(kinds)
    local = np.flatnonzero(kinds_arr == "local")
    episode = np.flatnonzero(kinds_arr == "episode")
    if local_fraction < 0 or not local.size or not episode.size:
        return np.arange(len(kinds))
    rng = np.random.default_rng(seed)
    if local.size / (local.size + episode.size) > local_fraction:
        target = round(episode.size * local_fraction / (1 - local_fraction))
        local = np.sort(rng.choice(local, size=max(1, min(target, local.size)), replace=False))
    else:
        target = round(local.size * (1 - local_fraction) / local_fraction)
        episode = np.sort(rng.choice(episode, size=max(1, min(target, episode.size)), replace=False))
    return np.sort(np.concatenate([local, episode]))


def build_examples(
    table: pa.Table,
    kinds: Sequence[str] = PAIR_KINDS,
    n: int | None = 3,
    policy: FitPolicy | None = None,
    local_fraction: float = -1.0,
    seed: int = 0,
    overflow: str = "skip",
    branch_pools: str = "all",
    max_pairs: int = 0,
    local_reasons: str = "all",
) -> tuple[list[dict], PairStats]:
    """Token rows (TOKEN_COLUMNS + pair_id + kind) for the pairs in `table`, and what happened to each.

    Filters in order: kind, branch pool and label reason (local pairs), fit to max_length, kind mix, then a
    seeded cap of `max_pairs` (0 = none) that keeps the kind proportions of what is left.
    """
    policy = policy or FitPolicy()
    stats = PairStats(window_n="all" if n is None else str(n), max_length=policy.max_length)
    columns = [
        "pair_id",
        "kind",
        "branch_pool",
        "label_reason",
        "prompt_ids",
        "chosen_ids",
        "rejected_ids",
        "chosen_role",
        "rejected_role",
        "chosen_turn",
        "rejected_turn",
    ]
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(
            f"pair table lacks columns {missing}: it is not PAIR_SCHEMA data (rerun the label stage)"
        )
    fitted: list[dict] = []
    for row in table.select(columns).to_pylist():
        kind = row["kind"]
        if kind not in KIND_IDS:
            raise ValueError(
                f"pair {row['pair_id']}: unknown kind {kind!r}; expected one of {', '.join(PAIR_KINDS)}"
            )
        stats.read[kind] += 1
        if _selected(row, kinds, branch_pools, local_reasons, stats):
            example = _fit_row(row, n, policy, overflow, stats)
            if example is not None:
                fitted.append(example)
    examples = [fitted[i] for i in _mix_and_cap(fitted, local_fraction, max_pairs, seed, stats)]
    for r in examples:
        stats.trained[r["kind"]] += 1
        stats.trained_tokens[r["kind"]] += int(sum(r["chosen_loss_mask"])) + int(sum(r["rejected_loss_mask"]))
    return examples, stats


def _selected(
    row: dict, kinds: Sequence[str], branch_pools: str, local_reasons: str, stats: PairStats
) -> bool:
    """Whether the recipe trains on pairs of this row's kind (and local pool and reason), counting the others."""
    kind = row["kind"]
    if kind not in kinds:
        stats.not_selected[kind] += 1
        return False
    if kind == "local" and branch_pools != "all" and row["branch_pool"] != branch_pools:
        stats.other_pool[kind] += 1
        return False
    if kind == "local" and local_reasons != "all" and row["label_reason"] != local_reasons:
        stats.other_reason[kind] += 1
        return False
    return True


def _fit_row(row: dict, n: int | None, policy: FitPolicy, overflow: str, stats: PairStats) -> dict | None:
    """The pair's token row fitted to max_length with its loss masks; None (counted) when it cannot train."""
    kind = row["kind"]
    cmask = loss_mask(row["chosen_role"], row["chosen_turn"], kind, n)
    rmask = loss_mask(row["rejected_role"], row["rejected_turn"], kind, n)
    out = fit_pair(row["prompt_ids"], row["chosen_ids"], row["rejected_ids"], cmask, rmask, policy)
    if out == "empty_window":
        stats.empty_window[kind] += 1
        return None
    if out == "too_long":
        if overflow == "error":
            longest = len(row["prompt_ids"]) + max(len(row["chosen_ids"]), len(row["rejected_ids"]))
            raise ValueError(
                f"pair {row['pair_id']} ({kind}, {longest} tokens) does not fit max_length={policy.max_length} "
                f"even after dropping every prompt message after the first {policy.keep_head_messages}: raise "
                f"max_length, lower train_keep_head_messages, or set train_overflow: skip to count and skip such pairs"
            )
        stats.too_long[kind] += 1
        stats.too_long_ids.append(row["pair_id"])
        return None
    if out.prompt_tokens_dropped:
        stats.prompt_truncated[kind] += 1
        stats.prompt_tokens_dropped += out.prompt_tokens_dropped
    stats.tail_tokens_trimmed += out.tail_tokens_trimmed
    return {
        "pair_id": row["pair_id"],
        "kind": kind,
        "prompt_ids": out.prompt_ids,
        "chosen_ids": out.chosen_ids,
        "rejected_ids": out.rejected_ids,
        "chosen_loss_mask": out.chosen_loss_mask,
        "rejected_loss_mask": out.rejected_loss_mask,
    }


def _mix_and_cap(fitted: list[dict], local_fraction: float, max_pairs: int, seed: int, stats: PairStats):
    """Indices of `fitted` kept by the kind mix, then by the seeded `max_pairs` cap (counting what each left out)."""
    keep = _mix([r["kind"] for r in fitted], local_fraction, seed)
    kept = set(keep.tolist())
    for i, r in enumerate(fitted):
        if i not in kept:
            stats.dropped_by_mix[r["kind"]] += 1
    if 0 < max_pairs < len(keep):
        capped = np.sort(np.random.default_rng([seed, 1]).choice(keep, size=max_pairs, replace=False))
        for i in sorted(kept - set(capped.tolist())):
            stats.dropped_by_cap[fitted[i]["kind"]] += 1
        keep = capped
    return keep


def examples_to_dataset(examples: list[dict]):
    """A `datasets.Dataset` with compact column types (int32 ids, int8 masks)."""
    from datasets import Dataset, Features, Sequence, Value

    features = Features(
        {
            "pair_id": Value("string"),
            "kind": Value("string"),
            "prompt_ids": Sequence(Value("int32")),
            "chosen_ids": Sequence(Value("int32")),
            "rejected_ids": Sequence(Value("int32")),
            "chosen_loss_mask": Sequence(Value("int8")),
            "rejected_loss_mask": Sequence(Value("int8")),
        }
    )
    data = {name: [r[name] for r in examples] for name in features}
    return Dataset.from_dict(data, features=features)


def fit_policy_from_config(cfg, tokenizer=None) -> FitPolicy:
    """FitPolicy from a TrainConfig; the message-start id comes from the tokenizer when given."""
    start_id = None
    if tokenizer is not None and cfg.train_message_start_token:
        tid = tokenizer.convert_tokens_to_ids(cfg.train_message_start_token)
        unk = getattr(tokenizer, "unk_token_id", None)
        start_id = tid if isinstance(tid, int) and tid != unk else None
    return FitPolicy(
        max_length=cfg.max_length,
        keep_head_messages=cfg.train_keep_head_messages,
        message_start_id=start_id,
        trim_after_window=cfg.train_trim_after_window,
    )


def build_from_config(table: pa.Table, cfg, tokenizer=None) -> tuple[list[dict], PairStats]:
    """build_examples with every knob taken from a TrainConfig."""
    # build_examples' filters are the `train_<name>` keys of the same names
    filters = ("local_fraction", "overflow", "branch_pools", "local_reasons", "max_pairs")
    return build_examples(
        table,
        kinds=cfg.kinds,
        n=cfg.window_turns,
        policy=fit_policy_from_config(cfg, tokenizer),
        seed=cfg.seed,
        **{name: getattr(cfg, f"train_{name}") for name in filters},
    )
