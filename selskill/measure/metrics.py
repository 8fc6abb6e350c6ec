"""The paper's metrics, one definition each, computed from rollout rows.

- SR: share of episodes won.
- Exec. Prec.: precise skill calls / all skill calls. A call is any turn that opens a
  `<tool_call>`; it is precise when it is well formed, names a listed skill and (executable)
  every expanded action is admissible and takes effect, or (memory) returns content.
- SR@Invoke / SR@Skip: SR among episodes with >= 1 / no skill call.
- Skill/ep: skill calls per episode. Avg. Steps: steps per episode, counted as the benchmark's
  `StepMeasure` says (`step_measure`, the one place that decides it, for this metric and the
  label stage's efficiency rule alike): the column of rollout rows its benchmark plugin names
  (`selskill.registry.StepMeasure`), e.g. one assistant turn per step, or the environment
  commands an episode ran (`env_steps`). Malformed rate: malformed turns / turns.

Confidence intervals are 95% percentile bootstraps over episodes (seeded, so a report is
reproducible); ratio metrics resample episodes, not calls. Every metric is a ratio of sums over
episodes, so a resample is a vector of draw counts (numpy's multinomial) and all resamples are
one matrix product; the point estimate is the same function with every count 1, so the two
cannot define a metric differently. `sum_yields` adds up the label
stage's pair yields over ranks, for the report and the replication alike (neither imports
the other).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

METRICS = ("sr", "exec_prec", "sr_invoke", "sr_skip", "skill_per_ep", "avg_steps", "malformed_rate")
LABELS = {
    "sr": "SR",
    "exec_prec": "Exec. Prec.",
    "sr_invoke": "SR@Invoke",
    "sr_skip": "SR@Skip",
    "skill_per_ep": "Skill/ep",
    "avg_steps": "Avg. Steps",
    "malformed_rate": "Malformed",
}
PERCENT = {"sr", "exec_prec", "sr_invoke", "sr_skip", "malformed_rate"}


# an episode's counts, one row of the matrix the metrics are sums over
SUCCESS, CALLS, PRECISE, MALFORMED, TURNS, STEPS = range(6)


def _episodes(rows: Sequence[dict], steps: str) -> np.ndarray:
    columns = ("success", "n_skill_calls", "n_precise_calls", "n_malformed", "n_turns", steps)
    return np.array([[int(r[c]) for c in columns] for r in rows], dtype=np.int64).reshape(-1, len(columns))


def _ratio(num: np.ndarray, den: np.ndarray, empty: float = np.nan) -> np.ndarray:
    return np.divide(num, den, out=np.full(len(num), empty), where=den > 0)


def _weighted(eps: np.ndarray, counts: np.ndarray) -> dict[str, np.ndarray]:
    """Every metric, plus the counts they are built from, for each row of `counts` (how many
    times each episode is drawn); NaN where a draw leaves a metric undefined."""
    invoked = eps[:, CALLS] > 0
    n, won, calls = counts.sum(axis=1), counts @ eps[:, SUCCESS], counts @ eps[:, CALLS]
    n_invoked, won_invoked = counts @ invoked, counts @ (eps[:, SUCCESS] * invoked)
    return {
        "episodes": n,
        "sr": _ratio(won, n),
        "exec_prec": _ratio(counts @ eps[:, PRECISE], calls),
        "sr_invoke": _ratio(won_invoked, n_invoked),
        "sr_skip": _ratio(won - won_invoked, n - n_invoked),
        "skill_per_ep": _ratio(calls, n),
        "avg_steps": _ratio(counts @ eps[:, STEPS], n),
        "malformed_rate": _ratio(counts @ eps[:, MALFORMED], counts @ eps[:, TURNS], empty=0.0),
        "skill_calls": calls,
        "episodes_invoked": n_invoked,
    }


def _draw_counts(n: int, n_boot: int, seed: int) -> np.ndarray:
    """`n_boot` bootstrap resamples of n items, each as how many times it draws every item."""
    return np.random.default_rng(seed).multinomial(n, np.full(n, 1 / n), size=n_boot)


def _interval(values: np.ndarray) -> list[float]:
    """The 95% percentile interval: the 2.5% and 97.5% order statistics (lower rank)."""
    lo, hi = np.quantile(values, [0.025, 0.975], method="lower")
    return [float(lo), float(hi)]


def compute_metrics(rows: Sequence[dict], n_boot: int = 1000, seed: int = 0, steps: str = "n_turns") -> dict:
    """Point estimates and 95% bootstrap intervals of every metric; `steps`: the row column Avg. Steps
    averages (`step_measure(env).episode`)."""
    eps = _episodes(rows, steps)
    n = len(eps)
    if n == 0:
        return {m: None for m in METRICS} | {"episodes": 0, "ci": {}}
    point = _weighted(eps, np.ones((1, n), dtype=np.int64))
    out = {"episodes": n}
    out |= {m: None if np.isnan(point[m][0]) else float(point[m][0]) for m in METRICS}
    out |= {
        "skill_calls": int(point["skill_calls"][0]),
        "episodes_invoked": int(point["episodes_invoked"][0]),
    }
    if n_boot <= 0:
        return out | {"ci": {}}
    draws = _weighted(eps, _draw_counts(n, n_boot, seed))
    ci = {}
    for m in METRICS:
        defined = draws[m][~np.isnan(draws[m])]
        if len(defined):
            ci[m] = _interval(defined)
    return out | {"ci": ci}


def metrics_by_task_type(
    rows: Sequence[dict], n_boot: int = 1000, seed: int = 0, steps: str = "n_turns"
) -> dict:
    """`compute_metrics` per task type (ALFWorld's six types; BFCL's categories)."""
    groups = defaultdict(list)
    for r in rows:
        groups[r["task_type"]].append(r)
    return {t: compute_metrics(g, n_boot, seed, steps) for t, g in sorted(groups.items())}


def paired_sr_difference(a: Sequence[dict], b: Sequence[dict], n_boot: int = 2000, seed: int = 0) -> dict:
    """SR(b) - SR(a) over the same tasks (paired by task id), with a paired bootstrap CI."""
    sa = {r["task_id"]: bool(r["success"]) for r in a}
    sb = {r["task_id"]: bool(r["success"]) for r in b}
    common = sorted(set(sa) & set(sb))
    if not common:
        return {"tasks": 0, "diff": None, "ci": None}
    diffs = np.array([int(sb[t]) - int(sa[t]) for t in common])
    n = len(diffs)
    return {
        "tasks": n,
        "diff": float(diffs.sum() / n),
        "ci": _interval(_draw_counts(n, n_boot, seed) @ diffs / n),
    }


def format_value(metric: str, value, ci=None) -> str:
    if value is None:
        return "-"
    if metric in PERCENT:
        text = f"{100 * value:.1f}"
        return f"{text} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else text
    text = f"{value:.2f}"
    return f"{text} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else text


def sum_yields(stats: list[dict]) -> dict | None:
    """The label stage's per-rank `yield` dicts summed into one (shares recomputed)."""
    ys = [s["yield"] for s in stats if isinstance(s.get("yield"), dict)]
    if not ys:
        return None
    tasks = sum(int(y.get("tasks", 0)) for y in ys)
    kinds, reasons, discarded = Counter(), Counter(), Counter()
    invoke_pref = 0.0
    for y in ys:
        kinds.update(y.get("pairs_by_kind", {}))
        reasons.update(y.get("pairs_by_reason", {}))
        discarded.update(y.get("discarded", {}))
        local = y.get("pairs_by_kind", {}).get("local", 0)
        invoke_pref += y.get("local_invoke_preferred", y.get("invoke_preferred_share", 0.0) * local)
    local = kinds.get("local", 0)
    return {
        "tasks": tasks,
        "pairs": sum(int(y.get("pairs", 0)) for y in ys),
        "pairs_by_kind": dict(sorted(kinds.items())),
        "pairs_by_reason": dict(sorted(reasons.items())),
        "pairs_per_task": {k: v / tasks for k, v in sorted(kinds.items())} if tasks else {},
        "local_invoke_preferred": int(round(invoke_pref)),
        "invoke_preferred_share": invoke_pref / local if local else None,
        "discarded": {k: v for k, v in sorted(discarded.items()) if v},
    }
