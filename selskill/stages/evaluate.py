"""Evaluation: greedy episodes on fixed held-out splits, with the paper's metrics.

Rows are full rollouts (same schema as sampling), so every metric can be recomputed from
the shards; `metrics.json` holds the point estimates and bootstrap intervals, overall and
per task type, for each split.

With `eval_headroom` the first split's tasks are also played without skills (`no_skills`),
and `metrics.json` gets the skills' headroom of that split (`selskill.measure.headroom`). Those
episodes are a stage of their own next to the eval stage (`EvalConfig.headroom_stage`,
recording what it plays as its inputs; each rank computes its share after its eval share,
and the round counts the eval complete once both are), so the eval stage keeps one episode
per task in its own mode for everything that reads it (metrics, paired SR across rounds,
the report, `selskill.load_eval`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from selskill.agent.episode_host import EpisodeSpec
from selskill.config.rollout import RolloutConfig
from selskill.config.run import RunConfig
from selskill.config.stages import EvalConfig
from selskill.data.contract import read_stage
from selskill.data.inputs import StageInputs
from selskill.data.rank_writer import run_rank
from selskill.data.shards import write_json_atomic
from selskill.data.stage_stats import StageStats
from selskill.measure.headroom import invoked_skills, skill_headroom
from selskill.measure.metrics import compute_metrics, metrics_by_task_type
from selskill.registry import benchmark
from selskill.stages.policy_source import eval_policy_path, load_policy
from selskill.stages.round_step import PolicyStep
from selskill.stages.runner_setup import eval_library, make_runner, play_episodes, rollout_row
from selskill.stages.sharding import shard_items, stable_seed
from selskill.stages.task_source import (
    balanced_tasks,
    games_identity,
    record_skipped_games,
    split_index,
    task_texts,
)
from selskill.stages.wandb_log import log_stage

CODE_VERSION = 6  # bump when a change alters the rows this stage writes (completed ranks are then refused)


def headroom_config(cfg: EvalConfig) -> EvalConfig:
    """What `eval_headroom` plays besides the eval: the first eval split, without skills."""
    return dataclasses.replace(cfg, eval_mode="no_skills", eval_splits=cfg.splits[0], eval_headroom=False)


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
    id_prefix: str = "eval",
) -> list[dict]:
    """`id_prefix` starts each row's `rollout_id` (`<prefix>/r<round>/<task id>`); the episode seeds
    do not depend on it, so the headroom's no-skills episodes get the seeds of the eval's."""
    rows = []
    for split in cfg.splits:
        index = split_index(run, split, games_root)
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
            settings=run.benchmark_settings,
        )
        specs = [
            EpisodeSpec(
                f"{id_prefix}/r{run.round}/{t}",
                t,
                stable_seed(seed, "eval", t),
                meta={"task_type": by_id[t].task_type, "mode": cfg.eval_mode},
                split=split,
            )
            for t in mine
        ]
        episodes = play_episodes(runner, specs, f"eval {split}")
        rows += [
            rollout_row(spec, episode, run, policy.policy_id)
            for spec, episode in zip(specs, episodes, strict=True)
        ]
    return rows


def summarize(rows: list[dict], cfg: EvalConfig, seed: int, env: str) -> dict:
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


def headroom_summary(
    rows: list[dict],
    without: list[dict],
    run: RunConfig,
    rollout: RolloutConfig,
    cfg: EvalConfig,
    seed: int,
    games_root: str | None = None,
) -> dict:
    """{first eval split: `skill_headroom` of its eval rows vs the no-skills rows `without`}, with
    Panel B over the library the eval mode offered and the turn budget the episodes were played
    with (`max_decisions`, what `selskill.measure.headroom.within_budget` needs to cut them to a smaller one)."""
    split = cfg.splits[0]
    mine = [r for r in rows if r["task_id"].startswith(f"{split}/")]
    called = sorted(r["task_id"] for r in mine if invoked_skills(r))
    texts = task_texts(split_index(run, split, games_root), called) if called else {}
    library = eval_library(rollout, run.benchmark, cfg.eval_mode, cfg.eval_listing_size)
    headroom = skill_headroom(mine, without, library, texts, cfg.eval_bootstrap, seed)
    return {split: headroom | {"max_decisions": rollout.max_decisions}}


def format_headroom(split: str, h: dict) -> str:
    """One split's headroom on a line, as `selskill eval` and the round summary print it."""
    n, c = h["tasks"], h["counts"]
    if not n:
        return f"{split} headroom: no task played both with and without skills"
    ci = h.get("net_gain_ci")
    net = f"{100 * h['net_gain']:+.1f}" + (f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if ci else "")
    return (
        f"{split} headroom (n={n}, with vs without skills): positive {c['positive']}, negative {c['negative']}, "
        f"both won {c['both_won']}, both lost {c['both_lost']}; net {net} points, "
        f"oracle gain {100 * h['oracle_gain']:+.1f} points"
    )


@dataclass
class EvalStep(PolicyStep):
    """Evaluate this rank's tasks (with `eval_headroom`, then its no-skills share); the last rank to
    finish writes metrics.json for the round. `model_path`: the policy to play instead of round r's
    trained model (the init stage's round-0 eval)."""

    name = "eval"
    doc = "greedy episodes on the held-out splits"

    cfg: EvalConfig  # its own section (the field of `RoundStep`, typed)

    model_path: str | None = None

    def stage_names(self) -> list[str]:
        return [self.cfg.stage, self.cfg.headroom_stage] if self.cfg.eval_headroom else [self.cfg.stage]

    def log(self, run: RunConfig) -> None:
        log_stage(run, self.name, self.stage_names()[1:])

    def compute(self, run: RunConfig) -> dict | None:
        cfg, path = self.cfg, self.model_path or eval_policy_path(run)
        # loaded once, and only by a rank that plays
        policy = functools.cache(lambda: load_policy(self.policy, path, self.rollout, self.seed))

        def play(what: EvalConfig, id_prefix: str):
            def rows(stats: StageStats) -> list[dict]:
                out = evaluate_rows(
                    policy(),
                    run,
                    self.rollout,
                    what,
                    self.seed,
                    run.rank,
                    run.world_size,
                    stats=stats,
                    id_prefix=id_prefix,
                )
                stats.tokens = sum(len(r["token_ids"]) for r in out)
                return out

            return rows

        def inputs(what: EvalConfig, games: dict) -> StageInputs:
            return StageInputs(
                [run, self.policy, self.rollout, what], self.seed, CODE_VERSION, policy=path, games=games
            )

        games = games_identity(run, cfg.splits)
        # first: a changed recipe is refused here
        computed = run_rank(self.stage_dir(), "rollout", run, inputs(cfg, games), play(cfg, "eval"))
        if cfg.eval_headroom:
            bare = headroom_config(cfg)
            played = inputs(bare, {s: games[s] for s in bare.splits})
            partner = self.stage_dir(cfg.headroom_stage)
            computed = run_rank(partner, "rollout", run, played, play(bare, cfg.headroom_stage)) or computed
        if any(len(self.stage_dir(n).completed_ranks()) < run.world_size for n in self.stage_names()):
            return None
        written = self.stage_dir().path / "metrics.json"
        if not computed and written.is_file():
            return load_metrics(written)  # nothing new: keep what was written
        return self.write_metrics(run)

    def write_metrics(self, run: RunConfig) -> dict:
        """metrics.json of the complete stage: per split, overall and per task type (and the headroom)."""
        cfg, stage = self.cfg, self.stage_dir()
        rows = read_stage(stage, "rollout", run.world_size).to_pylist()
        metrics = {
            "round": run.round,
            "exp": run.exp,
            "mode": cfg.eval_mode,
            "splits": summarize(rows, cfg, self.seed, run.benchmark),
        }
        if cfg.eval_headroom:
            without = read_stage(self.stage_dir(cfg.headroom_stage), "rollout", run.world_size).to_pylist()
            metrics["headroom"] = headroom_summary(rows, without, run, self.rollout, cfg, self.seed)
        if cfg.eval_mode == "capability_check":
            from selskill.agent.eval_modes import capability_check_stats

            metrics["capability_check"] = {
                split: capability_check_stats([r for r in rows if r["task_id"].startswith(f"{split}/")])
                for split in cfg.splits
            }
        spec = benchmark(run.benchmark)
        metrics.update(benchmark=spec.name, steps=spec.steps.what)
        write_json_atomic(metrics, stage.path / "metrics.json")
        return metrics


def load_metrics(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def format_overall(overall: dict) -> str:
    """One split's headline metrics with their intervals, as every command prints them."""
    from selskill.measure.metrics import LABELS, METRICS, format_value

    ci = overall.get("ci", {})
    return "  ".join(f"{LABELS[k]}={format_value(k, overall.get(k), ci.get(k))}" for k in METRICS)


def evaluate_model(recipe, model: str, games: str | None = None, out: str | None = None) -> dict:
    """`selskill eval`: any model on any games, outside a round (no run directory, no completion markers);
    `out` also keeps the rows and the metrics (with `eval_headroom`, the no-skills rows in `out/headroom/`)."""
    from selskill.data.shards import write_shard

    run, rollout, cfg, seed = recipe.run, recipe.rollout, recipe.eval, recipe.seed
    policy = load_policy(recipe.policy, model, rollout, seed)
    rows = evaluate_rows(policy, run, rollout, cfg, seed, games_root=games)
    summary = summarize(rows, cfg, seed, run.benchmark)
    for split, m in summary.items():
        print(f"{split} (n={m['overall']['episodes']}): {format_overall(m['overall'])}")
    metrics = {"model": model, "splits": summary}
    without = []
    if cfg.eval_headroom:
        without = evaluate_rows(
            policy, run, rollout, headroom_config(cfg), seed, games_root=games, id_prefix=cfg.headroom_stage
        )
        metrics["headroom"] = headroom_summary(rows, without, run, rollout, cfg, seed, games)
        for split, h in metrics["headroom"].items():
            print(format_headroom(split, h))
    if out:
        write_shard(rows, f"{out}/shards/00000.parquet", "rollout")
        if cfg.eval_headroom:
            write_shard(without, f"{out}/headroom/shards/00000.parquet", "rollout")
        write_json_atomic(metrics, f"{out}/metrics.json")
    return summary
