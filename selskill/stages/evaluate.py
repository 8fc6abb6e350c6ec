"""Evaluation: greedy episodes on fixed held-out splits, with the paper's metrics.

Rows are full rollouts (same schema as sampling), so every metric can be recomputed from
the shards; `metrics.json` holds the point estimates and bootstrap intervals, overall and
per task type, for each split.
"""

from __future__ import annotations

import json
from pathlib import Path

from selskill.agent.benchmarks import DEFAULT_BENCHMARK, benchmark
from selskill.agent.runner import EpisodeSpec
from selskill.config.rollout import RolloutConfig
from selskill.config.run import PolicyConfig, RunConfig
from selskill.config.stages import EvalConfig
from selskill.data.layout import StageDir
from selskill.data.shards import write_json_atomic
from selskill.metrics import compute_metrics, metrics_by_task_type
from selskill.stages.common import (
    StageInputs,
    StageStats,
    balanced_tasks,
    progress_bar,
    read_stage,
    record_skipped_games,
    run_rank,
    shard_items,
    stable_seed,
)
from selskill.stages.context import game_index, load_policy, make_runner

CODE_VERSION = 5  # bump when a change alters the rows this stage writes (completed ranks are then refused)


def eval_policy_path(run: RunConfig) -> str:
    """Round r evaluates round r's trained model; round 0 evaluates the init policy."""
    from selskill.data.layout import round_dir

    path = round_dir(run.runs_dir, run.exp, run.round) / "train" / "model"
    if not path.is_dir():
        raise FileNotFoundError(f"no trained model at {path}: train round {run.round} first")
    return str(path)


def evaluate_rows(
    policy,
    run: RunConfig,
    rollout: RolloutConfig,
    cfg: EvalConfig,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    games_root: str | None = None,
    stats: StageStats | None = None,
) -> list[dict]:
    rows = []
    for split in cfg.splits:
        if games_root is not None:  # a directory of the env's tasks (selskill eval --games)
            from_dir = benchmark(run.benchmark).index_from_dir
            if from_dir is None:
                raise ValueError(
                    f"--games names a games directory; benchmark {run.benchmark} has its own tasks"
                )
            index = from_dir(run, games_root, split)
        else:
            index = game_index(run, split)
        record_skipped_games(stats, index)
        tasks = balanced_tasks(index.games, cfg.eval_max_tasks)
        mine = shard_items(tasks, rank, world_size)
        by_id = index.by_id()
        runner = make_runner(
            policy,
            index,
            rollout,
            cfg.eval_temperature,
            mode=cfg.eval_mode,
            listing_size=cfg.eval_listing_size,
        )
        specs = [
            EpisodeSpec(
                f"eval/r{run.round}/{t}",
                t,
                stable_seed(seed, "eval", t),
                meta={"task_type": by_id[t].task_type, "mode": cfg.eval_mode},
                split=split,
            )
            for t in mine
        ]
        bar = progress_bar(len(specs), f"eval {split}")
        for spec, row in zip(specs, runner.run(specs, progress=bar.update), strict=True):
            rows.append(
                {
                    "rollout_id": spec.episode_id,
                    "run": run.exp,
                    "round": run.round,
                    "task_id": spec.task_id,
                    "task_type": spec.meta["task_type"],
                    "sample_idx": 0,
                    "policy_id": policy.policy_id,
                    "seed": spec.seed,
                    **row,
                }
            )
        bar.close()
    return rows


def summarize(rows: list[dict], cfg: EvalConfig, seed: int, env: str = DEFAULT_BENCHMARK) -> dict:
    """Metrics per split, overall and per task type (BFCL: per category); steps as `env` counts them."""
    steps = benchmark(env).steps.episode
    out = {}
    for split in cfg.splits:
        split_rows = [r for r in rows if r["task_id"].startswith(f"{split}/")]
        out[split] = {
            "overall": compute_metrics(split_rows, cfg.eval_bootstrap, seed, steps),
            "by_task_type": metrics_by_task_type(split_rows, cfg.eval_bootstrap, seed, steps),
        }
    return out


def run_eval(
    run: RunConfig,
    pol: PolicyConfig,
    rollout: RolloutConfig,
    cfg: EvalConfig,
    seed: int,
    model_path: str | None = None,
) -> dict | None:
    """Evaluate this rank's tasks; the last rank to finish writes metrics.json for the round."""
    stage = StageDir.of(run.runs_dir, run.exp, run.round, cfg.stage)
    path = model_path or eval_policy_path(run)

    def compute(stats: StageStats) -> list[dict]:
        policy = load_policy(pol, path, rollout, seed)
        rows = evaluate_rows(policy, run, rollout, cfg, seed, run.rank, run.world_size, stats=stats)
        stats.tokens = sum(len(r["token_ids"]) for r in rows)
        return rows

    inputs = StageInputs([run, pol, rollout, cfg], seed, CODE_VERSION, policy=path)
    computed = run_rank(stage, "rollout", run, inputs, compute)
    if len(stage.completed_ranks()) < run.world_size:
        return None
    if not computed and (stage.path / "metrics.json").is_file():
        return load_metrics(stage.path / "metrics.json")  # nothing new: keep what was written
    rows = read_stage(stage, "rollout", run.world_size).to_pylist()
    metrics = {
        "round": run.round,
        "exp": run.exp,
        "mode": cfg.eval_mode,
        "splits": summarize(rows, cfg, seed, run.benchmark),
    }
    if cfg.eval_mode == "capability_check":
        from selskill.agent.eval_modes import capability_check_stats

        metrics["capability_check"] = {
            split: capability_check_stats([r for r in rows if r["task_id"].startswith(f"{split}/")])
            for split in cfg.splits
        }
    spec = benchmark(run.benchmark)
    if spec.tags_metrics:
        metrics.update(benchmark=spec.name, steps=spec.steps.what)
    write_json_atomic(metrics, stage.path / "metrics.json")
    return metrics


def load_metrics(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def format_overall(overall: dict) -> str:
    """One split's headline metrics with their intervals, as every command prints them."""
    from selskill.metrics import LABELS, METRICS, format_value

    ci = overall.get("ci", {})
    return "  ".join(f"{LABELS[k]}={format_value(k, overall.get(k), ci.get(k))}" for k in METRICS)


def evaluate_model(recipe, model: str, games: str | None = None, out: str | None = None) -> dict:
    """`selskill eval`: any model on any games, outside a round (no run directory, no completion markers);
    `out` also keeps the rows and the metrics."""
    from selskill.data.shards import write_shard

    policy = load_policy(recipe.policy, model, recipe.rollout, recipe.seed)
    rows = evaluate_rows(policy, recipe.run, recipe.rollout, recipe.eval, recipe.seed, games_root=games)
    summary = summarize(rows, recipe.eval, recipe.seed, recipe.run.benchmark)
    for split, m in summary.items():
        print(f"{split} (n={m['overall']['episodes']}): {format_overall(m['overall'])}")
    if out:
        write_shard(rows, f"{out}/shards/00000.parquet", "rollout")
        write_json_atomic({"model": model, "splits": summary}, f"{out}/metrics.json")
    return summary
