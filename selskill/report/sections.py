"""The report's sections as blocks: held-out metrics, the skills' headroom, the engineering
baselines, pair yield and the plots with their captions, in the benchmark's words."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from selskill.measure.metrics import LABELS, METRICS, format_value
from selskill.registry import wording_of
from selskill.report.data import RoundData, paired_sr, round_label
from selskill.report.plots import (
    PLOTS,
    plot_branch_scores,
    plot_entropy,
    plot_metrics,
    plot_skill_calls,
    plot_step_gap,
)


def _pp(v, ci=None) -> str:
    """A difference of shares in percentage points."""
    if v is None:
        return "-"
    text = f"{100 * v:+.1f}"
    return f"{text} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if ci else text


def _opening(title: str, text: str) -> list[tuple]:
    """A section's heading and its first paragraph (what it shows, or why it has nothing to show)."""
    return [("h", 2, title), ("p", text)]


def _none_yet(title: str, what: str, where: str) -> list[tuple]:
    """The whole of a section no round has data for yet: what is missing, and where a round writes it."""
    return _opening(title, f"No round has {what} yet (runs/<exp>/round_<r>/{where}).")


def _by_split(have: list[RoundData], key: str) -> dict[str, list[tuple[RoundData, dict]]]:
    """Each split the rounds' `metrics[key]` measure, in name order, with the rounds that measured it (in
    their order) and their figures of it: a section's table of a split has a row for each of them."""
    splits = sorted({s for d in have for s in d.metrics.get(key, {})})
    figures = {s: [(d, d.metrics.get(key, {}).get(s)) for d in have] for s in splits}
    return {s: [(d, m) for d, m in pairs if m is not None] for s, pairs in figures.items()}


def metrics_section(
    rounds: list[RoundData], n_boot: int, seed: int, notes: list[str], benchmark: str
) -> list[tuple]:
    title = "Held-out metrics across rounds"
    have = [d for d in rounds if d.metrics]
    if not have:
        return _none_yet(title, "eval results", "eval/metrics.json")
    words = wording_of(benchmark)
    blocks = _opening(
        title,
        "Like the paper's Table 1. init = round 0 (the init policy), Rr = the model trained in round r. "
        "SR, Exec. Prec., SR@Invoke, SR@Skip and Malformed (malformed turns / turns) in %; Skill/ep and Avg. "
        f"Steps ({words.steps}) per episode. [95% bootstrap interval over episodes]. ΔSR vs init: SR(Rr) − "
        "SR(init) on the same tasks in percentage points with a paired bootstrap interval "
        f"({n_boot} resamples, seed {seed}).",
    )
    init = next((d for d in rounds if d.round == 0), None)
    headers = ["Round", "Episodes"] + [LABELS[m] for m in METRICS] + ["ΔSR vs init (pp)"]
    for split, measured in _by_split(have, "splits").items():
        rows = []
        for d, m in measured:
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
            what = words.task_type
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
    blocks = _opening(
        "Skills' headroom (the paper's Appendix B)",
        "The same model on the same tasks with the skills listed and without them (eval_mode no_skills), "
        "paired by task: positive = won only with the skills, negative = won only without them, both won / "
        "both lost = no effect. Net gain = positive − negative share (SR with − SR without, paired 95% "
        "bootstrap interval); oracle gain = the negative share, what a policy that kept every helpful call "
        "and skipped every harmful one could add to SR with skills at most. BM25 = mean BM25 score of the "
        "task text against the metadata (name and description) of the skills the with-skills episode "
        "called, per class, over the tasks whose episode called one (n).",
    )
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
    for split, measured in _by_split(have, "headroom").items():
        rows = []
        for d, h in measured:
            rows.append(
                [round_label(d.round), h["tasks"]]
                + [_count_share(h, c) for c in ("positive", "negative", "both_won", "both_lost")]
                + [_pp(h["net_gain"], h.get("net_gain_ci")), _pp(h["oracle_gain"])]
                + [_similarity(h, c) for c in ("positive", "negative", "no_effect")]
            )
        blocks += [("h", 3, f"Split {split}"), ("table", headers, rows)]
    return blocks


def baselines_section(rounds: list[RoundData], modes: dict[int, dict[str, dict]]) -> list[tuple]:
    """The paper's Table 9: one policy under each eval mode, next to its `skills` evaluation."""
    if not modes:
        return []
    blocks = _opening(
        "Engineering baselines (the paper's Appendix D)",
        "The same model evaluated with another prompt or skill setup instead of training: no skills, "
        "skills as context (all bodies in the system message, no skill tool), a conservative prompt, "
        "and an explicit skip option (a `self_reasoning` skill, counted as a skill call). "
        "`skills` is the method's own setting (the metrics table above).",
    )
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
    title = "Pair yield per round"
    have = [d for d in rounds if d.yield_]
    if not have:
        return _none_yet(title, "label stats", "label/stats/*.json")
    blocks = _opening(
        title,
        "From the label stage's stats (summed over ranks). Tasks = training tasks sampled this round; "
        "invoke-preferred = share of local pairs whose chosen side is the invoke arm.",
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


@dataclass(frozen=True)
class _Plot:
    """One figure of the report: how to draw it, what it shows, why it may be missing, its table."""

    key: str
    draw: Callable
    title: str
    text: str
    missing: str
    table: Callable[[list[RoundData]], list | None] = lambda rounds: None


def _entropy_table(rounds: list[RoundData]) -> list | None:
    rows = [
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
    return [("table", ["Round", "Arm", "Forks", "Generated tokens", "Mean entropy"], rows)] if rows else None


def _step_gap_table(rounds: list[RoundData]) -> list | None:
    rows = []
    for d in rounds:
        groups = defaultdict(list)
        for p in d.pairs:
            groups[f"{p['kind']}/{p['label_reason']}"].append(p)
        for key, ps in sorted(groups.items()):
            c = sum(int(p["chosen_steps"]) for p in ps) / len(ps)
            r = sum(int(p["rejected_steps"]) for p in ps) / len(ps)
            rows.append([round_label(d.round), key, len(ps), f"{c:.1f}", f"{r:.1f}", f"{c - r:+.1f}"])
    headers = ["Round", "Kind/reason", "Pairs", "Chosen steps", "Rejected steps", "Gap"]
    return [("table", headers, rows)] if rows else None


def _plots(words) -> list[_Plot]:
    """The report's figures, in order, in the benchmark's words."""
    return [
        _Plot(
            "metrics",
            plot_metrics,
            "Metrics per round",
            "Each metric of the table per round and eval split, with its 95% bootstrap interval.",
            "no round has eval results",
        ),
        _Plot(
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
            _entropy_table,
        ),
        _Plot(
            "scores",
            plot_branch_scores,
            "Branch scores of local pairs by chosen arm",
            "Distribution of the branch-point score (mean entropy of the decision's first tokens) of kept local "
            "pairs, split by which arm was preferred.",
            "no local pairs",
        ),
        _Plot(
            "skill_calls",
            plot_skill_calls,
            "Skill calls per episode",
            "Share of held-out episodes with 0, 1, 2, … skill calls, per round and eval split.",
            "no eval shards",
        ),
        _Plot(
            "step_gap",
            functools.partial(plot_step_gap, step_gap=words.step_gap),
            f"Chosen vs rejected {words.step_gap} steps",
            f"Histogram of chosen − rejected steps ({words.steps}) per pair, by kind and label reason (local pairs: "
            "steps after the branch; episode pairs: whole episode). Efficiency pairs are negative by construction; "
            "success-vs-failure gaps show how much shorter the winning side is.",
            "no pairs (label shards missing or empty)",
            _step_gap_table,
        ),
    ]


def plots_section(
    rounds: list[RoundData], plots_dir: Path, base: Path, notes: list[str], benchmark: str
) -> tuple[list, list]:
    """The figures that can be drawn, each with its text and table; a missing one becomes a note."""
    blocks: list[tuple] = [("h", 2, "Plots")]
    written = []
    rel = plots_dir.relative_to(base) if plots_dir.is_relative_to(base) else plots_dir
    for plot in _plots(wording_of(benchmark)):
        path = plots_dir / PLOTS[plot.key]
        out = plot.draw(rounds, path)
        blocks.append(("h", 3, plot.title))
        if out is None:
            path.unlink(missing_ok=True)  # no stale plot from an earlier report
            blocks.append(("p", f"Skipped: {plot.missing}"))
            notes.append(f"plot {PLOTS[plot.key]} skipped: {plot.missing}")
            continue
        written.append(out)
        blocks += [
            ("p", plot.text),
            *(plot.table(rounds) or []),
            ("img", str(rel / PLOTS[plot.key]), plot.title),
        ]
    return blocks, written
