"""HTML views of preference pairs for notebooks: pure functions from rows to HTML strings.

`render_pair` shows the shared prefix once (collapsed, and truncated in the middle when
long), then the chosen and rejected completions side by side. Each completion starts at
the branch point (marked), every token is coloured by its role (prompt/system, assistant,
observation, skill return) and the tokens DPO trains on are highlighted: the loss window
for `window_n` turns, built by the trainer's own `loss_mask` from each token's role and
turn (pair rows store no mask, so the view cannot disagree with what is trained). Tokens are decoded one by one with the
tokenizer when one is given. Without one, a pair whose row carries its messages (every pair the
label stage writes) is shown as those messages, text by role, the assistant turns of the loss
window highlighted (`selskill.train.pairs.window_turns`, the same rule); a row without them as
token ids. The markup is jinja2's (selskill/templates/pair.html.j2), autoescaped: every text,
decoded tokens included, is escaped.

Pair rows carry roles for completion tokens only; pass `prompt_roles` (e.g. from
`prefix_roles(pair, sources)` with the source rollout/fork rows) to colour the prefix too.

Also: `matches` / `filter_pairs` (by kind, label reason, task type), `yield_rows` /
`yield_table` (pair counts by round, kind and reason) and `pairs_table` (a pair listing).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from selskill import templates
from selskill.train.pairs import loss_mask, window_turns

ROLE_CLASSES = {0: "r-prompt", 1: "r-assistant", 2: "r-observation", 3: "r-skill"}
ROLE_LABELS = {0: "prompt/system", 1: "assistant", 2: "observation", 3: "skill return"}
UNKNOWN_ROLE = "r-prefix"
# a message's chat role -> the class of the token role it holds (user messages: the task and observations)
MESSAGE_CLASSES = {
    "system": "r-prompt",
    "user": "r-observation",
    "assistant": "r-assistant",
    "tool": "r-skill",
}
IN_LOSS = "in-loss"
BRANCH_CLASS = "branch-point"


def _macros():
    return templates.macros("pair.html.j2")


def stylesheet() -> str:
    """The views' <style> (render_pair, yield_table and pairs_table include it)."""
    return _macros().style()


# --- tokens -------------------------------------------------------------------------------


def token_texts(ids: Sequence[int], tokenizer=None) -> list[str]:
    """One display string per token: decoded alone with `tokenizer`, else the token id."""
    if tokenizer is None:
        return [str(int(t)) for t in ids]
    out = []
    for t in ids:
        try:
            out.append(tokenizer.decode([int(t)], skip_special_tokens=False))
        except TypeError:  # tokenizers without the keyword
            out.append(tokenizer.decode([int(t)]))
    return out


def _token_spans(
    ids: Sequence[int],
    roles: Sequence[int] | None = None,
    mask: Sequence[int] | None = None,
    turns: Sequence[int] | None = None,
    tokenizer=None,
    start: int = 0,
) -> list[dict]:
    texts = token_texts(ids, tokenizer)
    spans = []
    for i, (tid, text) in enumerate(zip(ids, texts, strict=True)):
        role = None if roles is None else int(roles[i])
        cls = ["tok", ROLE_CLASSES.get(role, UNKNOWN_ROLE)]
        if mask is not None and int(mask[i]) == 1:
            cls.append(IN_LOSS)
        title = f"#{start + i} id={int(tid)} role={ROLE_LABELS.get(role, 'prefix')}"
        if turns is not None:
            title += f" turn={int(turns[i])}"
        if mask is not None:
            title += f" loss={int(mask[i])}"
        spans.append({"cls": " ".join(cls), "i": start + i, "title": title, "text": text})
    return spans


# --- a pair -------------------------------------------------------------------------------


def prefix_roles(pair: Mapping, sources: Mapping[str, Mapping]) -> list[int] | None:
    """Roles of the shared prefix from the chosen side's source row (a rollout or fork row with
    `role` and `token_ids`), or None when the source is unknown or its prefix differs."""
    n = len(pair["prompt_ids"])
    for key in ("chosen_source", "rejected_source"):
        src = sources.get(pair.get(key) or "")
        if src is None:
            continue
        ids, roles = list(src["token_ids"][:n]), list(src["role"][:n])
        if len(roles) == n and ids == list(pair["prompt_ids"]):
            return [int(r) for r in roles]
    return None


def _meta_rows(pair: Mapping, window_n: int | None) -> list[tuple[str, object]]:
    rows = [
        ("pair", pair.get("pair_id")),
        ("kind / reason", f"{pair.get('kind')} / {pair.get('label_reason')}"),
        ("task", f"{pair.get('task_id')} ({pair.get('task_type')}), round {pair.get('round')}"),
    ]
    if pair.get("kind") == "local":
        rows.append(
            (
                "branch",
                f"{pair.get('branch_id')}: pool {pair.get('branch_pool')}, score {pair.get('branch_score', 0):.3f}, "
                f"strategy {pair.get('branch_strategy')}, candidate skill {pair.get('candidate_skill')}",
            )
        )
    n = window_n if pair.get("kind") == "local" else None
    rows.append(("loss window", "all assistant turns" if n is None else f"first {n} assistant turns"))
    return rows


def _prefix(pair: Mapping, tokenizer, prompt_roles, max_prefix_tokens: int) -> dict:
    ids = list(pair["prompt_ids"])
    n = len(ids)
    roles = list(prompt_roles) if prompt_roles is not None and len(prompt_roles) == n else None

    def part(a: int, b: int) -> list[dict]:
        return _token_spans(ids[a:b], None if roles is None else roles[a:b], tokenizer=tokenizer, start=a)

    out = {
        "open": n <= max_prefix_tokens,
        "summary": f"shared prefix: {n} tokens (identical for both sides; shown once)",
    }
    if n <= max_prefix_tokens:
        return out | {"head": part(0, n), "omitted": None, "tail": []}
    head = min(32, max_prefix_tokens // 4)
    tail = max_prefix_tokens - head
    omitted = f" … {n - head - tail} prefix tokens omitted … "
    return out | {"head": part(0, head), "omitted": omitted, "tail": part(n - tail, n)}


def _side_title(pair: Mapping, side: str, mask: Sequence[int]) -> str:
    arm = pair.get(f"{side}_arm") or ""
    ok = "success" if pair.get(f"{side}_success") else "failure"
    steps_label = "steps after the branch" if pair.get("kind") == "local" else "steps"
    return (
        f"{side}{f' — {arm} arm' if arm else ''}: {ok}, {pair.get(f'{side}_steps')} {steps_label}, "
        f"{len(pair[f'{side}_ids'])} tokens, {sum(int(m) for m in mask)} in the loss"
    )


def _side(pair: Mapping, side: str, tokenizer, max_tokens: int | None, window_n: int | None) -> dict:
    ids = list(pair[f"{side}_ids"])
    roles = list(pair[f"{side}_role"])
    turns = list(pair[f"{side}_turn"])
    mask = loss_mask(roles, turns, pair["kind"], window_n).tolist()
    shown = len(ids) if max_tokens is None else min(len(ids), max_tokens)
    start = len(pair["prompt_ids"])
    return {
        "side": side,
        "title": _side_title(pair, side, mask),
        "source": pair.get(f"{side}_source"),
        "prefix_len": start,
        "toks": _token_spans(ids[:shown], roles[:shown], mask[:shown], turns[:shown], tokenizer, start=start),
        "omitted": f" … {len(ids) - shown} more tokens" if shown < len(ids) else None,
    }


# --- a pair as its messages (no tokenizer) ------------------------------------------------

MESSAGE_COLUMNS = ("prompt_messages", "chosen_messages", "rejected_messages")


def has_messages(pair: Mapping) -> bool:
    """Whether the row carries its prompt and both completions as chat messages (JSON)."""
    return all(pair.get(c) for c in MESSAGE_COLUMNS)


def _message_spans(messages: list[dict], window: set[int] | None = None, start: int = 0) -> list[dict]:
    """One entry per message: its role, text and class; `window`: the assistant turns in the loss."""
    out, turn = [], -1
    for i, m in enumerate(messages):
        role = str(m.get("role"))
        cls = ["msg", MESSAGE_CLASSES.get(role, UNKNOWN_ROLE)]
        title = f"message {start + i}: {role}"
        if role == "assistant":
            turn += 1
            title += f", assistant turn {turn}"
            if window is not None:
                trained = turn in window
                cls += [IN_LOSS] if trained else []
                title += f", loss={int(trained)}"
        out.append(
            {"cls": " ".join(cls), "i": start + i, "title": title, "role": role, "text": m.get("content", "")}
        )
    return out


def _message_prefix(pair: Mapping, max_prefix_tokens: int) -> dict:
    messages = json.loads(pair["prompt_messages"])
    n = len(pair["prompt_ids"])
    return {
        "open": n <= max_prefix_tokens,
        "summary": f"shared prefix: {len(messages)} messages, {n} tokens (identical for both sides; shown once)",
        "head": _message_spans(messages),
        "omitted": None,
        "tail": [],
    }


def _message_side(pair: Mapping, side: str, window_n: int | None) -> dict:
    roles, turns = list(pair[f"{side}_role"]), list(pair[f"{side}_turn"])
    mask = loss_mask(roles, turns, pair["kind"], window_n).tolist()
    window = set(window_turns(roles, turns, pair["kind"], window_n))
    start = len(json.loads(pair["prompt_messages"]))
    return {
        "side": side,
        "title": _side_title(pair, side, mask),
        "source": pair.get(f"{side}_source"),
        "prefix_len": len(pair["prompt_ids"]),
        "toks": _message_spans(json.loads(pair[f"{side}_messages"]), window, start),
        "omitted": None,
    }


def _legend_items() -> list[tuple[str, str]]:
    return [(c, ROLE_LABELS[r]) for r, c in ROLE_CLASSES.items()] + [(IN_LOSS, "in the loss mask (trained)")]


def render_pair(
    pair: Mapping,
    tokenizer=None,
    prompt_roles: Sequence[int] | None = None,
    max_prefix_tokens: int = 256,
    max_completion_tokens: int | None = None,
    style: bool = True,
    window_n: int | None = 3,
) -> str:
    """One pair as HTML: metadata, the shared prefix once, chosen | rejected side by side.

    Tokens with `tokenizer`; without one, the row's messages as text where it has them, else token ids.
    `window_n`: the local window to highlight, as the trainer reads it (None = all turns;
    `TrainConfig.window_turns` of the recipe that trains these pairs).
    """
    sides = ("chosen", "rejected")
    if tokenizer is None and has_messages(pair):
        view = {
            "meta": _meta_rows(pair, window_n),
            "legend": _legend_items(),
            "ids": False,
            "messages": True,
            "prefix": _message_prefix(pair, max_prefix_tokens),
            "sides": [_message_side(pair, side, window_n) for side in sides],
        }
        return _macros().pair(view, style)
    view = {
        "meta": _meta_rows(pair, window_n),
        "legend": _legend_items(),
        "ids": tokenizer is None,
        "messages": False,
        "prefix": _prefix(pair, tokenizer, prompt_roles, max_prefix_tokens),
        "sides": [_side(pair, side, tokenizer, max_completion_tokens, window_n) for side in sides],
    }
    return _macros().pair(view, style)


# --- filters and tables -------------------------------------------------------------------


def _allowed(value, wanted) -> bool:
    if wanted is None:
        return True
    if isinstance(wanted, str):
        return value == wanted
    return value in set(wanted)


def matches(pair: Mapping, kind=None, reason=None, task_type=None) -> bool:
    """Whether a pair row passes the filters (each: None = any, a string, or a collection)."""
    return (
        _allowed(pair.get("kind"), kind)
        and _allowed(pair.get("label_reason"), reason)
        and _allowed(pair.get("task_type"), task_type)
    )


def filter_pairs(pairs: Iterable[Mapping], kind=None, reason=None, task_type=None) -> list:
    return [p for p in pairs if matches(p, kind, reason, task_type)]


def html_table(headers: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A table of escaped cells (None shows as empty)."""
    return _macros().table(headers, rows)


def _mean(xs: list) -> float | None:
    return sum(xs) / len(xs) if xs else None


def yield_rows(pairs: Iterable[Mapping], n_tasks: Mapping[int, int] | int | None = None) -> list[dict]:
    """Pairs per (round, kind, label_reason): count, pairs/task (when the number of sampled
    tasks is known: an int, or a {round: tasks} map), invoke-preferred share (local pairs) and
    mean chosen / rejected agent steps."""
    groups = defaultdict(list)
    for p in pairs:
        groups[(int(p.get("round", 0)), p.get("kind"), p.get("label_reason"))].append(p)
    out = []
    for (rnd, kind, reason), ps in sorted(
        groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1]), str(kv[0][2]))
    ):
        tasks = n_tasks.get(rnd) if isinstance(n_tasks, Mapping) else n_tasks
        local = [p for p in ps if p.get("kind") == "local"]
        out.append(
            {
                "round": rnd,
                "kind": kind,
                "label_reason": reason,
                "pairs": len(ps),
                "pairs_per_task": round(len(ps) / tasks, 3) if tasks else None,
                "invoke_preferred_share": (
                    round(sum(p.get("chosen_arm") == "invoke" for p in local) / len(local), 3)
                    if local
                    else None
                ),
                "mean_chosen_steps": _mean([p["chosen_steps"] for p in ps]),
                "mean_rejected_steps": _mean([p["rejected_steps"] for p in ps]),
            }
        )
    return out


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def yield_table(pairs: Iterable[Mapping], n_tasks: Mapping[int, int] | int | None = None) -> str:
    rows = yield_rows(pairs, n_tasks)
    headers = [
        "round",
        "kind",
        "reason",
        "pairs",
        "pairs/task",
        "invoke-preferred",
        "chosen steps (mean)",
        "rejected steps (mean)",
    ]
    body = [
        [
            r["round"],
            r["kind"],
            r["label_reason"],
            r["pairs"],
            _fmt(r["pairs_per_task"]),
            _fmt(r["invoke_preferred_share"]),
            _fmt(r["mean_chosen_steps"]),
            _fmt(r["mean_rejected_steps"]),
        ]
        for r in rows
    ]
    if rows:
        body.append(["all", "", "", sum(r["pairs"] for r in rows), "", "", "", ""])
    return stylesheet() + html_table(headers, body)


def pairs_table(pairs: Iterable[Mapping], limit: int = 20) -> str:
    """A listing of pairs (index, id, kind, reason, task type, arms, steps) to pick one to render."""
    headers = ["#", "pair_id", "kind", "reason", "task_type", "chosen", "rejected", "steps (chosen/rejected)"]
    body = []
    for i, p in enumerate(pairs):
        if i >= limit:
            break
        body.append(
            [
                i,
                p.get("pair_id"),
                p.get("kind"),
                p.get("label_reason"),
                p.get("task_type"),
                p.get("chosen_arm") or "episode",
                p.get("rejected_arm") or "episode",
                f"{p.get('chosen_steps')}/{p.get('rejected_steps')}",
            ]
        )
    return stylesheet() + html_table(headers, body)
