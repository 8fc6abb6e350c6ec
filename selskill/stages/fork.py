"""Fork stage: invoke and skip continuations from the exact prefix of every branch point.

Each continuation copies the source rollout's tokens up to the decision, replays the
environment to the same state, forces the decision's opening (`<tool_call>{"name":
"<skill>"` or `<action>`) and lets the same policy continue under the same prompt and
skill listing to the episode's end. Nothing but the decision's own opening is inserted,
so no intervention text reaches the training context. The prefix is prefilled once per
branch point and shared by its K continuations. Where the prefix's messages end and which
split the task is in are read off the source rollout's records, never off counts or ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from selskill.agent.episode_host import EpisodeSpec, ForkStart
from selskill.agent.turn_format import forced_prefix, render_skill_call
from selskill.config.run import RunConfig
from selskill.config.stages import ForkConfig
from selskill.data.contract import read_stage
from selskill.data.inputs import StageInputs
from selskill.data.rank_writer import recorded_games, run_rank
from selskill.data.records import BranchPoint, Episode, Fork, Played, Rollout
from selskill.data.stage_stats import StageStats
from selskill.stages.policy_source import load_policy, sampling_policy_path
from selskill.stages.round_step import PolicyStep
from selskill.stages.runner_setup import make_runner, play_episodes
from selskill.stages.sharding import shard_items, stable_seed
from selskill.stages.task_source import game_index, games_identity, record_skipped_games

CODE_VERSION = 6  # bump when a change alters the rows this stage writes (completed ranks are then refused)


def fork_start(source: Played, branch: BranchPoint, arm: str) -> ForkStart:
    """Where `arm` of `branch` of the `source` rollout starts.

    The branch turn's listing travels with the prefix: its tokens show that listing, so it is
    the one the forced turn is parsed against, and the invoke arm's skill must be in it."""
    t, offset = branch.turn_index, branch.token_offset
    turns = source.turns[:t]
    messages = json.loads(source.messages)[: source.turns[t].message_index]
    listed = list(source.turns[t].listed)
    if arm == "invoke" and branch.candidate_skill not in listed:
        raise ValueError(
            f"branch {branch.branch_id}: candidate skill {branch.candidate_skill!r} is not among the skills "
            f"its turn listed ({', '.join(listed) or 'none'}); rerun the branch stage"
        )
    if arm == "invoke":
        text = forced_prefix("invoke", branch.candidate_skill)
        canonical = render_skill_call(branch.candidate_skill)  # the call as demonstrations write it
    else:
        text = canonical = forced_prefix("skip")
    return ForkStart(
        token_ids=source.token_ids[:offset],
        logprob=source.logprob[:offset],
        entropy=source.entropy[:offset],
        role=source.role[:offset],
        turn=source.turn[:offset],
        turns=turns,
        messages=messages,
        env_commands=[c for turn in turns for c in (turn.commands or [])],
        env_steps_before=branch.source_env_steps_before,
        forced_text=text,
        forced_canonical=canonical,
        cache_from=branch.branch_id,
        listed=listed,
    )


def fork_row(episode: Episode, spec: EpisodeSpec, round_: int) -> Fork:
    """The fork row of continuation `episode` of `spec` (its branch point and arm in `spec.meta`)."""
    b = spec.meta["branch"]
    return Fork.of_episode(
        episode,
        fork_id=spec.episode_id,
        branch_id=b.branch_id,
        rollout_id=b.rollout_id,
        task_id=b.task_id,
        task_type=b.task_type,
        round=round_,
        arm=spec.meta["arm"],
        k=spec.meta["k"],
        seed=spec.seed,
        prefix_len=b.token_offset,
        env_steps_after_branch=episode.env_steps - b.source_env_steps_before,
        # agent decisions from the branch turn on (the label's efficiency measure)
        steps_after_branch=episode.n_turns - b.turn_index,
        malformed_after_branch=sum(1 for t in episode.turns[b.turn_index :] if t.kind == "malformed"),
    )


@dataclass
class ForkStep(PolicyStep):
    name = "fork"
    doc = "invoke and skip continuations from each point"

    cfg: ForkConfig  # its own section (the field of `RoundStep`, typed)

    def specs(
        self, run: RunConfig, branches: list[BranchPoint], sources: dict[str, Rollout]
    ) -> list[EpisodeSpec]:
        """`fork_k_invoke` and `fork_k_skip` continuations of each branch point, each seeded by its id."""
        specs = []
        for b in branches:
            source = sources[b.rollout_id]
            for arm, k_arm in (("invoke", self.cfg.fork_k_invoke), ("skip", self.cfg.fork_k_skip)):
                start = fork_start(source, b, arm)
                for k in range(k_arm):
                    fid = f"{b.branch_id}/{arm}{k}"
                    specs.append(
                        EpisodeSpec(
                            fid,
                            b.task_id,
                            stable_seed(self.seed, run.round, "fork", fid),
                            fork=start,
                            meta={"branch": b, "arm": arm, "k": k},
                            split=source.split,
                            pseudo_skills=tuple(source.pseudo_skills or ()),
                        )
                    )
        return specs

    def compute(self, run: RunConfig) -> bool:
        path = sampling_policy_path(run, self.policy)

        def rows(stats: StageStats) -> list[dict]:
            branches = read_stage(self.stage_dir("branch"), "branch", run.world_size).to_pylist()
            mine = shard_items(
                sorted((BranchPoint.from_row(b) for b in branches), key=lambda b: b.branch_id),
                run.rank,
                run.world_size,
            )
            if not mine:
                return []
            needed = {b.rollout_id for b in mine}
            rollouts = read_stage(self.stage_dir("sample"), "rollout", run.world_size).to_pylist()
            sources = {r["rollout_id"]: Rollout.from_row(r) for r in rollouts if r["rollout_id"] in needed}
            split = sources[mine[0].rollout_id].split  # one sample stage: one split
            index = game_index(run, split)
            record_skipped_games(stats, index)
            policy = load_policy(self.policy, path, self.rollout, self.seed)
            runner = make_runner(
                policy,
                index,
                self.rollout,
                self.cfg.fork_temperature,
                self.cfg.fork_top_p,
                settings=run.benchmark_settings,
            )
            specs = self.specs(run, mine, sources)
            episodes = play_episodes(runner, specs, f"fork r{run.round} rank {run.rank}")
            out = []
            for spec, episode in zip(specs, episodes, strict=True):
                stats.tokens += len(episode.token_ids) - spec.meta["branch"].token_offset
                if episode.termination == "error":
                    stats.failures["env_error"] += 1
                out.append(fork_row(episode, spec, run.round).to_row())
            tps = policy.stats()
            stats.extra.update(
                branches=len(mine),
                generated_tokens=tps.generated_tokens,
                tokens_per_second=round(tps.tokens_per_second, 1),
            )
            return out

        # the games the sampled episodes were played on, as they are now (a change since is refused)
        games = games_identity(run, sorted(recorded_games(self.stage_dir("sample"))))
        inputs = StageInputs(
            [run, self.policy, self.rollout, self.cfg],
            self.seed,
            CODE_VERSION,
            policy=path,
            upstream=("sample", "branch"),
            games=games,
        )
        return run_rank(self.stage_dir(), "fork", run, inputs, rows)
