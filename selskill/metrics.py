"""The paper's metrics, one definition each, computed from rollout rows.

- SR: share of episodes won.
- Exec. Prec.: precise skill calls / all skill calls. A call is any turn that opens a
  `<tool_call>`; it is precise when it is well formed, names a listed skill and (executable)
  every expanded action is admissible and takes effect, or (memory) returns content.
- SR@Invoke / SR@Skip: SR among episodes with >= 1 / no skill call.
- Skill/ep: skill calls per episode. Avg. Steps: steps per episode, counted as the benchmark's
  `StepMeasure` says (`step_measure`, the one place that decides it, for this metric and the
  label stage's efficiency rule alike). ALFWorld: agent steps, a step being one decision (an
  action, a skill call or a malformed turn: one assistant turn; see `selskill.stages.label`);
  the environment commands an episode ran are its `env_steps`. BFCL: function-call steps
  (`env_steps`: a call list is one step, an executable skill costs the calls it sends, a
  turn that ends the user turn and a memory skill cost none). Malformed rate: malformed
  turns / turns.

Confidence intervals are 95% percentile bootstraps over episodes (seeded, so a report is
reproducible); ratio metrics resample episodes, not calls. `sum_yields` adds up the label
stage's pair yields over ranks, for the report and the replication alike (neither imports
the other).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class StepMeasure:
    """What one step of an episode is, per benchmark: Avg. Steps and the label's efficiency rule use it."""

    episode: str  # rollout / fork column of a whole episode's steps
    after_branch: str  # fork column of the steps from the branch turn on
    what: str  # in words, for reports


STEP_MEASURES = {
    "alfworld": StepMeasure(
        "n_turns", "steps_after_branch", "agent steps (actions, skill calls, malformed turns)"
    ),
    "bfcl": StepMeasure(
        "env_steps", "env_steps_after_branch", "function-call steps (call lists; an executable skill's calls)"
    ),
}


def step_measure(benchmark: str = "alfworld") -> StepMeasure:
    """How `benchmark` counts steps (the only place that decides it)."""
    try:
        return STEP_MEASURES[benchmark]
    except KeyError:
        raise ValueError(f"unknown benchmark {benchmark!r}; choose from {', '.join(STEP_MEASURES)}") from None


def _episode(row: dict, steps: str = "n_turns") -> tuple:
    return (
        bool(row["success"]),
        int(row["n_skill_calls"]),
        int(row["n_precise_calls"]),
        int(row["env_steps"]),
        int(row["n_malformed"]),
        int(row["n_turns"]),
        int(row[steps]),
    )


def _point(eps: Sequence[tuple]) -> dict:
    n = len(eps)
    if n == 0:
        return {m: None for m in METRICS} | {"episodes": 0}
    calls = sum(e[1] for e in eps)
    invoked = [e for e in eps if e[1] > 0]
    skipped = [e for e in eps if e[1] == 0]
    turns = sum(e[5] for e in eps)
    return {
        "episodes": n,
        "sr": sum(e[0] for e in eps) / n,
        "exec_prec": sum(e[2] for e in eps) / calls if calls else None,
        "sr_invoke": sum(e[0] for e in invoked) / len(invoked) if invoked else None,
        "sr_skip": sum(e[0] for e in skipped) / len(skipped) if skipped else None,
        "skill_per_ep": calls / n,
        "avg_steps": sum(e[6] for e in eps) / n,
        "malformed_rate": sum(e[4] for e in eps) / turns if turns else 0.0,
        "skill_calls": calls,
        "episodes_invoked": len(invoked),
    }


def compute_metrics(rows: Sequence[dict], n_boot: int = 1000, seed: int = 0, steps: str = "n_turns") -> dict:
    """Point estimates and 95% bootstrap intervals of every metric; `steps`: the row column Avg. Steps
    averages (`step_measure(env).episode`)."""
    eps = [_episode(r, steps) for r in rows]
    out = _point(eps)
    if not eps or n_boot <= 0:
        return out | {"ci": {}}
    rng = random.Random(seed)
    samples = defaultdict(list)
    for _ in range(n_boot):
        draw = _point([eps[rng.randrange(len(eps))] for _ in eps])
        for m in METRICS:
            if draw[m] is not None:
                samples[m].append(draw[m])
    ci = {}
    for m, vals in samples.items():
        vals.sort()
        ci[m] = [vals[int(0.025 * (len(vals) - 1))], vals[int(0.975 * (len(vals) - 1))]]
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
    diffs = [int(sb[t]) - int(sa[t]) for t in common]
    rng = random.Random(seed)
    boots = sorted(sum(diffs[rng.randrange(len(diffs))] for _ in diffs) / len(diffs) for _ in range(n_boot))
    return {
        "tasks": len(common),
        "diff": sum(diffs) / len(diffs),
        "ci": [boots[int(0.025 * (n_boot - 1))], boots[int(0.975 * (n_boot - 1))]],
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
