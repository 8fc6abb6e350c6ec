"""Sample stage: K rollouts per task with temperature sampling from round r-1's policy.

Every rollout keeps the exact tokens with per-token logprob and entropy, which is what the
branch stage scores and the fork stage continues from.
"""

from __future__ import annotations

from selskill.agent.runner import EpisodeSpec
from selskill.config.rollout import RolloutConfig
from selskill.config.run import PolicyConfig, RunConfig
from selskill.config.stages import SampleConfig
from selskill.data.inputs import StageInputs
from selskill.data.layout import StageDir
from selskill.stages.common import (
    StageStats,
    balanced_tasks,
    progress_bar,
    record_skipped_games,
    run_rank,
    shard_items,
    stable_seed,
)
from selskill.stages.context import game_index, games_identity, load_policy, make_runner, sampling_policy_path

CODE_VERSION = 6  # bump when a change alters the rows this stage writes (completed ranks are then refused)


def task_list(
    run: RunConfig, split: str, max_tasks: int, stats: StageStats | None = None
) -> tuple[list, object]:
    index = game_index(run, split)
    record_skipped_games(stats, index)
    return balanced_tasks(index.games, max_tasks), index


def rollout_id(round_: int, task_id: str, k: int) -> str:
    return f"r{round_}/{task_id}/s{k}"


def run_sample(
    run: RunConfig, pol: PolicyConfig, rollout: RolloutConfig, cfg: SampleConfig, seed: int
) -> bool:
    stage = StageDir.of(run.runs_dir, run.exp, run.round, "sample")
    path = sampling_policy_path(run, pol)

    def compute(stats: StageStats) -> list[dict]:
        tasks, index = task_list(run, cfg.sample_split, cfg.sample_max_tasks, stats)
        mine = shard_items(tasks, run.rank, run.world_size)
        policy = load_policy(pol, path, rollout, seed)
        runner = make_runner(
            policy, index, rollout, cfg.sample_temperature, cfg.sample_top_p, settings=run.benchmark_settings
        )
        by_id = index.by_id()
        stats.extra["games_patched_from_old_grammar"] = index.patched
        specs = []
        for task in mine:
            for k in range(cfg.sample_k):
                rid = rollout_id(run.round, task, k)
                specs.append(
                    EpisodeSpec(
                        rid,
                        task,
                        stable_seed(seed, run.round, "sample", task, k),
                        meta={"k": k, "task_type": by_id[task].task_type},
                        split=cfg.sample_split,
                    )
                )
        bar = progress_bar(len(specs), f"sample r{run.round} rank {run.rank}")
        rows = runner.run(specs, progress=bar.update)
        bar.close()
        out = []
        for spec, row in zip(specs, rows, strict=True):
            stats.tokens += len(row["token_ids"])
            if row["termination"] == "error":
                stats.failures["env_error"] += 1
            out.append(
                {
                    "rollout_id": spec.episode_id,
                    "run": run.exp,
                    "round": run.round,
                    "task_id": spec.task_id,
                    "task_type": spec.meta["task_type"],
                    "sample_idx": spec.meta["k"],
                    "policy_id": policy.policy_id,
                    "seed": spec.seed,
                    **row,
                }
            )
        tps = policy.stats()
        stats.extra.update(
            generated_tokens=tps.generated_tokens,
            generate_seconds=round(tps.seconds, 2),
            tokens_per_second=round(tps.tokens_per_second, 1),
            success_rate=round(sum(r["success"] for r in out) / max(1, len(out)), 4),
        )
        return out

    games = games_identity(run, [cfg.sample_split])
    inputs = StageInputs([run, pol, rollout, cfg], seed, CODE_VERSION, policy=path, games=games)
    return run_rank(stage, "rollout", run, inputs, compute)
