"""One SelSkill round end to end: sample -> branch -> fork -> label -> train -> eval.

Round r samples with round r-1's model (round 1: the init policy, bootstrapped when the
recipe has no model) and pairs are not accumulated across rounds. Every stage skips ranks
that are already complete, so rerunning after a crash finishes only what is missing. Here
all ranks run in this process one after another; to scale out, launch the per-stage
entry points (`pipelines/<stage>.py --rank i --world-size n`) on many machines instead.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from selskill.config import Recipe
from selskill.data.layout import StageDir, policy_dir, resolve_round_policy, round_dir
from selskill.stages.branch import run_branch
from selskill.stages.common import collect_stats
from selskill.stages.context import ensure_games
from selskill.stages.evaluate import run_eval
from selskill.stages.fork import run_fork
from selskill.stages.label import run_label
from selskill.stages.sample import run_sample


def _ranks(run):
    for rank in range(run.world_size):
        yield dataclasses.replace(run, rank=rank)


def ensure_init_policy(recipe: Recipe) -> Path | None:
    """Round 1 without a given model starts from the run's own offline init policy."""
    if recipe.policy.model_name_or_path:
        return None
    out = policy_dir(recipe.run.runs_dir, recipe.run.exp, 1)
    if recipe.run.benchmark == "bfcl":
        from selskill.policy.bfcl_init import build_bfcl_init_policy_from_config
        from selskill.stages.common import balanced_tasks
        from selskill.stages.context import bfcl_index

        # the first init_bfcl_tasks train tasks in the order the sample stage takes them
        tasks = balanced_tasks(bfcl_index(recipe.run, "train").games, recipe.init.init_bfcl_tasks)
        return build_bfcl_init_policy_from_config(
            recipe.init,
            out,
            run=recipe.run,
            seed=recipe.seed,
            task_ids=tasks,
            fmt=recipe.rollout.turn_format("bfcl"),
            listing_style=recipe.rollout.listing_style,
        )
    from selskill.policy.init_sft import build_init_policy_from_config

    return build_init_policy_from_config(
        recipe.init,
        out,
        games_dir=recipe.run.games_dir,
        seed=recipe.seed,
        fmt=recipe.rollout.turn_format(),
        listing_style=recipe.rollout.listing_style,
    )


def run_train_stage(argv: list[str]) -> None:
    """Train in this process, or relaunch under the recipe's accelerate config (train_accelerate_config)."""
    from selskill.train.run import launch

    if launch(argv) != 0:
        raise RuntimeError("the train stage failed (see its output above)")


def run_round(recipe: Recipe, argv: list[str]) -> dict:
    run = recipe.run
    if run.round < 1:
        resolve_round_policy(run, recipe.policy)  # says what round 0 is and which command builds it
    ensure_games(run, recipe.games)
    if run.round == 1:
        ensure_init_policy(recipe)
        # the starting policy (built or given) is Table 1's first row and the paired baseline; an
        # experiment whose round 0 links another's (the replication's variants) leaves that eval to it
        init_run = dataclasses.replace(run, round=0, rank=0, world_size=1, redo=False)
        start = resolve_round_policy(run, recipe.policy)[0]
        if not round_dir(run.runs_dir, run.exp, 0).is_symlink():
            run_eval(init_run, recipe.policy, recipe.rollout, recipe.eval, recipe.seed, model_path=start)
    for r in _ranks(run):
        run_sample(r, recipe.policy, recipe.rollout, recipe.sample, recipe.seed)
    for r in _ranks(run):
        run_branch(r, recipe.policy, recipe.rollout, recipe.branch, recipe.seed)
    for r in _ranks(run):
        run_fork(r, recipe.policy, recipe.rollout, recipe.fork, recipe.seed)
    for r in _ranks(run):
        run_label(r, recipe.label, recipe.train.window_turns or -1, recipe.seed)
    run_train_stage(argv)
    metrics = None
    for r in _ranks(run):
        metrics = run_eval(r, recipe.policy, recipe.rollout, recipe.eval, recipe.seed) or metrics
    summary = round_summary(run)
    print(format_summary(summary))
    return summary


def round_summary(run) -> dict:
    rd = round_dir(run.runs_dir, run.exp, run.round)
    out = {"round": run.round, "exp": run.exp, "dir": str(rd), "stages": {}, "benchmark": run.benchmark}
    for name in ("sample", "branch", "fork", "label", "eval"):
        stage = StageDir.of(run.runs_dir, run.exp, run.round, name)
        out["stages"][name] = collect_stats(stage)
    label_stats = [
        json.loads(p.read_text())
        for p in sorted(StageDir.of(run.runs_dir, run.exp, run.round, "label").stats.glob("*.json"))
    ]
    kinds: dict = {}
    for s in label_stats:
        for k, v in s.get("yield", {}).get("pairs_by_kind", {}).items():
            kinds[k] = kinds.get(k, 0) + v
    out["pairs_by_kind"] = kinds
    for r in (run.round - 1, run.round):
        path = round_dir(run.runs_dir, run.exp, r) / "eval" / "metrics.json"
        if path.exists():
            out[f"metrics_round_{r}"] = json.loads(path.read_text())
    out["paired_sr"] = paired_sr_vs_previous(run)
    return out


def _eval_outcomes(runs_dir: str, exp: str, r: int) -> list[dict] | None:
    from selskill.stages.common import read_stage

    stage = StageDir.of(runs_dir, exp, r, "eval")
    try:
        table = read_stage(stage, "rollout")
    except FileNotFoundError:
        return None
    return table.select(["task_id", "success"]).to_pylist()


def paired_sr_vs_previous(run) -> dict:
    """Per split: SR(round r) - SR(round r-1) on the same games, with a paired bootstrap CI."""
    return paired_sr_between(run.runs_dir, run.exp, run.round - 1, run.round)


def paired_sr_between(runs_dir: str, exp: str, a: int, b: int) -> dict:
    """Per split: SR(round b) - SR(round a) on the same games ({} unless both were evaluated)."""
    from selskill.metrics import paired_sr_difference

    before, after = _eval_outcomes(runs_dir, exp, a), _eval_outcomes(runs_dir, exp, b)
    if not before or not after:
        return {}
    out = {}
    for split in sorted({x["task_id"].split("/", 1)[0] for x in after}):
        a = [x for x in before if x["task_id"].startswith(f"{split}/")]
        b = [x for x in after if x["task_id"].startswith(f"{split}/")]
        out[split] = paired_sr_difference(a, b)
    return out


def format_summary(summary: dict) -> str:
    from selskill.metrics import LABELS, METRICS, format_value

    lines = [f"round {summary['round']} of {summary['exp']!r}: {summary['dir']}"]
    for name, s in summary["stages"].items():
        lines.append(
            f"  {name:<7} rows={s['rows']:<6} seconds={s['seconds']:.0f}"
            + (f" failures={s['failures']}" if s["failures"] else "")
            + (f" games_skipped={s['games_skipped']}" if s.get("games_skipped") else "")
        )
    lines.append(f"  pairs: {summary['pairs_by_kind'] or 'none'}")
    for key in sorted(k for k in summary if k.startswith("metrics_round_")):
        for split, m in summary[key]["splits"].items():
            o = m["overall"]
            vals = "  ".join(
                f"{LABELS[x]}={format_value(x, o.get(x), o.get('ci', {}).get(x))}" for x in METRICS
            )
            lines.append(f"  {key.replace('metrics_', '')} {split} (n={o['episodes']}): {vals}")
    prev = "init" if summary["round"] == 1 else f"R{summary['round'] - 1}"
    things = "tasks" if summary.get("benchmark") == "bfcl" else "games"
    for split, d in (summary.get("paired_sr") or {}).items():
        if d.get("diff") is not None:
            lo, hi = d["ci"]
            lines.append(
                f"  ΔSR R{summary['round']} - {prev} {split} (same {d['tasks']} {things}, paired 95% CI): "
                f"{100 * d['diff']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] points"
            )
    return "\n".join(lines)
