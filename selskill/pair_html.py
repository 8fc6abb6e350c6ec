"""HTML views of preference pairs for notebooks: pure functions from rows to HTML strings.

`render_pair` shows the shared prefix once (collapsed, and truncated in the middle when
long), then the chosen and rejected completions side by side. Each completion starts at
the branch point (marked), every token is coloured by its role (prompt/system, assistant,
observation, skill return) and the tokens DPO trains on are highlighted: the loss window
for `window_n` turns, built by the trainer's own `loss_mask` from each token's role and
turn (pair rows store no mask, so the view cannot disagree with what is trained). Tokens are decoded one by one with the
tokenizer when one is given, else shown as token ids. All text is escaped.

Pair rows carry roles for completion tokens only; pass `prompt_roles` (e.g. from
`prefix_roles(pair, sources)` with the source rollout/fork rows) to colour the prefix too.

Also: `matches` / `filter_pairs` (by kind, label reason, task type), `yield_rows` /
`yield_table` (pair counts by round, kind and reason) and `pairs_table` (a pair listing).
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from selskill.train.pairs import loss_mask

ROLE_CLASSES = {0: "r-prompt", 1: "r-assistant", 2: "r-observation", 3: "r-skill"}
ROLE_LABELS = {0: "prompt/system", 1: "assistant", 2: "observation", 3: "skill return"}
UNKNOWN_ROLE = "r-prefix"
IN_LOSS = "in-loss"
BRANCH_CLASS = "branch-point"

STYLE = """<style>
.selskill-pair{font-family:system-ui,sans-serif;font-size:13px;line-height:1.5}
.selskill-pair .meta td{padding:1px 8px 1px 0;vertical-align:top}
.selskill-pair .toks{font-family:ui-monospace,monospace;white-space:pre-wrap;word-break:break-word;
  border:1px solid #ddd;padding:6px;border-radius:4px;max-height:40em;overflow:auto}
.selskill-pair .ids .tok{margin-right:.35em}
.selskill-pair .sides{display:grid;grid-template-columns:1fr 1fr;gap:10px}
.selskill-pair .side h4{margin:6px 0}
.selskill-pair .chosen h4{color:#17650b}.selskill-pair .rejected h4{color:#9b1c1c}
.selskill-pair .tok{border-radius:2px}
.selskill-pair .r-prompt{background:#eeeeee;color:#555}
.selskill-pair .r-prefix{background:#f4f4f4;color:#555}
.selskill-pair .r-assistant{background:#dbeafe;color:#1e3a8a}
.selskill-pair .r-observation{background:#fef3c7;color:#78350f}
.selskill-pair .r-skill{background:#ede9fe;color:#5b21b6}
.selskill-pair .in-loss{background:#86efac;color:#052e16;outline:1px solid #16a34a}
.selskill-pair .branch-point,.selskill-pair .branch-key{display:inline-block;background:#dc2626;color:#fff;font-weight:bold;
  padding:0 4px;margin:0 3px;border-radius:3px}
.selskill-pair .omitted{color:#888;font-style:italic}
.selskill-pair .legend span{margin-right:8px;padding:0 4px}
.selskill-table{border-collapse:collapse;font-size:13px}
.selskill-table th,.selskill-table td{border:1px solid #ccc;padding:2px 8px;text-align:left}
.selskill-table th{background:#f3f3f3}
</style>"""


def esc(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


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


def render_tokens(
    ids: Sequence[int],
    roles: Sequence[int] | None = None,
    mask: Sequence[int] | None = None,
    turns: Sequence[int] | None = None,
    tokenizer=None,
    start: int = 0,
) -> str:
    """One <span class="tok ..."> per token: role class, plus `in-loss` where mask == 1."""
    texts = token_texts(ids, tokenizer)
    parts = []
    for i, (tid, text) in enumerate(zip(ids, texts, strict=True)):
        role = None if roles is None else int(roles[i])
        cls = ["tok", ROLE_CLASSES.get(role, UNKNOWN_ROLE)]
        in_loss = mask is not None and int(mask[i]) == 1
        if in_loss:
            cls.append(IN_LOSS)
        title = f"#{start + i} id={int(tid)} role={ROLE_LABELS.get(role, 'prefix')}"
        if turns is not None:
            title += f" turn={int(turns[i])}"
        if mask is not None:
            title += f" loss={int(mask[i])}"
        parts.append(
            f'<span class="{" ".join(cls)}" data-i="{start + i}" title="{esc(title)}">{esc(text)}</span>'
        )
    return "".join(parts)


def _toks_div(body: str, tokenizer) -> str:
    return f'<div class="toks{"" if tokenizer is not None else " ids"}">{body}</div>'


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


def _meta_table(pair: Mapping, window_n: int | None) -> str:
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
    body = "".join(f"<tr><td><b>{esc(k)}</b></td><td>{esc(v)}</td></tr>" for k, v in rows)
    return f'<table class="meta">{body}</table>'


def _prefix_html(pair: Mapping, tokenizer, prompt_roles, max_prefix_tokens: int) -> str:
    ids = list(pair["prompt_ids"])
    n = len(ids)
    roles = list(prompt_roles) if prompt_roles is not None and len(prompt_roles) == n else None

    def part(a: int, b: int) -> str:
        return render_tokens(ids[a:b], None if roles is None else roles[a:b], tokenizer=tokenizer, start=a)

    if n > max_prefix_tokens:
        head = min(32, max_prefix_tokens // 4)
        tail = max_prefix_tokens - head
        body = (
            part(0, head)
            + f'<span class="omitted"> … {n - head - tail} prefix tokens omitted … </span>'
            + part(n - tail, n)
        )
    else:
        body = part(0, n)
    is_open = "" if n > max_prefix_tokens else " open"
    summary = f"shared prefix: {n} tokens (identical for both sides; shown once)"
    return f'<details class="prefix"{is_open}><summary>{esc(summary)}</summary>{_toks_div(body, tokenizer)}</details>'


def _side_html(pair: Mapping, side: str, tokenizer, max_tokens: int | None, window_n: int | None) -> str:
    ids = list(pair[f"{side}_ids"])
    roles = list(pair[f"{side}_role"])
    turns = list(pair[f"{side}_turn"])
    mask = loss_mask(roles, turns, pair["kind"], window_n).tolist()
    shown = len(ids) if max_tokens is None else min(len(ids), max_tokens)
    arm = pair.get(f"{side}_arm") or ""
    ok = "success" if pair.get(f"{side}_success") else "failure"
    steps_label = "steps after the branch" if pair.get("kind") == "local" else "steps"
    title = (
        f"{side}{f' — {arm} arm' if arm else ''}: {ok}, {pair.get(f'{side}_steps')} {steps_label}, "
        f"{len(ids)} tokens, {sum(int(m) for m in mask)} in the loss"
    )
    marker = (
        f'<span class="{BRANCH_CLASS}" title="branch point: the completion starts here '
        f'(prefix length {len(pair["prompt_ids"])})">⑂ branch</span>'
    )
    body = marker + render_tokens(
        ids[:shown], roles[:shown], mask[:shown], turns[:shown], tokenizer, start=len(pair["prompt_ids"])
    )
    if shown < len(ids):
        body += f'<span class="omitted"> … {len(ids) - shown} more tokens</span>'
    src = pair.get(f"{side}_source")
    return (
        f'<div class="side {side}"><h4>{esc(title)}</h4>'
        f'<div style="color:#666">source: {esc(src)}</div>{_toks_div(body, tokenizer)}</div>'
    )


def legend() -> str:
    items = [(c, ROLE_LABELS[r]) for r, c in ROLE_CLASSES.items()] + [(IN_LOSS, "in the loss mask (trained)")]
    spans = "".join(f'<span class="{c}">{esc(label)}</span>' for c, label in items)
    return f'<div class="legend">{spans}<span class="branch-key">⑂ branch point</span></div>'


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

    `window_n`: the local window to highlight, as the trainer reads it (None = all turns;
    `TrainConfig.window_turns` of the recipe that trains these pairs).
    """
    parts = [
        STYLE if style else "",
        '<div class="selskill-pair">',
        _meta_table(pair, window_n),
        legend(),
        _prefix_html(pair, tokenizer, prompt_roles, max_prefix_tokens),
        '<div class="sides">',
        _side_html(pair, "chosen", tokenizer, max_completion_tokens, window_n),
        _side_html(pair, "rejected", tokenizer, max_completion_tokens, window_n),
        "</div></div>",
    ]
    return "".join(parts)


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
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="selskill-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


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
    return STYLE + html_table(headers, body)


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
    return STYLE + html_table(headers, body)
