"""The report's figures: matplotlib Figure objects on the Agg canvas (no pyplot state, no display),
saved as PNG without a timestamp so that a rerun writes the same bytes."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from selskill.measure.metrics import LABELS, METRICS, PERCENT
from selskill.report.data import RoundData, round_label

PLOTS = {
    "metrics": "metrics_per_round.png",
    "entropy": "branch_entropy.png",
    "scores": "branch_scores.png",
    "skill_calls": "skill_calls_per_episode.png",
    "step_gap": "step_gap.png",
}
ARM_COLORS = {"invoke": "#d62728", "skip": "#1f77b4"}
PALETTE = ["#4c4c4c", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]


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


def plot_step_gap(rounds: list[RoundData], path: Path, step_gap: str = "agent") -> Path | None:
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
        ax.set_xlabel(f"chosen − rejected {step_gap} steps")
        ax.set_ylabel("pairs")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("Env-step gap between chosen and rejected sides (local: steps after the branch)")
    return _save(fig, path)
