"""What the report reads of a run directory: per round its eval rows and metrics, label stats and
pairs, fork rows (reduced to branch entropy), and the Appendix D baseline metrics.

A shard set the stage contract cannot verify (an unfinished or inconsistent stage) is still read
as it is, with a note saying why: a report of a partial run is the point of running it early.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from selskill.data.contract import read_stage_as_is
from selskill.data.layout import StageDir, round_dir
from selskill.data.schema import ROLE_ASSISTANT
from selskill.measure.metrics import compute_metrics, metrics_by_task_type, sum_yields
from selskill.measure.metrics import paired_sr_difference as _paired
from selskill.registry import DEFAULT_BENCHMARK, step_measure

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


def round_label(r: int) -> str:
    return "init" if r == 0 else f"R{r}"


@dataclass
class RoundData:
    round: int
    metrics: dict | None = None  # metrics.json ("splits": {split: {"overall", "by_task_type"}})
    metrics_recomputed: bool = False
    eval_rows: list[dict] = field(default_factory=list)
    yield_: dict | None = None  # label stats' "yield", summed over ranks
    pairs: list[dict] = field(default_factory=list)
    entropy: dict | None = None  # branch_entropy() of the fork rows


def _stage_rows(
    stage: StageDir, kind: str, columns: list[str], what: str, r: int, notes: list[str]
) -> list[dict] | None:
    if not stage.shard_files():
        notes.append(f"round {r}: no {stage.path.name} shards ({stage.shards}) — {what} skipped")
        return None
    try:
        table, unverified = read_stage_as_is(stage, kind, columns)
    except Exception as exc:  # a corrupt shard must not take the whole report down
        notes.append(
            f"round {r}: cannot read {stage.path.name} shards ({type(exc).__name__}: {exc}) — {what} skipped"
        )
        return None
    if unverified:  # unfinished or inconsistent: still worth reporting
        notes.append(f"round {r}: {stage.path.name} shards read unverified: {unverified}")
    return table.to_pylist()


def _summarize_rows(rows: list[dict], n_boot: int, seed: int, benchmark: str) -> dict:
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
    return DEFAULT_BENCHMARK


def load_round(
    exp_dir: Path,
    r: int,
    notes: list[str],
    benchmark: str,
    n_boot: int = 1000,
    seed: int = 0,
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
        rows = _stage_rows(ev, "rollout", EVAL_COLUMNS, what, r, notes)
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
    data.pairs = _stage_rows(label, "pair", PAIR_COLUMNS, "pair plots", r, notes) or []
    forks = _stage_rows(fork, "fork", FORK_COLUMNS, "branch-entropy plot", r, notes)
    if forks:
        data.entropy = branch_entropy(forks)
    return data


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
