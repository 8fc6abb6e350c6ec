"""The report of an experiment across rounds: `selskill report --exp runs/<exp>`.

Writes `runs/<exp>/report.md`, `runs/<exp>/report.html` (one file: its plots embedded as
base64 PNG) and `runs/<exp>/plots/*.png` with

1. held-out metrics per round (init = round 0, R1, R2, ...) and eval split, like the paper's
   Table 1 (SR, Exec. Prec., SR@Invoke, SR@Skip, Skill/ep, Avg. Steps, malformed rate) with
   95% bootstrap intervals, plus the paired SR difference vs init (same tasks) with its
   interval; SR per task type; where the eval also played without skills (`eval_headroom`),
   the skills' headroom per round (the paper's Appendix B);
2. pair yield per round from the label stage's stats: pairs/task by kind and by reason,
   invoke-preferred share of local pairs, discard reasons;
3. plots: each metric per round; per-token entropy after the branch point for the invoke
   vs skip arm of the fork continuations (the paper's Figure 3 analogue); branch scores of
   local pairs by chosen arm; skill calls per episode; chosen - rejected agent steps.

Inputs are only files every round already writes (eval/metrics.json + eval shards, label
stats + shards, fork shards). A missing round or stage is skipped with a note, never an
error. The output is deterministic: bootstraps are seeded, nothing carries a timestamp.

BFCL rounds (`benchmark: bfcl`, read from metrics.json or a stage's config.yaml) get the same
report; its words follow the benchmark: task types are BFCL's categories, and steps are
function-call steps (`selskill.metrics.step_measure`).
"""

from __future__ import annotations

import base64
import functools
import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from selskill import markdown, templates
from selskill.data.layout import StageDir, round_dir, round_numbers
from selskill.data.schema import ROLE_ASSISTANT
from selskill.metrics import (
    LABELS,
    METRICS,
    PERCENT,
    compute_metrics,
    format_value,
    metrics_by_task_type,
    step_measure,
    sum_yields,
)
from selskill.metrics import paired_sr_difference as _paired
from selskill.tracking import log_report_plots

EVAL_COLUMNS = [
    "task_id",
    "task_type",
    "success",
    "n_skill_calls",
    "n_precise_calls",
    "env_steps",
    "n_malformed",
    "n_turns",
]
PAIR_COLUMNS = [
    "kind",
    "label_reason",
    "task_type",
    "chosen_arm",
    "chosen_steps",
    "rejected_steps",
    "branch_score",
]
FORK_COLUMNS = ["arm", "prefix_len", "role", "turn", "entropy", "logprob"]
PLOTS = {
    "metrics": "metrics_per_round.png",
    "entropy": "branch_entropy.png",
    "scores": "branch_scores.png",
    "skill_calls": "skill_calls_per_episode.png",
    "step_gap": "step_gap.png",
}
ARM_COLORS = {"invoke": "#d62728", "skip": "#1f77b4"}
PALETTE = ["#4c4c4c", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]


def round_label(r: int) -> str:
    return "init" if r == 0 else f"R{r}"


# --- loading ------------------------------------------------------------------------------


@dataclass
class RoundData:
    round: int
    metrics: dict | None = None  # metrics.json ("splits": {split: {"overall", "by_task_type"}})
    metrics_recomputed: bool = False
    eval_rows: list[dict] = field(default_factory=list)
    yield_: dict | None = None  # label stats' "yield", summed over ranks
    pairs: list[dict] = field(default_factory=list)
    entropy: dict | None = None  # branch_entropy() of the fork rows


def _read_columns(files: list[Path], columns: list[str]) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(f, columns=columns) for f in files]
    return pa.concat_tables(tables).to_pylist() if tables else []


def _stage_rows(
    stage: StageDir, columns: list[str], what: str, r: int, notes: list[str]
) -> list[dict] | None:
    files = stage.shard_files()
    if not files:
        notes.append(f"round {r}: no {stage.path.name} shards ({stage.shards}) — {what} skipped")
        return None
    done = set(stage.completed_ranks())
    unmarked = [f.name for f in files if not f.stem.isdigit() or int(f.stem) not in done]
    if unmarked:
        notes.append(
            f"round {r}: {stage.path.name} shards {unmarked} have no completion marker (stage unfinished)"
        )
    try:
        return _read_columns(files, columns)
    except Exception as exc:  # a corrupt shard must not take the whole report down
        notes.append(
            f"round {r}: cannot read {stage.path.name} shards ({type(exc).__name__}: {exc}) — {what} skipped"
        )
        return None


def _summarize_rows(rows: list[dict], n_boot: int, seed: int, benchmark: str = "alfworld") -> dict:
    steps = step_measure(benchmark).episode
    splits = sorted({r["task_id"].split("/", 1)[0] for r in rows})
    out = {}
    for split in splits:
        mine = [r for r in rows if r["task_id"].startswith(f"{split}/")]
        out[split] = {
            "overall": compute_metrics(mine, n_boot, seed, steps),
            "by_task_type": metrics_by_task_type(mine, n_boot, seed, steps),
        }
    return out


def exp_benchmark(exp_dir: Path) -> str:
    """The experiment's benchmark: a metrics.json's or else a stage config.yaml's `benchmark`."""
    import yaml

    for path in sorted(exp_dir.glob("round_*/eval*/metrics.json")):
        try:
            value = json.loads(path.read_text()).get("benchmark")
        except (OSError, ValueError):
            continue
        if value:
            return value
    for path in sorted(exp_dir.glob("round_*/*/config.yaml")):
        try:
            value = (yaml.safe_load(path.read_text()) or {}).get("benchmark")
        except (OSError, yaml.YAMLError):
            continue
        if value:
            return value
    return "alfworld"


def load_round(
    exp_dir: Path, r: int, notes: list[str], n_boot: int = 1000, seed: int = 0, benchmark: str = "alfworld"
) -> RoundData:
    """What the report needs of round r; anything missing or unreadable becomes a note."""
    runs, exp = exp_dir.parent, exp_dir.name
    data = RoundData(r)
    ev = StageDir.of(runs, exp, r, "eval")
    mpath = ev.path / "metrics.json"
    if not ev.path.is_dir():
        notes.append(f"round {r}: no eval stage ({ev.path}) — not in the metrics table")
    else:
        what = "ΔSR vs init and skill calls per episode" if mpath.exists() else "held-out metrics"
        rows = _stage_rows(ev, EVAL_COLUMNS, what, r, notes)
        data.eval_rows = rows or []
        if mpath.exists():
            try:
                data.metrics = json.loads(mpath.read_text())
            except (OSError, ValueError) as exc:
                notes.append(f"round {r}: unreadable {mpath} ({exc})")
        if data.metrics is None and data.eval_rows:
            splits = _summarize_rows(data.eval_rows, n_boot, seed, benchmark)
            data.metrics = {"round": r, "exp": exp, "splits": splits}
            data.metrics_recomputed = True
            notes.append(f"round {r}: no readable metrics.json; metrics recomputed from the eval shards")
    if r == 0:
        return data
    label, fork = StageDir.of(runs, exp, r, "label"), StageDir.of(runs, exp, r, "fork")
    if not label.path.is_dir() and not fork.path.is_dir():
        notes.append(f"round {r}: no fork or label stage — pair yield, pair plots and branch entropy skipped")
        return data
    stats = []
    for f in sorted(label.stats.glob("*.json")) if label.stats.is_dir() else []:
        try:
            stats.append(json.loads(f.read_text()))
        except (OSError, ValueError) as exc:
            notes.append(f"round {r}: unreadable label stats {f} ({exc})")
    data.yield_ = sum_yields(stats)
    if data.yield_ is None:
        notes.append(f"round {r}: no label stats with a `yield` ({label.stats}) — pair yield skipped")
    data.pairs = _stage_rows(label, PAIR_COLUMNS, "pair plots", r, notes) or []
    forks = _stage_rows(fork, FORK_COLUMNS, "branch-entropy plot", r, notes)
    if forks:
        data.entropy = branch_entropy(forks)
    return data


# --- analyses -----------------------------------------------------------------------------


def generated_after_branch(fork: dict) -> list[tuple[int, float]]:
    """(assistant turn counted from the branch, entropy) of every token the policy generated
    after the branch point. Forced decision tokens (and appended end-of-turn tokens) carry
    logprob 0 and entropy 0 and are left out, as are prompt, observation and skill-return tokens."""
    start = int(fork["prefix_len"])
    roles, turns, ent, lp = fork["role"], fork["turn"], fork["entropy"], fork["logprob"]
    if start >= len(roles):
        return []
    base = int(turns[start])
    out = []
    for i in range(start, len(roles)):
        if roles[i] != ROLE_ASSISTANT or (ent[i] == 0.0 and lp[i] == 0.0):
            continue
        out.append((int(turns[i]) - base, float(ent[i])))
    return out


def branch_entropy(forks: list[dict], max_positions: int = 48, max_turns: int = 6) -> dict:
    """Per arm: per-token entropy of fork continuations by generated-token position after the
    branch (first `max_positions`) and by assistant turn after the branch (first `max_turns`)."""
    out = {}
    for arm in ("invoke", "skip"):
        pos, turn, n, all_vals = defaultdict(list), defaultdict(list), 0, []
        for f in forks:
            if f["arm"] != arm:
                continue
            n += 1
            toks = generated_after_branch(f)
            for k, (t, e) in enumerate(toks):
                all_vals.append(e)
                if k < max_positions:
                    pos[k].append(e)
                if t < max_turns:
                    turn[t].append(e)
        out[arm] = {
            "forks": n,
            "tokens": len(all_vals),
            "mean": sum(all_vals) / len(all_vals) if all_vals else None,
            "by_position": [_mean_se(pos[k]) for k in range(max_positions) if pos.get(k)],
            "by_turn": [_mean_se(turn[k]) for k in range(max_turns) if turn.get(k)],
        }
    return out


def _mean_se(xs: list[float]) -> tuple[float, float, int]:
    n = len(xs)
    m = sum(xs) / n
    var = sum((x - m) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    return (m, math.sqrt(var / n), n)


def paired_sr(init_rows: list[dict], rows: list[dict], split: str, n_boot: int, seed: int) -> dict:
    a = [x for x in init_rows if x["task_id"].startswith(f"{split}/")]
    b = [x for x in rows if x["task_id"].startswith(f"{split}/")]
    return _paired(a, b, n_boot=n_boot, seed=seed)


# --- plots (matplotlib Figure objects on the Agg canvas: no pyplot state, no display) --------


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=100, layout="constrained")


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png", metadata={"Software": None})
    tmp.replace(path)
    return path


def plot_metrics(rounds: list[RoundData], path: Path) -> Path | None:
    have = [d for d in rounds if d.metrics]
    if not have:
        return None
    splits = sorted({s for d in have for s in d.metrics.get("splits", {})})
    fig = _figure(14, 6.5)
    axes = fig.subplots(2, 4).ravel()
    xs = [d.round for d in have]
    for ax, m in zip(axes, METRICS, strict=False):
        scale = 100.0 if m in PERCENT else 1.0
        for j, split in enumerate(splits):
            ys, lo, hi = [], [], []
            for d in have:
                o = d.metrics["splits"].get(split, {}).get("overall", {})
                v, ci = o.get(m), (o.get("ci") or {}).get(m)
                ys.append(math.nan if v is None else v * scale)
                lo.append(0.0 if v is None or not ci else (v - ci[0]) * scale)
                hi.append(0.0 if v is None or not ci else (ci[1] - v) * scale)
            ax.errorbar(
                [x + 0.06 * (j - (len(splits) - 1) / 2) for x in xs],
                ys,
                yerr=[lo, hi],
                marker="o",
                capsize=3,
                color=PALETTE[(j + 1) % len(PALETTE)],
                label=split,
            )
        ax.set_title(LABELS[m] + (" (%)" if m in PERCENT else ""))
        ax.set_xticks(xs, [round_label(x) for x in xs])
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    axes[-1].axis("off")
    axes[-1].legend(handles, labels, loc="center", title="eval split")
    fig.suptitle("Held-out metrics per round (95% bootstrap intervals)")
    return _save(fig, path)


def plot_entropy(rounds: list[RoundData], path: Path) -> Path | None:
    have = [d for d in rounds if d.entropy and any(d.entropy[a]["tokens"] for a in ("invoke", "skip"))]
    if not have:
        return None
    fig = _figure(12, 3.4 * len(have))
    axes = fig.subplots(len(have), 2, squeeze=False)
    for row, d in zip(axes, have, strict=True):
        for arm in ("invoke", "skip"):
            e = d.entropy[arm]
            for ax, key in zip(row, ("by_position", "by_turn"), strict=True):
                pts = e[key]
                if not pts:
                    continue
                x = list(range(len(pts)))
                m = [p[0] for p in pts]
                se = [1.96 * p[1] for p in pts]
                label = f"{arm} arm ({e['forks']} forks, mean {e['mean']:.3f})"
                if key == "by_position":
                    ax.plot(x, m, color=ARM_COLORS[arm], label=label)
                    ax.fill_between(
                        x,
                        [a - b for a, b in zip(m, se, strict=True)],
                        [a + b for a, b in zip(m, se, strict=True)],
                        color=ARM_COLORS[arm],
                        alpha=0.2,
                    )
                else:
                    off = -0.15 if arm == "invoke" else 0.15
                    ax.errorbar(
                        [v + off for v in x],
                        m,
                        yerr=se,
                        fmt="o-",
                        capsize=3,
                        color=ARM_COLORS[arm],
                        label=label,
                    )
        row[0].set_title(f"{round_label(d.round)}: entropy by generated-token position after the branch")
        row[0].set_xlabel("generated token after the branch (forced decision tokens excluded)")
        row[1].set_title(f"{round_label(d.round)}: mean entropy per assistant turn after the branch")
        row[1].set_xlabel("assistant turn after the branch (0 = the branch turn)")
        for ax in row:
            ax.set_ylabel("token entropy (nats)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("Token entropy after invoke/skip branch points (fork continuations; mean ± 95% CI)")
    return _save(fig, path)


def plot_branch_scores(rounds: list[RoundData], path: Path) -> Path | None:
    have = [d for d in rounds if any(p["kind"] == "local" for p in d.pairs)]
    if not have:
        return None
    fig = _figure(5 * len(have), 3.4)
    axes = fig.subplots(1, len(have), squeeze=False)[0]
    for ax, d in zip(axes, have, strict=True):
        local = [p for p in d.pairs if p["kind"] == "local"]
        scores = [float(p["branch_score"]) for p in local]
        lo, hi = min(scores), max(scores)
        bins = 12 if hi > lo else 1
        for arm in ("invoke", "skip"):
            vals = [float(p["branch_score"]) for p in local if p["chosen_arm"] == arm]
            if vals:
                ax.hist(
                    vals,
                    bins=bins,
                    range=(lo, hi if hi > lo else lo + 1),
                    alpha=0.55,
                    color=ARM_COLORS[arm],
                    label=f"{arm} preferred (n={len(vals)})",
                )
        ax.set_title(f"{round_label(d.round)}: branch score of local pairs")
        ax.set_xlabel("branch score (decision entropy)")
        ax.set_ylabel("pairs")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_skill_calls(rounds: list[RoundData], path: Path, cap: int = 6) -> Path | None:
    have = [d for d in rounds if d.eval_rows]
    if not have:
        return None
    splits = sorted({r["task_id"].split("/", 1)[0] for d in have for r in d.eval_rows})
    fig = _figure(6 * len(splits), 3.6)
    axes = fig.subplots(1, len(splits), squeeze=False)[0]
    width = 0.8 / len(have)
    top = min(cap, max(int(r["n_skill_calls"]) for d in have for r in d.eval_rows))
    xs = list(range(top + 1))
    for ax, split in zip(axes, splits, strict=True):
        for j, d in enumerate(have):
            calls = [
                min(int(r["n_skill_calls"]), cap) for r in d.eval_rows if r["task_id"].startswith(f"{split}/")
            ]
            if not calls:
                continue
            counts = Counter(calls)
            ax.bar(
                [x + (j - (len(have) - 1) / 2) * width for x in xs],
                [counts.get(x, 0) / len(calls) for x in xs],
                width=width,
                color=PALETTE[j % len(PALETTE)],
                label=f"{round_label(d.round)} (n={len(calls)}, mean {sum(calls) / len(calls):.2f})",
            )
        ax.set_xticks(xs, [str(x) if x < cap else f"≥{cap}" for x in xs])
        ax.set_xlabel("skill calls per episode")
        ax.set_ylabel("share of episodes")
        ax.set_title(f"{split}: skill calls per episode")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def plot_step_gap(rounds: list[RoundData], path: Path, bfcl: bool = False) -> Path | None:
    have = [d for d in rounds if d.pairs]
    if not have:
        return None
    keys = sorted({f"{p['kind']}/{p['label_reason']}" for d in have for p in d.pairs})
    fig = _figure(5 * len(keys), 3.6)
    axes = fig.subplots(1, len(keys), squeeze=False)[0]
    for ax, key in zip(axes, keys, strict=True):
        gaps_by_round = {
            d.round: [
                int(p["chosen_steps"]) - int(p["rejected_steps"])
                for p in d.pairs
                if f"{p['kind']}/{p['label_reason']}" == key
            ]
            for d in have
        }
        allv = [g for v in gaps_by_round.values() for g in v]
        lo, hi = min(allv), max(allv)
        edges = [x - 0.5 for x in range(lo, hi + 2)] if hi - lo <= 40 else 30
        for j, (r, gaps) in enumerate(sorted(gaps_by_round.items())):
            if gaps:
                ax.hist(
                    gaps,
                    bins=edges,
                    histtype="step",
                    linewidth=1.8,
                    color=PALETTE[(j + 1) % len(PALETTE)],
                    label=f"{round_label(r)} (n={len(gaps)}, mean {sum(gaps) / len(gaps):+.1f})",
                )
        ax.axvline(0, color="#888", linestyle=":")
        ax.set_title(key)
        ax.set_xlabel(f"chosen − rejected {'function-call' if bfcl else 'agent'} steps")
        ax.set_ylabel("pairs")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("Env-step gap between chosen and rejected sides (local: steps after the branch)")
    return _save(fig, path)


# --- document model: blocks rendered to Markdown and to HTML --------------------------------


def to_markdown(blocks: list[tuple]) -> str:
    out = []
    for b in blocks:
        kind = b[0]
        if kind == "h":
            out.append("#" * b[1] + " " + b[2])
        elif kind == "p":
            out.append(b[1])
        elif kind == "list":
            out.append("\n".join(f"- {x}" for x in b[1]))
        elif kind == "table":
            out.append(markdown.table(b[1], b[2]))
        elif kind == "img":
            out.append(f"![{b[2]}]({b[1]})")
    return "\n\n".join(out) + "\n"


def to_html(blocks: list[tuple], base: Path, title: str) -> str:
    """One self-contained page (selskill/templates/report.html.j2): the plots inlined as data URIs."""

    def inline(b: tuple) -> tuple:
        if b[0] != "img":
            return b
        return (
            "img",
            "data:image/png;base64," + base64.b64encode((base / b[1]).read_bytes()).decode("ascii"),
            b[2],
        )

    return templates.render("report.html.j2", title=title, blocks=[inline(b) for b in blocks])


# --- sections -----------------------------------------------------------------------------


def _pp(v, ci=None) -> str:
    """A difference of shares in percentage points."""
    if v is None:
        return "-"
    text = f"{100 * v:+.1f}"
    return f"{text} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if ci else text


STEPS_TEXT = "agent steps: actions, skill calls and malformed turns"
BFCL_STEPS_TEXT = (
    "function-call steps: a call list is one step, an executable skill costs the calls it sends, ending a "
    "user turn and memory skills cost none"
)


def metrics_section(
    rounds: list[RoundData], n_boot: int, seed: int, notes: list[str], benchmark: str = "alfworld"
) -> list[tuple]:
    bfcl = benchmark == "bfcl"
    blocks: list[tuple] = [("h", 2, "Held-out metrics across rounds")]
    have = [d for d in rounds if d.metrics]
    if not have:
        blocks.append(("p", "No round has eval results yet (runs/<exp>/round_<r>/eval/metrics.json)."))
        return blocks
    blocks.append(
        (
            "p",
            "Like the paper's Table 1. init = round 0 (the init policy), Rr = the model trained in round r. "
            "SR, Exec. Prec., SR@Invoke, SR@Skip and Malformed (malformed turns / turns) in %; Skill/ep and Avg. "
            f"Steps ({BFCL_STEPS_TEXT if bfcl else STEPS_TEXT}) per episode. [95% bootstrap interval over episodes]. ΔSR vs init: SR(Rr) − "
            "SR(init) on the same tasks in percentage points with a paired bootstrap interval "
            f"({n_boot} resamples, seed {seed}).",
        )
    )
    init = next((d for d in rounds if d.round == 0), None)
    splits = sorted({s for d in have for s in d.metrics.get("splits", {})})
    headers = ["Round", "Episodes"] + [LABELS[m] for m in METRICS] + ["ΔSR vs init (pp)"]
    for split in splits:
        rows = []
        for d in have:
            m = d.metrics["splits"].get(split)
            if m is None:
                continue
            o = m["overall"]
            ci = o.get("ci") or {}
            if d.round == 0:
                delta = "-"
            elif init is None or not init.eval_rows or not d.eval_rows:
                delta = "- (needs eval rows of init and this round)"
            else:
                p = paired_sr(init.eval_rows, d.eval_rows, split, n_boot, seed)
                delta = f"{_pp(p['diff'], p['ci'])} (n={p['tasks']})" if p["tasks"] else "- (no common tasks)"
            rows.append(
                [round_label(d.round), o.get("episodes", 0)]
                + [format_value(k, o.get(k), ci.get(k)) for k in METRICS]
                + [delta]
            )
        blocks += [("h", 3, f"Split {split}"), ("table", headers, rows)]
        types = sorted({t for d in have for t in d.metrics["splits"].get(split, {}).get("by_task_type", {})})
        if types:
            trows = []
            for t in types:
                row = [t]
                for d in have:
                    m = d.metrics["splits"].get(split, {}).get("by_task_type", {}).get(t)
                    row.append(f"{format_value('sr', m.get('sr'))} (n={m.get('episodes', 0)})" if m else "-")
                trows.append(row)
            what = "BFCL category" if bfcl else "task type"
            blocks += [
                ("p", f"SR (%) by {what} on {split}:"),
                ("table", [what[0].upper() + what[1:]] + [round_label(d.round) for d in have], trows),
            ]
    if init is None or not init.metrics:
        notes.append("round 0 (init) has no eval results: ΔSR vs init cannot be computed")
    return blocks


def _count_share(h: dict, c: str) -> str:
    share = h["shares"][c]
    return f"{h['counts'][c]}" + ("" if share is None else f" ({100 * share:.1f}%)")


def _similarity(h: dict, c: str) -> str:
    s = (h.get("similarity") or {}).get(c)
    if not s or s["mean"] is None:
        return "-"
    return f"{s['mean']:.2f} (n={s['tasks']})"


def headroom_section(rounds: list[RoundData]) -> list[tuple]:
    """The skills' headroom (the paper's Appendix B) of each round whose metrics.json has it."""
    have = [d for d in rounds if d.metrics and d.metrics.get("headroom")]
    if not have:
        return []
    blocks: list[tuple] = [
        ("h", 2, "Skills' headroom (the paper's Appendix B)"),
        (
            "p",
            "The same model on the same tasks with the skills listed and without them (eval_mode no_skills), "
            "paired by task: positive = won only with the skills, negative = won only without them, both won / "
            "both lost = no effect. Net gain = positive − negative share (SR with − SR without, paired 95% "
            "bootstrap interval); oracle gain = the negative share, what a policy that kept every helpful call "
            "and skipped every harmful one could add to SR with skills at most. BM25 = mean BM25 score of the "
            "task text against the metadata (name and description) of the skills the with-skills episode "
            "called, per class, over the tasks whose episode called one (n).",
        ),
    ]
    headers = [
        "Round",
        "Tasks",
        "Positive",
        "Negative",
        "Both won",
        "Both lost",
        "Net gain (pp)",
        "Oracle gain (pp)",
        "BM25 positive",
        "BM25 negative",
        "BM25 no effect",
    ]
    splits = sorted({s for d in have for s in d.metrics["headroom"]})
    for split in splits:
        rows = []
        for d in have:
            h = d.metrics["headroom"].get(split)
            if h is None:
                continue
            rows.append(
                [round_label(d.round), h["tasks"]]
                + [_count_share(h, c) for c in ("positive", "negative", "both_won", "both_lost")]
                + [_pp(h["net_gain"], h.get("net_gain_ci")), _pp(h["oracle_gain"])]
                + [_similarity(h, c) for c in ("positive", "negative", "no_effect")]
            )
        blocks += [("h", 3, f"Split {split}"), ("table", headers, rows)]
    return blocks


def load_mode_metrics(exp_dir: Path, rounds: list[int], notes: list[str]) -> dict[int, dict[str, dict]]:
    """{round: {mode: metrics.json}} of the Appendix D baselines (`round_<r>/eval-<mode>/`)."""
    out: dict[int, dict[str, dict]] = {}
    for r in rounds:
        for path in sorted(round_dir(exp_dir.parent, exp_dir.name, r).glob("eval-*/metrics.json")):
            try:
                out.setdefault(r, {})[path.parent.name.removeprefix("eval-")] = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                notes.append(f"round {r}: unreadable {path} ({exc})")
    return out


def baselines_section(rounds: list[RoundData], modes: dict[int, dict[str, dict]]) -> list[tuple]:
    """The paper's Table 9: one policy under each eval mode, next to its `skills` evaluation."""
    if not modes:
        return []
    blocks: list[tuple] = [
        ("h", 2, "Engineering baselines (the paper's Appendix D)"),
        (
            "p",
            "The same model evaluated with another prompt or skill setup instead of training: no skills, "
            "skills as context (all bodies in the system message, no skill tool), a conservative prompt, "
            "and an explicit skip option (a `self_reasoning` skill, counted as a skill call). "
            "`skills` is the method's own setting (the metrics table above).",
        ),
    ]
    by_round = {d.round: d for d in rounds}
    headers = ["Round", "Mode", "Episodes"] + [LABELS[m] for m in METRICS]
    splits = sorted({s for ms in modes.values() for m in ms.values() for s in m.get("splits", {})})
    for split in splits:
        rows = []
        for r in sorted(modes):
            entries = [("skills", by_round[r].metrics)] if r in by_round and by_round[r].metrics else []
            entries += sorted(modes[r].items())
            for mode, metrics in entries:
                m = metrics.get("splits", {}).get(split)
                if m is None:
                    continue
                o = m["overall"]
                ci = o.get("ci") or {}
                rows.append(
                    [round_label(r), mode, o.get("episodes", 0)]
                    + [format_value(k, o.get(k), ci.get(k)) for k in METRICS]
                )
        blocks += [("h", 3, f"Split {split}"), ("table", headers, rows)]
    return blocks


def yield_section(rounds: list[RoundData]) -> list[tuple]:
    blocks: list[tuple] = [("h", 2, "Pair yield per round")]
    have = [d for d in rounds if d.yield_]
    if not have:
        blocks.append(("p", "No round has label stats yet (runs/<exp>/round_<r>/label/stats/*.json)."))
        return blocks
    blocks.append(
        (
            "p",
            "From the label stage's stats (summed over ranks). Tasks = training tasks sampled this round; "
            "invoke-preferred = share of local pairs whose chosen side is the invoke arm.",
        )
    )
    kinds = sorted({k for d in have for k in d.yield_["pairs_by_kind"]} | {"episode", "local"})
    headers = ["Round", "Tasks", "Pairs"] + [f"{k} pairs/task" for k in kinds] + ["Invoke-preferred (local)"]
    rows = []
    for d in have:
        y = d.yield_
        share = y["invoke_preferred_share"]
        rows.append(
            [round_label(d.round), y["tasks"], y["pairs"]]
            + [f"{y['pairs_per_task'].get(k, 0.0):.2f} ({y['pairs_by_kind'].get(k, 0)})" for k in kinds]
            + ["-" if share is None else f"{100 * share:.1f}% ({y['local_invoke_preferred']})"]
        )
    blocks += [("h", 3, "Pairs per task by kind"), ("table", headers, rows)]
    rrows = [
        [round_label(d.round), reason, n, f"{n / d.yield_['tasks']:.2f}" if d.yield_["tasks"] else "-"]
        for d in have
        for reason, n in d.yield_["pairs_by_reason"].items()
    ]
    blocks += [
        ("h", 3, "Pairs by kind and reason"),
        ("table", ["Round", "Kind/reason", "Pairs", "Pairs/task"], rrows) if rrows else ("p", "No pairs."),
    ]
    drows = [[round_label(d.round), reason, n] for d in have for reason, n in d.yield_["discarded"].items()]
    blocks.append(("h", 3, "Discarded (why no pair was kept)"))
    blocks.append(
        ("table", ["Round", "Reason", "Count"], drows) if drows else ("p", "Nothing was discarded.")
    )
    return blocks


def plots_section(
    rounds: list[RoundData], plots_dir: Path, base: Path, notes: list[str], benchmark: str = "alfworld"
) -> tuple[list, list]:
    bfcl = benchmark == "bfcl"
    blocks: list[tuple] = [("h", 2, "Plots")]
    written = []
    rel = plots_dir.relative_to(base) if plots_dir.is_relative_to(base) else plots_dir

    def add(key: str, fn, title: str, text: str, missing: str, extra: list | None = None) -> None:
        path = plots_dir / PLOTS[key]
        out = fn(rounds, path)
        blocks.append(("h", 3, title))
        if out is None:
            path.unlink(missing_ok=True)  # no stale plot from an earlier report
            blocks.append(("p", f"Skipped: {missing}"))
            notes.append(f"plot {PLOTS[key]} skipped: {missing}")
            return
        written.append(out)
        blocks.append(("p", text))
        blocks.extend(extra or [])
        blocks.append(("img", str(rel / PLOTS[key]), title))

    add(
        "metrics",
        plot_metrics,
        "Metrics per round",
        "Each metric of the table per round and eval split, with its 95% bootstrap interval.",
        "no round has eval results",
    )
    erows = [
        [
            round_label(d.round),
            arm,
            d.entropy[arm]["forks"],
            d.entropy[arm]["tokens"],
            "-" if d.entropy[arm]["mean"] is None else f"{d.entropy[arm]['mean']:.3f}",
        ]
        for d in rounds
        if d.entropy
        for arm in ("invoke", "skip")
    ]
    add(
        "entropy",
        plot_entropy,
        "Entropy after the branch point: invoke vs skip arm (Figure 3 analogue)",
        "Per-token entropy (full-vocabulary, nats, as recorded at sampling) of the tokens the policy generated "
        "in the fork continuations after a branch point, invoke arm vs skip arm. Left: averaged by position "
        "among the first 48 generated tokens after the branch (the forced decision opening is excluded; "
        "observation and skill-return tokens are not generated and not counted). Right: averaged per assistant "
        "turn after the branch (0 = the branch turn itself). Bands/bars: mean ± 1.96 standard errors. The paper "
        "finds higher entropy on the invoke path.",
        "no fork continuations (fork shards missing or empty)",
        [("table", ["Round", "Arm", "Forks", "Generated tokens", "Mean entropy"], erows)] if erows else None,
    )
    add(
        "scores",
        plot_branch_scores,
        "Branch scores of local pairs by chosen arm",
        "Distribution of the branch-point score (mean entropy of the decision's first tokens) of kept local "
        "pairs, split by which arm was preferred.",
        "no local pairs",
    )
    add(
        "skill_calls",
        plot_skill_calls,
        "Skill calls per episode",
        "Share of held-out episodes with 0, 1, 2, … skill calls, per round and eval split.",
        "no eval shards",
    )
    grows = []
    for d in rounds:
        groups = defaultdict(list)
        for p in d.pairs:
            groups[f"{p['kind']}/{p['label_reason']}"].append(p)
        for key, ps in sorted(groups.items()):
            c = sum(int(p["chosen_steps"]) for p in ps) / len(ps)
            r = sum(int(p["rejected_steps"]) for p in ps) / len(ps)
            grows.append([round_label(d.round), key, len(ps), f"{c:.1f}", f"{r:.1f}", f"{c - r:+.1f}"])
    add(
        "step_gap",
        functools.partial(plot_step_gap, bfcl=bfcl),
        "Chosen vs rejected function-call steps" if bfcl else "Chosen vs rejected agent steps",
        (
            f"Histogram of chosen − rejected steps ({BFCL_STEPS_TEXT}) per pair, by kind and label reason (local pairs: "
            if bfcl
            else "Histogram of chosen − rejected agent steps (decisions: actions and skill calls) per pair, by kind and label reason (local pairs: "
        )
        + "steps after the branch; episode pairs: whole episode). Efficiency pairs are negative by construction; "
        "success-vs-failure gaps show how much shorter the winning side is.",
        "no pairs (label shards missing or empty)",
        [("table", ["Round", "Kind/reason", "Pairs", "Chosen steps", "Rejected steps", "Gap"], grows)]
        if grows
        else None,
    )
    return blocks, written


@dataclass
class Report:
    markdown: Path
    html: Path
    plots: list[Path]
    notes: list[str]


def build_report(exp_dir: str | Path, n_boot: int = 2000, seed: int = 0) -> Report:
    """Write report.md, report.html and plots/ for every round found under `exp_dir`."""
    exp_dir = Path(exp_dir)
    if not exp_dir.is_dir():
        raise FileNotFoundError(
            f"no experiment directory {exp_dir}: run a round first (make round) or pass --exp"
        )
    notes: list[str] = []
    rounds_found = round_numbers(exp_dir)
    benchmark = exp_benchmark(exp_dir)
    rounds = [
        load_round(exp_dir, r, notes, n_boot=1000, seed=seed, benchmark=benchmark) for r in rounds_found
    ]
    if rounds_found:
        missing = sorted(set(range(max(rounds_found) + 1)) - set(rounds_found))
        if missing:
            notes.insert(0, f"rounds {missing} have no directory under {exp_dir}")
    else:
        notes.append(f"no round_<r> directories under {exp_dir}")

    blocks: list[tuple] = [
        ("h", 1, f"SelSkill report: {exp_dir.name}"),
        (
            "p",
            f"Run directory {exp_dir}; rounds found: "
            + (", ".join(f"{round_label(r)} (round_{r})" for r in rounds_found) or "none")
            + ". Round r samples with round r−1's model; pairs are not accumulated across rounds."
            + (
                " Benchmark: BFCL multi-turn (bfcl-eval's shipped data, backends and checker); SR is BFCL's "
                'checker, Exec. Prec. whether a skill call ran (docs/design.md, "Exec. Prec. on BFCL").'
                if benchmark == "bfcl"
                else ""
            ),
        ),
    ]
    modes = load_mode_metrics(exp_dir, rounds_found, notes)
    body = (
        metrics_section(rounds, n_boot, seed, notes, benchmark)
        + headroom_section(rounds)
        + baselines_section(rounds, modes)
        + yield_section(rounds)
    )
    plot_blocks, plots = plots_section(rounds, exp_dir / "plots", exp_dir, notes, benchmark)
    body += plot_blocks
    if notes:
        blocks += [("h", 2, "Notes (skipped or missing)"), ("list", notes, "notes")]
    blocks += body

    md, page = exp_dir / "report.md", exp_dir / "report.html"
    for path, text in (
        (md, to_markdown(blocks)),
        (page, to_html(blocks, exp_dir, f"SelSkill report: {exp_dir.name}")),
    ):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    log_report_plots(exp_dir, plots)
    return Report(md, page, plots, notes)
