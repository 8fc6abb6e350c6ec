"""Branch selection, pair labeling and metrics on hand-built rows (pure functions, exact answers)."""

import json
import random
from collections import Counter

import pytest
from fixtures_run import chat_fields

from selskill.data.schema import ROLE_ASSISTANT, ROLE_OBSERVATION, ROLE_PROMPT
from selskill.measure.metrics import compute_metrics, paired_sr_difference
from selskill.registry import step_measure
from selskill.stages.branch import BranchConfig, select_points, turn_scores
from selskill.stages.label import completion, episode_pairs, local_pair
from selskill.train.pairs import loss_mask

STEPS = step_measure("alfworld")  # a step is a decision


def _cands():
    # turn_index, pool, score
    spec = [
        (0, "ordinary", 0.5),
        (1, "post_skill", 2.0),
        (2, "ordinary", 3.0),
        (3, "post_skill", 0.1),
        (4, "ordinary", 1.0),
        (5, "post_skill", 1.5),
        (6, "ordinary", 0.2),
        (7, "post_skill", 0.9),
        (8, "ordinary", 2.5),
    ]
    return [{"turn_index": t, "pool": p, "score": s} for t, p, s in spec]


def test_entropy_strategy_takes_top_k_of_each_pool():
    chosen = select_points(_cands(), BranchConfig(), random.Random(0))
    assert [c["turn_index"] for c in chosen] == [1, 2, 4, 5, 7, 8]
    chosen = select_points(
        _cands(), BranchConfig(branch_top_post_skill=1, branch_top_ordinary=2), random.Random(0)
    )
    assert [(c["turn_index"], c["pool"]) for c in chosen] == [
        (1, "post_skill"),
        (2, "ordinary"),
        (8, "ordinary"),
    ]


def test_all_skill_takes_every_skill_point_and_no_ordinary():
    chosen = select_points(_cands(), BranchConfig(branch_strategy="all_skill"), random.Random(0))
    assert [c["turn_index"] for c in chosen] == [1, 3, 5, 7]


def test_random_strategy_is_seeded_and_respects_pools():
    cfg = BranchConfig(branch_strategy="random", branch_top_post_skill=2, branch_top_ordinary=2)
    a = select_points(_cands(), cfg, random.Random(7))
    b = select_points(_cands(), cfg, random.Random(7))
    assert a == b
    assert Counter(c["pool"] for c in a) == {"post_skill": 2, "ordinary": 2}
    seen = {tuple(c["turn_index"] for c in select_points(_cands(), cfg, random.Random(s))) for s in range(20)}
    assert len(seen) > 1


def test_turn_score_modes():
    row = {"logprob": [0, 0, -1, -1, -1, -1, 0], "entropy": [0, 0, 4.0, 2.0, 1.0, 3.0, 0]}
    turn = {"start": 2, "end": 7}  # last token is a non-generated appended end-of-turn
    assert turn_scores(row, turn, 0, BranchConfig(branch_score_m=2)) == pytest.approx(3.0)
    assert turn_scores(row, turn, 0, BranchConfig(branch_score_m=10)) == pytest.approx(2.5)
    assert turn_scores(row, turn, 1, BranchConfig(branch_score="decision")) == pytest.approx(2.0)


def _fork(fid, arm, success, steps, malformed=0, prefix=(1, 2, 3), err=False):
    tail = [10, 11, 12, 13, 14, 15]
    return {
        "fork_id": fid,
        "arm": arm,
        "success": success,
        "steps_after_branch": steps,
        "malformed_after_branch": malformed,
        "termination": "error" if err else ("won" if success else "step_limit"),
        "token_ids": list(prefix) + tail,
        "role": [ROLE_PROMPT, ROLE_ASSISTANT, ROLE_OBSERVATION] + [1, 1, 2, 1, 2, 1],
        "turn": [-1, 0, 0] + [1, 1, 1, 2, 2, 3],
        **chat_fields(4),
    }


BRANCH = {
    "branch_id": "b",
    "task_id": "t",
    "task_type": "x",
    "round": 1,
    "token_offset": 3,
    "turn_index": 1,
    "pool": "ordinary",
    "score": 1.2,
    "strategy": "entropy",
    "candidate_skill": "heat_object",
}


def test_success_beats_failure_and_best_per_arm():
    d = Counter()
    forks = [
        _fork("i0", "invoke", False, 5),
        _fork("i1", "invoke", True, 9),
        _fork("s0", "skip", False, 2),
        _fork("s1", "skip", False, 3),
    ]
    p = local_pair(BRANCH, forks, d, STEPS)
    assert p["label_reason"] == "success_vs_failure" and p["chosen_arm"] == "invoke"
    assert p["chosen_source"] == "i1" and p["rejected_source"] == "s0"
    assert p["prompt_ids"] == [1, 2, 3]
    # messages cut where the ids are: the prompt up to the branch turn's (turn 1) assistant message,
    # each side from it through its last assistant message (the final reply was never tokenized)
    assert [m["content"] for m in json.loads(p["prompt_messages"])] == ["s", "task", "a0", "o0"]
    assert [m["content"] for m in json.loads(p["chosen_messages"])] == ["a1", "o1", "a2", "o2", "a3"]


def test_efficiency_ties_and_both_failed():
    d = Counter()
    p = local_pair(BRANCH, [_fork("i0", "invoke", True, 7), _fork("s0", "skip", True, 4)], d, STEPS)
    assert p["label_reason"] == "efficiency" and p["chosen_arm"] == "skip" and p["chosen_steps"] == 4
    assert (
        local_pair(BRANCH, [_fork("i0", "invoke", True, 4), _fork("s0", "skip", True, 4)], d, STEPS) is None
    )
    assert (
        local_pair(BRANCH, [_fork("i0", "invoke", False, 4), _fork("s0", "skip", False, 2)], d, STEPS) is None
    )
    assert d == {"local_tie": 1, "local_both_failed": 1}


def test_efficiency_counts_decisions_not_environment_commands():
    d = Counter()
    # heat_object runs `go to microwave 1` + `heat ...` in one call: the same two commands as
    # the skip arm's two actions, one decision fewer, so invoking wins
    inv, skp = _fork("i0", "invoke", True, 3), _fork("s0", "skip", True, 4)
    inv["env_steps_after_branch"] = skp["env_steps_after_branch"] = 4
    p = local_pair(BRANCH, [inv, skp], d, STEPS)
    assert p["label_reason"] == "efficiency" and p["chosen_arm"] == "invoke"
    assert (p["chosen_steps"], p["rejected_steps"]) == (3, 4)
    # a redundant memory call runs no command but costs a decision: skipping wins
    inv, skp = _fork("i0", "invoke", True, 5), _fork("s0", "skip", True, 4)
    inv["env_steps_after_branch"] = skp["env_steps_after_branch"] = 4
    assert local_pair(BRANCH, [inv, skp], d, STEPS)["chosen_arm"] == "skip"


def test_malformed_chosen_side_is_never_kept_and_errors_are_ignored():
    d = Counter()
    forks = [_fork("i0", "invoke", True, 3, malformed=1), _fork("s0", "skip", False, 2)]
    assert local_pair(BRANCH, forks, d, STEPS) is None and d["local_chosen_malformed"] == 1
    forks = [
        _fork("i0", "invoke", True, 3, malformed=1),
        _fork("i1", "invoke", True, 6),
        _fork("s0", "skip", False, 2),
    ]
    assert local_pair(BRANCH, forks, d, STEPS)["chosen_source"] == "i1"
    forks = [_fork("i0", "invoke", True, 3, err=True), _fork("s0", "skip", False, 2)]
    assert local_pair(BRANCH, forks, d, STEPS) is None and d["local_missing_arm"] == 1


def test_success_rate_rule_outvotes_one_lucky_sample_that_best_follows():
    # invoke wins 1 of 2 in 6 steps, skip 2 of 2 in 8 and 9: the best samples say invoke (fewer
    # steps), the arms' success rates say skip; the pair holds each arm's best sample either way
    forks = [
        _fork("i0", "invoke", True, 6),
        _fork("i1", "invoke", False, 3),
        _fork("s0", "skip", True, 9),
        _fork("s1", "skip", True, 8),
    ]
    d = Counter()
    best = local_pair(BRANCH, forks, d, STEPS)
    assert (best["chosen_arm"], best["label_reason"]) == ("invoke", "efficiency")
    assert (best["chosen_source"], best["rejected_source"]) == ("i0", "s1")
    rate = local_pair(BRANCH, forks, d, STEPS, rule="success_rate")
    assert (rate["chosen_arm"], rate["label_reason"]) == ("skip", "success_rate")
    assert (rate["chosen_source"], rate["rejected_source"]) == ("s1", "i0")
    assert (rate["chosen_success"], rate["rejected_success"]) == (True, True)
    assert (rate["chosen_steps"], rate["rejected_steps"]) == (8, 6)
    assert set(rate) == set(best) and not d  # the same pair schema, nothing dropped


def test_success_rate_rule_ties_fall_back_to_efficiency_and_zero_rates_drop():
    d = Counter()
    # 1 of 2 each: the arms' best successes decide by steps, as under `best`
    forks = [
        _fork("i0", "invoke", True, 7),
        _fork("i1", "invoke", False, 2),
        _fork("s0", "skip", True, 4),
        _fork("s1", "skip", False, 2),
    ]
    p = local_pair(BRANCH, forks, d, STEPS, rule="success_rate")
    assert (p["chosen_arm"], p["label_reason"], p["chosen_source"]) == ("skip", "efficiency", "s0")
    # a success rate against none: success vs failure, whatever the rule
    forks = [_fork("i0", "invoke", False, 2), _fork("i1", "invoke", False, 3), _fork("s0", "skip", True, 9)]
    p = local_pair(BRANCH, forks, d, STEPS, rule="success_rate")
    assert (p["chosen_arm"], p["label_reason"]) == ("skip", "success_vs_failure")
    forks = [_fork("i0", "invoke", False, 2), _fork("s0", "skip", False, 2), _fork("s1", "skip", False, 4)]
    assert local_pair(BRANCH, forks, d, STEPS, rule="success_rate") is None
    # an engine error is no sample: 1 of 1 usable beats 1 of 2
    forks = [
        _fork("i0", "invoke", True, 9),
        _fork("i1", "invoke", True, 2, err=True),
        _fork("s0", "skip", True, 4),
        _fork("s1", "skip", False, 2),
    ]
    assert local_pair(BRANCH, forks, d, STEPS, rule="success_rate")["chosen_arm"] == "invoke"
    assert d == {"local_both_failed": 1}
    with pytest.raises(ValueError, match="label_arm_rule 'rate' is not one of: best, success_rate"):
        local_pair(BRANCH, forks, d, STEPS, rule="rate")


def test_label_records_roles_and_turns_and_train_builds_the_window_from_them():
    f = _fork("i0", "invoke", True, 3)
    c = completion(f["token_ids"], f["role"], f["turn"], 3, 1)
    assert c["turn"] == [0, 0, 0, 1, 1, 2] and "mask" not in c  # the window is the trainer's alone
    assert loss_mask(c["role"], c["turn"], "local", 2).tolist() == [1, 1, 0, 1, 0, 0]
    assert loss_mask(c["role"], c["turn"], "local", 1).tolist() == [1, 1, 0, 0, 0, 0]
    assert loss_mask(c["role"], c["turn"], "local", None).tolist() == [1, 1, 0, 1, 0, 1]


def _rollout(rid, success, steps, malformed=0, err=False):
    return {
        "rollout_id": rid,
        "task_id": "t",
        "task_type": "x",
        "round": 1,
        "success": success,
        "n_turns": steps,
        "env_steps": 100 - steps,  # environment commands do not decide: agent steps do
        "n_malformed": malformed,
        "termination": "error" if err else ("won" if success else "step_limit"),
        "n_prompt_tokens": 2,
        "token_ids": [5, 6, 7, 8],
        "role": [0, 0, 1, 2],
        "turn": [-1, -1, 0, 0],
        **chat_fields(1),
    }


def test_episode_pairs_shortest_success_vs_longest_failures():
    d = Counter()
    rows = [
        _rollout("a", True, 9),
        _rollout("b", True, 4, malformed=1),
        _rollout("c", True, 6),
        _rollout("d", False, 20),
        _rollout("e", False, 50),
        _rollout("f", False, 30),
        _rollout("g", False, 10),
        _rollout("h", False, 99, err=True),
    ]
    pairs = episode_pairs(rows, 3, d, STEPS)
    assert [(p["chosen_source"], p["rejected_source"]) for p in pairs] == [("c", "e"), ("c", "f"), ("c", "d")]
    assert (
        all(p["chosen_role"] == [1, 2] and p["chosen_turn"] == [0, 0] for p in pairs)
        and d["episode_env_error"] == 1
    )
    assert episode_pairs([_rollout("a", True, 3)], 3, d, STEPS) == [] and d["episode_no_contrast"] == 1


def _ep(success, calls, precise, steps, malformed=0, turns=10, task="t"):
    return {
        "success": success,
        "n_skill_calls": calls,
        "n_precise_calls": precise,
        "env_steps": steps,
        "n_malformed": malformed,
        "n_turns": turns,
        "task_id": task,
        "task_type": "x",
    }


def test_metrics_equal_hand_computed_values():
    rows = [
        _ep(True, 2, 1, 10, turns=12),
        _ep(False, 1, 0, 30, malformed=2, turns=31),
        _ep(True, 0, 0, 8, turns=8),
        _ep(False, 0, 0, 50, turns=47),
    ]
    m = compute_metrics(rows, n_boot=200, seed=0)
    assert m["sr"] == 0.5
    assert m["exec_prec"] == pytest.approx(1 / 3)
    assert m["sr_invoke"] == 0.5 and m["sr_skip"] == 0.5
    assert m["skill_per_ep"] == 0.75 and m["avg_steps"] == 24.5  # agent steps: (12 + 31 + 8 + 47) / 4
    assert m["malformed_rate"] == pytest.approx(2 / 98)
    lo, hi = m["ci"]["sr"]
    assert 0 <= lo <= 0.5 <= hi <= 1
    assert compute_metrics([_ep(True, 0, 0, 5)], n_boot=10)["exec_prec"] is None


def test_paired_sr_difference():
    a = [_ep(False, 0, 0, 5, task=f"t{i}") for i in range(10)]
    b = [_ep(i < 6, 0, 0, 5, task=f"t{i}") for i in range(10)]
    d = paired_sr_difference(a, b, n_boot=500)
    assert d["diff"] == pytest.approx(0.6) and d["ci"][0] > 0
