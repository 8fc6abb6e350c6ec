"""Label stage: preference pairs by outcome, then efficiency.

Local pairs compare the best invoke continuation with the best skip continuation of one
branch point (an arm's best: success, then no malformed turn, then fewest steps after the
branch). Which arm wins is `label_arm_rule`'s. Under `best` (the reference's rule) the
arms' best continuations decide: success beats failure; if both succeed, fewer steps
after the branch wins (ties dropped); if both fail, the point is dropped. With two or more
continuations per arm, `best` lets one lucky sample outvote its arm's failures, so under
`success_rate` the arm whose usable continuations succeed more often wins (reason
`success_rate` where both arms' best continuations succeeded, `success_vs_failure` where
the losing arm never did); equal rates above 0 fall back to the efficiency of the arms'
best successes, as under `best`, and rates of 0 drop the point. Under both rules the pair holds
the winning arm's best continuation and the losing arm's, so the rule changes which pairs
exist and which way they point, never their schema. Episode pairs compare, per task, the
shortest successful sample with up to `label_episode_max_rejected` of the longest failures.

What a step is depends on the benchmark (`selskill.measure.metrics.step_measure`, the one owner of
that rule, shared with the Avg. Steps metric). BFCL counts function-call steps
(`env_steps`). On ALFWorld a step is one agent decision: an action, a skill call
(memory or executable, precise or not) or a malformed turn, i.e. one assistant turn
(`n_turns`). Counted in environment
commands instead, a memory call costs nothing and an executable call costs exactly the
actions it runs, so invoking could never win on efficiency and a redundant call could never
lose (docs/benchmarks.md, "Rounds at the tiny scale, and why no local pair ever preferred
invoking"). Counted in
decisions, a useful executable skill saves steps (one call for several actions) and a
redundant or premature call wastes one, as in the paper's Table 8. A side that contains a malformed turn is never chosen, and episodes the
engine broke (`error`) are never used. Every pair carries, per completion token, its role
and assistant-turn index counted from the branch, and nothing about a loss window: the
trainer alone builds the window from them, so the replication's n=1/3/all variants share
one set of pair shards. Label writes every pair it finds; which kinds and pools are
trained, in what mix and how many, is the train section's (`selskill.train.pairs`).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from fractions import Fraction

from selskill.config.run import RunConfig
from selskill.config.stages import LABEL_ARM_RULES, LabelConfig
from selskill.data.contract import read_stage
from selskill.data.inputs import StageInputs
from selskill.data.rank_writer import run_rank
from selskill.data.records import Pair
from selskill.data.stage_stats import StageStats
from selskill.registry import StepMeasure, step_measure
from selskill.stages.round_step import RoundStep
from selskill.stages.sharding import shard_items

CODE_VERSION = 3  # bump when a change alters the rows this stage writes (completed ranks are then refused)


def completion(token_ids, role, turn, start: int, base_turn: int) -> dict:
    """Completion tokens from `start` with their roles and turn index from the branch."""
    rel = [max(int(t) - base_turn, 0) for t in turn[start:]]
    return {"ids": list(token_ids[start:]), "role": list(role[start:]), "turn": rel}


def split_messages(row: dict, turn_index: int) -> tuple[list[dict], list[dict]]:
    """`row`'s messages cut where its token ids are cut: the prompt is everything before assistant turn
    `turn_index`'s message, the completion runs from it through the last assistant message.

    The message that answered the last turn (the final observation or skill return) is left
    out: the episode ended on that turn, so it was never tokenized, and a pair's messages then
    say exactly what its token ids do. A side with no assistant turn there has an empty completion.
    """
    messages = json.loads(row["messages"])
    turns = row["turns"] or []
    if turn_index >= len(turns):
        return messages, []
    cut = turns[turn_index]["message_index"]
    return messages[:cut], messages[cut : turns[-1]["message_index"] + 1]


def _dumps(messages: list[dict]) -> str:
    return json.dumps(messages, ensure_ascii=False)


def _pair(
    kind: str, reason: str, chosen: dict, rejected: dict, start: int, col: str, branch: dict | None = None
) -> dict:
    """`chosen` over `rejected`, both cut at token `start`: rollout rows of one task (an episode pair) or
    continuations of `branch` (a local pair, turns then counted from the branch turn); `col` is the steps
    column the label compared."""
    b = branch or {}
    task = branch or chosen  # the task a local pair's branch point, or an episode pair's rollouts, are of
    turn_index = b.get("turn_index", 0)
    source = "fork_id" if branch else "rollout_id"
    c = completion(chosen["token_ids"], chosen["role"], chosen["turn"], start, turn_index)
    r = completion(rejected["token_ids"], rejected["role"], rejected["turn"], start, turn_index)
    prompt_messages, chosen_messages = split_messages(chosen, turn_index)
    _, rejected_messages = split_messages(rejected, turn_index)
    return Pair(
        pair_id=f"{kind}/{chosen[source]}>{rejected[source]}",
        kind=kind,
        task_id=task["task_id"],
        task_type=task["task_type"],
        round=task["round"],
        prompt_ids=chosen["token_ids"][:start],
        chosen_ids=c["ids"],
        rejected_ids=r["ids"],
        chosen_role=c["role"],
        rejected_role=r["role"],
        chosen_turn=c["turn"],
        rejected_turn=r["turn"],
        label_reason=reason,
        chosen_success=bool(chosen["success"]),
        rejected_success=bool(rejected["success"]),
        chosen_steps=int(chosen[col]),
        rejected_steps=int(rejected[col]),
        chosen_arm=chosen.get("arm", ""),
        rejected_arm=rejected.get("arm", ""),
        branch_id=b.get("branch_id", ""),
        branch_pool=b.get("pool", ""),
        branch_score=float(b.get("score", 0.0)),
        branch_strategy=b.get("strategy", ""),
        candidate_skill=b.get("candidate_skill", ""),
        chosen_source=chosen[source],
        rejected_source=rejected[source],
        prompt_messages=_dumps(prompt_messages),
        chosen_messages=_dumps(chosen_messages),
        rejected_messages=_dumps(rejected_messages),
    ).to_row()


def episode_pairs(
    rollouts: list[dict], max_rejected: int, discards: Counter, steps: StepMeasure
) -> list[dict]:
    """Per task: shortest clean success vs up to `max_rejected` longest failures (`steps`: the benchmark's)."""
    col = steps.episode
    usable = [r for r in rollouts if r["termination"] != "error"]
    discards["episode_env_error"] += len(rollouts) - len(usable)
    wins = sorted((r for r in usable if r["success"]), key=lambda r: (r[col], r["rollout_id"]))
    clean = [r for r in wins if r["n_malformed"] == 0]
    losses = sorted((r for r in usable if not r["success"]), key=lambda r: (-r[col], r["rollout_id"]))
    if not wins or not losses:
        discards["episode_no_contrast"] += 1
        return []
    if not clean:
        discards["episode_chosen_malformed"] += 1
        return []
    best = clean[0]
    n_prompt = best["n_prompt_tokens"]
    out = []
    for loss in losses[:max_rejected]:
        if loss["token_ids"][: loss["n_prompt_tokens"]] != best["token_ids"][:n_prompt]:
            discards["episode_prompt_mismatch"] += 1
            continue
        out.append(_pair("episode", "success_vs_failure", best, loss, n_prompt, col))
    return out


def _usable(forks: list[dict]) -> list[dict]:
    """An arm's continuations that count as samples: one the engine broke (`error`) is none."""
    return [f for f in forks if f["termination"] != "error"]


def _best(forks: list[dict], col: str = "steps_after_branch") -> dict | None:
    """Best continuation of an arm: success, then no malformed turn, then fewest steps after the branch."""
    usable = _usable(forks)
    if not usable:
        return None
    return min(
        usable,
        key=lambda f: (
            not f["success"],
            f["malformed_after_branch"] > 0,
            f[col],
            f["fork_id"],
        ),
    )


def _success_rate(forks: list[dict]) -> Fraction:
    """Share of an arm's usable continuations that succeeded."""
    usable = _usable(forks)
    return Fraction(sum(1 for f in usable if f["success"]), len(usable))


def local_pair(
    branch: dict,
    forks: list[dict],
    discards: Counter,
    steps: StepMeasure,
    rule: str = "best",
) -> dict | None:
    """The winning arm's best vs the losing arm's best continuation of `branch`, the winner by `rule`
    (`label_arm_rule`: best | success_rate), or None (the reason counted in `discards`)."""
    if rule not in LABEL_ARM_RULES:
        raise ValueError(f"label_arm_rule {rule!r} is not one of: {', '.join(LABEL_ARM_RULES)}")
    col = steps.after_branch
    by_arm = defaultdict(list)
    for f in forks:
        by_arm[f["arm"]].append(f)
    inv, skp = _best(by_arm["invoke"], col), _best(by_arm["skip"], col)
    if inv is None or skp is None:
        discards["local_missing_arm"] += 1
        return None
    if rule == "success_rate":
        rate_inv, rate_skp = _success_rate(by_arm["invoke"]), _success_rate(by_arm["skip"])
    else:  # best: an arm succeeds when its best continuation does
        rate_inv, rate_skp = Fraction(int(inv["success"])), Fraction(int(skp["success"]))
    if rate_inv != rate_skp:
        winner, loser = (inv, skp) if rate_inv > rate_skp else (skp, inv)
        # both best continuations won: only the arms' rates tell them apart
        reason = "success_rate" if loser["success"] else "success_vs_failure"
    elif rate_inv == 0:
        discards["local_both_failed"] += 1
        return None
    elif inv[col] == skp[col]:
        discards["local_tie"] += 1
        return None
    else:
        winner, loser = (inv, skp) if inv[col] < skp[col] else (skp, inv)
        reason = "efficiency"
    if winner["malformed_after_branch"] > 0:
        discards["local_chosen_malformed"] += 1
        return None
    offset = branch["token_offset"]
    if winner["token_ids"][:offset] != loser["token_ids"][:offset]:
        discards["local_prefix_mismatch"] += 1
        return None
    return _pair("local", reason, winner, loser, offset, col, branch)


def yield_summary(pairs: list[dict], discards: Counter, n_tasks: int) -> dict:
    kinds = Counter(p["kind"] for p in pairs)
    reasons = Counter(f"{p['kind']}/{p['label_reason']}" for p in pairs)
    local = [p for p in pairs if p["kind"] == "local"]
    invoke_pref = sum(1 for p in local if p["chosen_arm"] == "invoke")
    return {
        "tasks": n_tasks,
        "pairs": len(pairs),
        "pairs_by_kind": dict(kinds),
        "pairs_by_reason": dict(reasons),
        "pairs_per_task": {k: round(v / max(1, n_tasks), 4) for k, v in kinds.items()},
        "local_invoke_preferred": invoke_pref,
        "invoke_preferred_share": round(invoke_pref / len(local), 4) if local else 0.0,
        "discarded": dict(sorted(discards.items())),
    }


@dataclass
class LabelStep(RoundStep):
    """Every pair the round's rollouts and forks yield: train alone selects, mixes and masks them
    (docs/design.md, "Who decides what about pairs"); `seed` is recorded with the stage's inputs."""

    name = "label"
    doc = "preference pairs: outcome, then efficiency"

    cfg: LabelConfig  # its own section (the field of `RoundStep`, typed)

    @property
    def local(self) -> bool:
        return self.cfg.label_kinds in ("both", "local")

    def episode_pairs(
        self, rollouts: list[dict], tasks: list[str], discards: Counter, steps: StepMeasure
    ) -> list:
        by_task = defaultdict(list)
        for r in rollouts:
            by_task[r["task_id"]].append(r)
        return [
            p
            for task in tasks
            for p in episode_pairs(by_task[task], self.cfg.label_episode_max_rejected, discards, steps)
        ]

    def local_pairs(self, world_size: int, tasks: set[str], discards: Counter, steps: StepMeasure) -> list:
        branches = read_stage(self.stage_dir("branch"), "branch", world_size).to_pylist()
        branches = [b for b in branches if b["task_id"] in tasks]
        forks = defaultdict(list)
        if branches:
            for f in read_stage(self.stage_dir("fork"), "fork", world_size).to_pylist():
                if f["task_id"] in tasks:
                    forks[f["branch_id"]].append(f)
        pairs = (
            local_pair(b, forks[b["branch_id"]], discards, steps, self.cfg.label_arm_rule)
            for b in sorted(branches, key=lambda b: b["branch_id"])
        )
        return [p for p in pairs if p is not None]

    def compute(self, run: RunConfig) -> bool:
        steps = step_measure(run.benchmark)

        def rows(stats: StageStats) -> list[dict]:
            rollouts = read_stage(self.stage_dir("sample"), "rollout", run.world_size).to_pylist()
            tasks = shard_items(sorted({r["task_id"] for r in rollouts}), run.rank, run.world_size)
            mine = set(tasks)
            discards: Counter = Counter()
            pairs: list[dict] = []
            if self.cfg.label_kinds in ("both", "episode"):
                pairs += self.episode_pairs(
                    [r for r in rollouts if r["task_id"] in mine], tasks, discards, steps
                )
            if self.local:
                pairs += self.local_pairs(run.world_size, mine, discards, steps)
            pairs.sort(key=lambda p: p["pair_id"])
            stats.tokens = sum(
                len(p["chosen_ids"]) + len(p["rejected_ids"]) + len(p["prompt_ids"]) for p in pairs
            )
            stats.failures.update(discards)
            stats.extra["yield"] = yield_summary(pairs, discards, len(tasks))
            return pairs

        upstream = ("sample", "branch", "fork") if self.local else ("sample",)
        inputs = StageInputs([run, self.cfg], self.seed, CODE_VERSION, upstream=upstream)
        return run_rank(self.stage_dir(), "pair", run, inputs, rows)
