"""Branch stage: pick the decision points of each rollout worth forking.

Two pools, as in the paper: *post_skill* points are turns where the policy invoked a
listed skill (the invoke/skip question is explicit there; the candidate skill is the one
it invoked), *ordinary* points are turns where it acted directly (the candidate skill is
the skill of that turn's listing whose whole call the policy itself rates most likely after
a `<tool_call>` opening; with retrieval the listing is the turn's few `listed` skills, so a
fork never forces a skill the prompt did not show, and a turn that listed none is no point). Strategy `entropy` keeps the top-k of each pool by turn score; `random` draws
k of each pool; `all_skill` keeps every post_skill point (the paper's Appendix E).

Turn score: mean entropy over the first m generated tokens of the turn (the paper, m=10),
or the entropy of the decision token itself (where the model chooses `<action>` vs
`<tool_call>`). Malformed turns are never branch points. Kind, skill and decision token
come from the turn records the runner wrote while it had the text and the tokenizer: the
stage parses and decodes nothing.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass

from selskill.agent.turn_format import render_skill_call
from selskill.config.run import RunConfig
from selskill.config.stages import BranchConfig
from selskill.data.contract import read_stage
from selskill.data.inputs import StageInputs
from selskill.data.rank_writer import run_rank
from selskill.data.records import BranchPoint
from selskill.data.stage_stats import StageStats
from selskill.stages.policy_source import load_policy, sampling_policy_path
from selskill.stages.round_step import PolicyStep
from selskill.stages.sharding import shard_items, stable_seed

CODE_VERSION = 1  # bump when a change alters the rows this stage writes (completed ranks are then refused)


def turn_scores(row: dict, turn: dict, decision_idx: int, cfg: BranchConfig) -> float:
    """Entropy score of one turn from its generated tokens (forced / appended tokens have logprob 0)."""
    start, end = turn["start"], turn["end"]
    generated = [i for i in range(start, end) if row["logprob"][i] != 0.0 or row["entropy"][i] != 0.0]
    if not generated:
        return 0.0
    if cfg.branch_score == "decision":
        pos = start + decision_idx
        return float(row["entropy"][pos]) if pos < end else 0.0
    first = generated[: cfg.branch_score_m]
    return float(sum(row["entropy"][i] for i in first) / len(first))


def select_points(candidates: list[dict], cfg: BranchConfig, rng: random.Random) -> list[dict]:
    """candidates: dicts with pool and score; returns the chosen ones (ordered by turn)."""
    chosen = []
    for pool, k in (("post_skill", cfg.branch_top_post_skill), ("ordinary", cfg.branch_top_ordinary)):
        items = [c for c in candidates if c["pool"] == pool]
        if cfg.branch_strategy == "all_skill":
            if pool == "post_skill":
                chosen += items
            continue
        if cfg.branch_strategy == "random":
            chosen += rng.sample(items, min(k, len(items)))
        else:  # entropy: highest score first, earlier turn breaks ties
            chosen += sorted(items, key=lambda c: (-c["score"], c["turn_index"]))[:k]
    return sorted(chosen, key=lambda c: c["turn_index"])


def branch_candidates(row: dict, cfg: BranchConfig) -> list[dict]:
    """Every well-formed turn of a rollout (the record's kind: BFCL also marks a broken call list)."""
    out = []
    steps_before = 0
    for t_index, turn in enumerate(row["turns"]):
        if turn["kind"] != "malformed":
            invoked = turn["kind"] == "skill"
            out.append(
                {
                    "turn_index": t_index,
                    "token_offset": turn["start"] + turn["decision"],
                    "pool": "post_skill" if invoked else "ordinary",
                    "score": turn_scores(row, turn, turn["decision"], cfg),
                    "candidate_skill": turn["skill"] if invoked else "",
                    "original_decision": "invoke" if invoked else "skip",
                    "source_env_steps_before": steps_before,
                }
            )
        steps_before += turn["env_steps"]
    return out


def likeliest_skill(policy, prefix_ids: list[int], skill_names) -> str:
    """The listed skill the policy rates most likely to call here (its whole call, as trained).

    Scored on the tokens of the rendered call: a call head cut after the name ends on a token
    boundary the policy never produced (see `ChatTokens.encode_forced`).
    """
    tok = policy.tokenizer
    conts = [tok.encode(render_skill_call(s), add_special_tokens=False) for s in skill_names]
    if hasattr(policy, "score_continuations"):
        totals = policy.score_continuations(prefix_ids, conts)
    else:
        totals = [sum(policy.score(prefix_ids, c)[0]) for c in conts]
    best = max(range(len(conts)), key=lambda i: (totals[i], -i))
    return list(skill_names)[best]


@dataclass
class BranchStep(PolicyStep):
    name = "branch"
    doc = "the decision points worth forking"

    cfg: BranchConfig  # its own section (the field of `RoundStep`, typed)

    def points(self, run: RunConfig, row: dict, likeliest: Callable, stats: StageStats) -> list[BranchPoint]:
        """The chosen branch points of one rollout; `likeliest(row, offset, listed)` picks an ordinary point's
        candidate skill."""
        rng = random.Random(stable_seed(self.seed, run.round, "branch", row["rollout_id"]))
        cands = branch_candidates(row, self.cfg)
        stats.extra["candidates"] = stats.extra.get("candidates", 0) + len(cands)
        out = []
        for c in select_points(cands, self.cfg, rng):
            if c["pool"] == "ordinary":
                listed = row["turns"][c["turn_index"]]["listed"]
                if not listed:
                    stats.extra["nothing_listed"] = stats.extra.get("nothing_listed", 0) + 1
                    continue
                c["candidate_skill"] = likeliest(row, c["token_offset"], listed)
            out.append(
                BranchPoint(
                    branch_id=f"{row['rollout_id']}/t{c['turn_index']}",
                    rollout_id=row["rollout_id"],
                    task_id=row["task_id"],
                    task_type=row["task_type"],
                    round=run.round,
                    strategy=self.cfg.branch_strategy,
                    **c,
                )
            )
        return out

    def compute(self, run: RunConfig) -> bool:
        path = sampling_policy_path(run, self.policy)
        # loaded once, and only if an ordinary point needs its candidate skill
        policy = functools.cache(lambda: load_policy(self.policy, path, self.rollout, self.seed))

        def likeliest(row: dict, offset: int, listed) -> str:
            return likeliest_skill(policy(), row["token_ids"][:offset], listed)

        def rows(stats: StageStats) -> list[dict]:
            sample = read_stage(self.stage_dir("sample"), "rollout", run.world_size).to_pylist()
            mine = shard_items(sorted(sample, key=lambda r: r["rollout_id"]), run.rank, run.world_size)
            stats.extra["rollouts"] = len(mine)
            return [p.to_row() for row in mine for p in self.points(run, row, likeliest, stats)]

        inputs = StageInputs(
            [run, self.policy, self.rollout, self.cfg],
            self.seed,
            CODE_VERSION,
            policy=path,
            upstream=("sample",),
        )
        return run_rank(self.stage_dir(), "branch", run, inputs, rows)
