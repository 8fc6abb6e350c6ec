"""A small, valid run directory built from hand-made rows (for the report and notebook tests).

    runs/<exp>/round_0/eval                               init policy's held-out episodes
    runs/<exp>/round_1/{sample,branch,fork,label,eval}    one full round (pairs from the real labeler)
    runs/<exp>/round_2/eval                               a round whose data stages are missing

Every shard goes through `write_shard` (schema-checked) and every JSON through
`write_json_atomic`; each stage gets its completion marker. Token ids are small made-up
integers (there is no tokenizer); per-token roles, turns, entropies and turn records are
consistent with what the episode runner writes, including forced decision tokens (logprob
and entropy 0) at the start of each fork's branch turn.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

from selskill.data.layout import StageDir
from selskill.data.schema import ROLE_ASSISTANT, ROLE_OBSERVATION, ROLE_PROMPT, ROLE_SKILL_RETURN
from selskill.data.shards import write_json_atomic, write_shard
from selskill.measure.metrics import compute_metrics, metrics_by_task_type
from selskill.registry import step_measure
from selskill.stages.label import episode_pairs, local_pair, yield_summary

SPLITS = ("valid_seen", "valid_unseen")
TASK_TYPES = ("pick_and_place_simple", "pick_heat_then_place_in_recep")
N_PROMPT = 6
N_FORCED = 2
METRICS_BOOT = 200

# Eval outcomes per round: (success, skill calls, precise calls, env steps, malformed turns) per task.
EVAL_PLAN = {
    0: [(True, 2, 1, 12, 0), (False, 1, 0, 30, 1), (True, 0, 0, 9, 0), (False, 3, 2, 30, 0)],
    1: [(True, 1, 1, 10, 0), (True, 1, 0, 14, 0), (True, 0, 0, 9, 0), (False, 2, 2, 30, 1)],
    2: [(True, 1, 1, 9, 0), (True, 0, 0, 11, 0), (True, 0, 0, 8, 0), (True, 1, 1, 16, 0)],
}


def _turn_record(start, end, kind, env_steps, precise, index, forced=False) -> dict:
    return {
        "start": start,
        "end": end,
        "decision": 0,  # every text here opens with its decision tag
        "message_index": 2 + 2 * index,  # system + task, then an assistant message and its reply per turn
        "text": {
            "action": "<action>go to desk 1</action>",
            "skill": '<tool_call>{"name": "heat_object"}',
        }.get(kind, "<action>go to"),
        "kind": kind,
        "reason": "unclosed tag" if kind == "malformed" else None,
        "action": "go to desk 1" if kind == "action" else None,
        "skill": "heat_object" if kind == "skill" else None,
        "arguments": None,
        "exec_precise": precise if kind == "skill" else None,
        "exec_error": None if (kind != "skill" or precise) else "not admissible",
        "env_steps": env_steps,
        "commands": ["go to desk 1"] * env_steps,
        "forced": forced,
        "listed": ["heat_object", "common_mistakes"],
    }


def _seq(rng: random.Random) -> dict:
    ids = [100 + i for i in range(N_PROMPT)]
    return {
        "token_ids": ids,
        "logprob": [0.0] * N_PROMPT,
        "entropy": [0.0] * N_PROMPT,
        "role": [ROLE_PROMPT] * N_PROMPT,
        "turn": [-1] * N_PROMPT,
        "turns": [],
        "rng": rng,
    }


def _add_turn(seq: dict, kind: str, env_steps: int, precise: bool, ent: float, forced: int = 0) -> None:
    """One assistant turn (forced + 4 generated tokens) followed by its observation / skill return."""
    rng, index, start = seq["rng"], len(seq["turns"]), len(seq["token_ids"])
    for k in range(forced + 4):
        gen = k >= forced
        seq["token_ids"].append((200 if kind == "skill" else 300) + k)
        seq["logprob"].append(-round(rng.uniform(0.05, 1.0), 3) if gen else 0.0)
        seq["entropy"].append(round(ent + rng.uniform(0.0, 0.3), 3) if gen else 0.0)
        seq["role"].append(ROLE_ASSISTANT)
        seq["turn"].append(index)
    end = len(seq["token_ids"])
    seq["turns"].append(_turn_record(start, end, kind, env_steps, precise, index, forced=forced > 0))
    reply_role = ROLE_SKILL_RETURN if kind == "skill" else ROLE_OBSERVATION
    for k in range(3):
        seq["token_ids"].append(400 + 10 * reply_role + k)
        seq["logprob"].append(0.0)
        seq["entropy"].append(0.0)
        seq["role"].append(reply_role)
        seq["turn"].append(index)


def _outcome(seq: dict, success: bool) -> dict:
    turns = seq["turns"]
    calls = [t for t in turns if t["kind"] == "skill"]
    messages = [{"role": "system", "content": "skills: heat_object"}, {"role": "user", "content": "task"}]
    for t in turns:
        messages += [{"role": "assistant", "content": t["text"]}, {"role": "user", "content": "obs"}]
    return {
        "token_ids": seq["token_ids"],
        "logprob": seq["logprob"],
        "entropy": seq["entropy"],
        "role": seq["role"],
        "turn": seq["turn"],
        "success": success,
        "env_steps": sum(t["env_steps"] for t in turns),
        "n_turns": len(turns),
        "n_skill_calls": len(calls),
        "n_precise_calls": sum(1 for t in calls if t["exec_precise"]),
        "n_malformed": sum(1 for t in turns if t["kind"] == "malformed"),
        "termination": "won" if success else "step_limit",
        "error": None,
        "turns": turns,
        "messages": json.dumps(messages),
    }


def _plan_turns(calls: int, precise: int, steps: int, malformed: int) -> list[tuple]:
    """Turn kinds whose totals give exactly these counts (skill calls take 2 env steps)."""
    turns = [("skill", 2, i < precise) for i in range(calls)] + [("malformed", 1, False)] * malformed
    rest = steps - sum(t[1] for t in turns)
    assert rest >= 1, "plan needs at least one action"
    turns += [("action", 1, False)] * (rest - 1) + [("action", 1, False)]
    return turns


def rollout_row(exp, round_, task_id, task_type, sample_idx, plan, seed) -> dict:
    success, calls, precise, steps, malformed = plan
    seq = _seq(random.Random(seed))
    for kind, st, pr in _plan_turns(calls, precise, steps, malformed):
        _add_turn(seq, kind, st, pr, ent=0.4)
    return {
        "rollout_id": f"r{round_}/{task_id}/{sample_idx}",
        "run": exp,
        "round": round_,
        "task_id": task_id,
        "task_type": task_type,
        "split": task_id.split("/", 1)[0],
        "sample_idx": sample_idx,
        "policy_id": f"round_{round_ - 1}",
        "seed": seed,
        "n_prompt_tokens": N_PROMPT,
        **_outcome(seq, success),
    }


def _eval_rows(exp: str, round_: int) -> list[dict]:
    rows = []
    for s, split in enumerate(SPLITS):
        for i, plan in enumerate(EVAL_PLAN[round_]):
            # the unseen split flips the last task's outcome so the two splits differ
            if split == "valid_unseen" and i == 3:
                plan = (not plan[0], *plan[1:])
            task_type = TASK_TYPES[i % 2]
            row = rollout_row(exp, round_, f"{split}/{task_type}/t{i}", task_type, 0, plan, 1000 * s + i)
            rows.append(row | {"rollout_id": f"eval/r{round_}/{split}/t{i}"})
    return rows


def _finish_stage(stage: StageDir, kind: str, rows: list[dict], extra: dict | None = None) -> None:
    write_shard(rows, stage.shard(0), kind)
    write_json_atomic(
        {"rows": len(rows), "tokens": 0, "seconds": 0.0, "failures": {}, **(extra or {})}, stage.stats_file(0)
    )
    stage.marker(0).parent.mkdir(parents=True, exist_ok=True)
    stage.marker(0).write_text(json.dumps({"rows": len(rows)}) + "\n")


def write_eval(runs: Path, exp: str, round_: int) -> dict:
    rows = _eval_rows(exp, round_)
    stage = StageDir.of(runs, exp, round_, "eval")
    _finish_stage(stage, "rollout", rows)
    splits = {}
    for split in SPLITS:
        mine = [r for r in rows if r["task_id"].startswith(f"{split}/")]
        splits[split] = {
            "overall": compute_metrics(mine, METRICS_BOOT, 0),
            "by_task_type": metrics_by_task_type(mine, METRICS_BOOT, 0),
        }
    metrics = {"round": round_, "exp": exp, "splits": splits}
    write_json_atomic(metrics, stage.path / "metrics.json")
    return metrics


# Round 1 sampling: 2 train tasks x 3 samples; forks: per branch (invoke outcomes, skip outcomes)
# as (success, env steps after the branch, malformed after the branch).
SAMPLE_PLAN = {
    "train/pick_and_place_simple/a0": [(True, 1, 1, 8, 0), (False, 0, 0, 30, 0), (True, 0, 0, 11, 0)],
    "train/pick_heat_then_place_in_recep/a1": [
        (False, 2, 1, 30, 0),
        (False, 1, 1, 25, 0),
        (True, 1, 1, 12, 0),
    ],
}
FORK_PLAN = [
    # (task, sample, turn index, pool, invoke arm, skip arm)
    (
        "train/pick_and_place_simple/a0",
        0,
        1,
        "ordinary",
        [(True, 6, 0), (False, 20, 0)],
        [(True, 4, 0), (True, 5, 0)],
    ),
    (
        "train/pick_and_place_simple/a0",
        1,
        2,
        "ordinary",
        [(True, 5, 0), (True, 7, 0)],
        [(False, 25, 0), (False, 22, 1)],
    ),
    ("train/pick_heat_then_place_in_recep/a1", 0, 1, "post_skill", [(True, 6, 0)], [(True, 6, 0)]),
    ("train/pick_heat_then_place_in_recep/a1", 1, 1, "post_skill", [(False, 20, 0)], [(False, 20, 0)]),
    (
        "train/pick_heat_then_place_in_recep/a1",
        2,
        2,
        "ordinary",
        [(True, 3, 0), (False, 15, 1)],
        [(True, 9, 0)],
    ),
]


def _fork_row(exp, round_, source, branch, arm, k, plan, seed) -> dict:
    success, after, malformed = plan
    t, offset = branch["turn_index"], branch["token_offset"]
    seq = {
        "token_ids": source["token_ids"][:offset],
        "logprob": source["logprob"][:offset],
        "entropy": source["entropy"][:offset],
        "role": source["role"][:offset],
        "turn": source["turn"][:offset],
        "turns": [dict(x) for x in source["turns"][:t]],
        "rng": random.Random(seed),
    }
    # invoke arms run hotter after the branch than skip arms (the paper's Figure 3 pattern)
    ent = 0.9 if arm == "invoke" else 0.5
    kinds = [("skill", 2, True)] if arm == "invoke" else [("action", 1, False)]
    kinds += [("malformed", 1, False)] * malformed
    rest = after - sum(x[1] for x in kinds)
    kinds += [("action", 1, False)] * rest
    for j, (kind, st, pr) in enumerate(kinds):
        _add_turn(seq, kind, st, pr, ent=ent if j < 3 else 0.3, forced=N_FORCED if j == 0 else 0)
    out = _outcome(seq, success)
    return {
        "fork_id": f"{branch['branch_id']}/{arm}{k}",
        "branch_id": branch["branch_id"],
        "rollout_id": branch["rollout_id"],
        "task_id": branch["task_id"],
        "task_type": branch["task_type"],
        "split": source["split"],
        "round": round_,
        "arm": arm,
        "k": k,
        "seed": seed,
        "prefix_len": offset,
        **out,
        "env_steps_after_branch": out["env_steps"] - branch["source_env_steps_before"],
        "steps_after_branch": out["n_turns"] - branch["turn_index"],
        "malformed_after_branch": malformed,
    }


def chat_fields(n_turns: int) -> dict:
    """`messages` and the `turns` that index them, as the runner writes them: system, task, then an
    assistant message and its reply per turn."""
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for i in range(n_turns):
        messages += [{"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"o{i}"}]
    return {"messages": json.dumps(messages), "turns": [{"message_index": 2 + 2 * i} for i in range(n_turns)]}


def write_fixture_run(runs: str | Path, exp: str = "fixture") -> Path:
    """Write the fixture run under `runs/exp` and return that directory."""
    runs = Path(runs)
    write_eval(runs, exp, 0)

    # round 1: sample -> branch -> fork -> label (real labeler) -> eval
    r = 1
    rollouts = []
    for task, plans in sorted(SAMPLE_PLAN.items()):
        task_type = task.split("/")[1]
        for i, plan in enumerate(plans):
            rollouts.append(rollout_row(exp, r, task, task_type, i, plan, 7 * len(rollouts) + 1))
    _finish_stage(StageDir.of(runs, exp, r, "sample"), "rollout", rollouts)
    by_id = {x["rollout_id"]: x for x in rollouts}

    branches, forks = [], []
    for b, (task, sample, t, pool, inv, skp) in enumerate(FORK_PLAN):
        src = by_id[f"r{r}/{task}/{sample}"]
        branch = {
            "branch_id": f"{src['rollout_id']}/b{b}",
            "rollout_id": src["rollout_id"],
            "task_id": task,
            "task_type": src["task_type"],
            "round": r,
            "turn_index": t,
            "token_offset": src["turns"][t]["start"],
            "pool": pool,
            "score": round(1.0 + 0.1 * b, 3),
            "strategy": "entropy",
            "candidate_skill": "heat_object",
            "original_decision": "skip",
            "source_env_steps_before": sum(x["env_steps"] for x in src["turns"][:t]),
        }
        branches.append(branch)
        for arm, plans in (("invoke", inv), ("skip", skp)):
            for k, plan in enumerate(plans):
                forks.append(_fork_row(exp, r, src, branch, arm, k, plan, 100 * b + k))
    _finish_stage(StageDir.of(runs, exp, r, "branch"), "branch", branches)
    _finish_stage(StageDir.of(runs, exp, r, "fork"), "fork", forks)

    discards: Counter = Counter()
    steps = step_measure("alfworld")
    pairs = []
    for task in sorted(SAMPLE_PLAN):
        pairs += episode_pairs([x for x in rollouts if x["task_id"] == task], 3, discards, steps)
    for branch in branches:
        p = local_pair(branch, [f for f in forks if f["branch_id"] == branch["branch_id"]], discards, steps)
        if p is not None:
            pairs.append(p)
    pairs.sort(key=lambda p: p["pair_id"])
    _finish_stage(
        StageDir.of(runs, exp, r, "label"),
        "pair",
        pairs,
        {"failures": dict(discards), "yield": yield_summary(pairs, discards, len(SAMPLE_PLAN))},
    )
    write_eval(runs, exp, 1)

    # round 2: only its eval exists (data stages missing -> the report notes it)
    write_eval(runs, exp, 2)
    return runs / exp
