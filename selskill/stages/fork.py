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

from selskill.agent.runner import EpisodeSpec, ForkStart
from selskill.agent.turn_format import forced_prefix, render_skill_call
from selskill.config.rollout import RolloutConfig
from selskill.config.run import PolicyConfig, RunConfig
from selskill.config.stages import ForkConfig
from selskill.data.contract import read_stage
from selskill.data.inputs import StageInputs
from selskill.data.layout import StageDir
from selskill.data.records import BranchPoint, Fork, Turn
from selskill.stages.common import (
    StageStats,
    progress_bar,
    record_skipped_games,
    recorded_games,
    run_rank,
    shard_items,
    stable_seed,
)
from selskill.stages.context import game_index, games_identity, load_policy, make_runner, sampling_policy_path

CODE_VERSION = 6  # bump when a change alters the rows this stage writes (completed ranks are then refused)


def fork_start(source: dict, branch: BranchPoint, arm: str) -> ForkStart:
    """The branch turn's listing travels with the prefix: its tokens show that listing, so it is
    the one the forced turn is parsed against, and the invoke arm's skill must be in it."""
    t, offset = branch.turn_index, branch.token_offset
    turns = source["turns"][:t]
    messages = json.loads(source["messages"])[: source["turns"][t]["message_index"]]
    listed = list(source["turns"][t]["listed"])
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
        token_ids=source["token_ids"][:offset],
        logprob=source["logprob"][:offset],
        entropy=source["entropy"][:offset],
        role=source["role"][:offset],
        turn=source["turn"][:offset],
        turns=turns,
        messages=messages,
        env_commands=[c for turn in turns for c in (turn["commands"] or [])],
        env_steps_before=branch.source_env_steps_before,
        forced_text=text,
        forced_canonical=canonical,
        cache_from=branch.branch_id,
        listed=listed,
    )


def run_fork(run: RunConfig, pol: PolicyConfig, rollout: RolloutConfig, cfg: ForkConfig, seed: int) -> bool:
    stage = StageDir.of(run.runs_dir, run.exp, run.round, "fork")
    path = sampling_policy_path(run, pol)

    def compute(stats: StageStats) -> list[dict]:
        sd = lambda name: StageDir.of(run.runs_dir, run.exp, run.round, name)  # noqa: E731
        branches = [
            BranchPoint.from_row(b) for b in read_stage(sd("branch"), "branch", run.world_size).to_pylist()
        ]
        mine = shard_items(sorted(branches, key=lambda b: b.branch_id), run.rank, run.world_size)
        if not mine:
            return []
        rollouts = read_stage(sd("sample"), "rollout", run.world_size)
        needed = {b.rollout_id for b in mine}
        sources = {r["rollout_id"]: r for r in rollouts.to_pylist() if r["rollout_id"] in needed}
        split = sources[mine[0].rollout_id]["split"]  # one sample stage: one split
        index = game_index(run, split)
        record_skipped_games(stats, index)
        policy = load_policy(pol, path, rollout, seed)
        runner = make_runner(
            policy, index, rollout, cfg.fork_temperature, cfg.fork_top_p, settings=run.benchmark_settings
        )
        specs = []
        for b in mine:
            for arm, k_arm in (("invoke", cfg.fork_k_invoke), ("skip", cfg.fork_k_skip)):
                start = fork_start(sources[b.rollout_id], b, arm)
                for k in range(k_arm):
                    fid = f"{b.branch_id}/{arm}{k}"
                    specs.append(
                        EpisodeSpec(
                            fid,
                            b.task_id,
                            stable_seed(seed, run.round, "fork", fid),
                            fork=start,
                            meta={"branch": b, "arm": arm, "k": k},
                            split=split,
                            pseudo_skills=tuple(sources[b.rollout_id]["pseudo_skills"] or ()),
                        )
                    )
        bar = progress_bar(len(specs), f"fork r{run.round} rank {run.rank}")
        rows = runner.run(specs, progress=bar.update)
        bar.close()
        out = []
        for spec, row in zip(specs, rows, strict=True):
            b = spec.meta["branch"]
            stats.tokens += len(row["token_ids"]) - b.token_offset
            if row["termination"] == "error":
                stats.failures["env_error"] += 1
            episode = {k: v for k, v in row.items() if k != "n_prompt_tokens"}
            episode["turns"] = [Turn.from_row(t) for t in row["turns"]]
            out.append(
                Fork(
                    fork_id=spec.episode_id,
                    branch_id=b.branch_id,
                    rollout_id=b.rollout_id,
                    task_id=b.task_id,
                    task_type=b.task_type,
                    round=run.round,
                    arm=spec.meta["arm"],
                    k=spec.meta["k"],
                    seed=spec.seed,
                    prefix_len=b.token_offset,
                    **episode,
                    env_steps_after_branch=row["env_steps"] - b.source_env_steps_before,
                    # agent decisions from the branch turn on (the label's efficiency measure)
                    steps_after_branch=row["n_turns"] - b.turn_index,
                    malformed_after_branch=sum(
                        1 for t in row["turns"][b.turn_index :] if t["kind"] == "malformed"
                    ),
                ).to_row()
            )
        tps = policy.stats()
        stats.extra.update(
            branches=len(mine),
            generated_tokens=tps.generated_tokens,
            tokens_per_second=round(tps.tokens_per_second, 1),
        )
        return out

    upstream = ("sample", "branch")
    # the games the sampled episodes were played on, as they are now (a change since is refused)
    played = recorded_games(StageDir.of(run.runs_dir, run.exp, run.round, "sample"))
    games = games_identity(run, sorted(played))
    inputs = StageInputs(
        [run, pol, rollout, cfg], seed, CODE_VERSION, policy=path, upstream=upstream, games=games
    )
    return run_rank(stage, "fork", run, inputs, compute)
