"""Sample stage: K rollouts per task with temperature sampling from round r-1's policy.

Every rollout keeps the exact tokens with per-token logprob and entropy, which is what the
branch stage scores and the fork stage continues from.
"""

from __future__ import annotations

from dataclasses import dataclass

from selskill.agent.episode_host import EpisodeSpec
from selskill.config.run import RunConfig
from selskill.config.stages import SampleConfig
from selskill.data.inputs import StageInputs
from selskill.data.rank_writer import run_rank
from selskill.data.stage_stats import StageStats
from selskill.stages.policy_source import load_policy, sampling_policy_path
from selskill.stages.round_step import PolicyStep
from selskill.stages.runner_setup import make_runner, play_episodes, rollout_row
from selskill.stages.sharding import shard_items, stable_seed
from selskill.stages.task_source import games_identity, task_list

CODE_VERSION = 6  # bump when a change alters the rows this stage writes (completed ranks are then refused)


def rollout_id(round_: int, task_id: str, k: int) -> str:
    return f"r{round_}/{task_id}/s{k}"


@dataclass
class SampleStep(PolicyStep):
    name = "sample"
    doc = "K rollouts per task from round r-1's policy"

    cfg: SampleConfig  # its own section (the field of `RoundStep`, typed)

    def specs(self, run: RunConfig, tasks: list[str], index) -> list[EpisodeSpec]:
        """The rank's episodes: `sample_k` of each of its tasks, each seeded by what it is."""
        by_id = index.by_id()
        return [
            EpisodeSpec(
                rollout_id(run.round, task, k),
                task,
                stable_seed(self.seed, run.round, "sample", task, k),
                meta={"k": k, "task_type": by_id[task].task_type},
                split=self.cfg.sample_split,
            )
            for task in shard_items(tasks, run.rank, run.world_size)
            for k in range(self.cfg.sample_k)
        ]

    def compute(self, run: RunConfig) -> bool:
        cfg, path = self.cfg, sampling_policy_path(run, self.policy)

        def rows(stats: StageStats) -> list[dict]:
            tasks, index = task_list(run, cfg.sample_split, cfg.sample_max_tasks, stats)
            specs = self.specs(run, tasks, index)
            policy = load_policy(self.policy, path, self.rollout, self.seed)
            runner = make_runner(
                policy,
                index,
                self.rollout,
                cfg.sample_temperature,
                cfg.sample_top_p,
                settings=run.benchmark_settings,
            )
            stats.extra.update(index.stats())
            episodes = play_episodes(runner, specs, f"sample r{run.round} rank {run.rank}")
            out = []
            for spec, episode in zip(specs, episodes, strict=True):
                stats.tokens += len(episode.token_ids)
                if episode.termination == "error":
                    stats.failures["env_error"] += 1
                out.append(rollout_row(spec, episode, run, policy.policy_id))
            tps = policy.stats()
            stats.extra.update(
                generated_tokens=tps.generated_tokens,
                generate_seconds=round(tps.seconds, 2),
                tokens_per_second=round(tps.tokens_per_second, 1),
                success_rate=round(sum(r["success"] for r in out) / max(1, len(out)), 4),
            )
            return out

        games = games_identity(run, [cfg.sample_split])
        inputs = StageInputs(
            [run, self.policy, self.rollout, cfg], self.seed, CODE_VERSION, policy=path, games=games
        )
        return run_rank(self.stage_dir(), "rollout", run, inputs, rows)
