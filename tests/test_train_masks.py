"""Loss masks from role + turn, the max_length policy, pair selection, and the collator.

Hand-built rows with literal token ids: no model, no tokenizer, milliseconds each.
"""

import pyarrow as pa
import pytest
import torch

from selskill.data.schema import PAIR_SCHEMA
from selskill.data.shards import read_shards, write_shard
from selskill.train.pairs import FitPolicy, build_examples, fit_pair, loss_mask
from selskill.train.trainer import MaskedPreferenceCollator

A, B, S = 1, 2, 3  # roles: assistant, observation (environment text), skill return
# A local pair's chosen side, from the branch turn on: turn 0 (2 tokens), observation, turn 1, a skill
# return, turn 2 (1 token), observation, turn 3 (2 tokens), observation.
ROLE = [A, A, B, B, A, A, S, S, A, B, A, A, B]
TURN = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3]
EXPECTED = {
    1: [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    3: [1, 1, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0],
    None: [1, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0],
}

START = 1  # the message-start token id in the literal rows below


@pytest.mark.parametrize("n", [1, 3, None], ids=["n=1", "n=3", "n=all"])
def test_local_window_selects_exactly_the_first_n_assistant_turns(n):
    assert loss_mask(ROLE, TURN, "local", n).tolist() == EXPECTED[n]


@pytest.mark.parametrize("n", [1, 3, None])
def test_episode_pairs_train_every_assistant_token_whatever_n(n):
    assert loss_mask(ROLE, TURN, "episode", n).tolist() == [int(r == A) for r in ROLE]


def test_observation_and_skill_return_tokens_are_never_trained():
    for kind in ("episode", "local"):
        for n in (1, 3, None):
            mask = loss_mask(ROLE, TURN, kind, n)
            assert all(m == 0 for m, r in zip(mask, ROLE, strict=True) if r in (B, S))


def test_tokens_before_the_branch_are_never_in_a_local_window():
    assert loss_mask([A, B, A], [-1, -1, 0], "local", None).tolist() == [0, 0, 1]


def _row(pair_id, kind, prompt, chosen, rejected):
    """PAIR_SCHEMA row from (ids, roles, turns) triples (no mask: the trainer builds it)."""
    return {
        "pair_id": pair_id,
        "kind": kind,
        "task_id": "t",
        "task_type": "pick_and_place_simple",
        "round": 1,
        "prompt_ids": prompt,
        "chosen_ids": chosen[0],
        "rejected_ids": rejected[0],
        "chosen_role": chosen[1],
        "rejected_role": rejected[1],
        "chosen_turn": chosen[2],
        "rejected_turn": rejected[2],
        "label_reason": "efficiency",
        "chosen_success": True,
        "rejected_success": True,
        "chosen_steps": 2,
        "rejected_steps": 5,
        "chosen_arm": "skip",
        "rejected_arm": "invoke",
        "branch_id": "b",
        "branch_pool": "post_skill",
        "branch_score": 2.0,
        "branch_strategy": "entropy",
        "candidate_skill": "heat_object",
        "chosen_source": "f1",
        "rejected_source": "f2",
        "prompt_messages": "[]",
        "chosen_messages": "[]",
        "rejected_messages": "[]",
    }


CHOSEN = (list(range(100, 113)), ROLE, TURN)
REJECTED = ([200, 201, 202, 203, 204, 205], [A, B, A, A, B, A], [0, 0, 1, 1, 1, 2])
# system (4 tokens), task (3), an older observation (4), an older assistant turn (3), the branch header (2)
PROMPT = [START, 10, 11, 12, START, 20, 21, START, 30, 31, 32, START, 40, 41, START, 50]


@pytest.fixture
def pair_shards(tmp_path):
    rows = [
        _row("local-0", "local", PROMPT, CHOSEN, REJECTED),
        _row("episode-0", "episode", PROMPT[:7], CHOSEN, REJECTED),
    ]
    write_shard(rows[:1], tmp_path / "shards" / "00000.parquet", "pair")
    write_shard(rows[1:], tmp_path / "shards" / "00001.parquet", "pair")
    return sorted((tmp_path / "shards").glob("*.parquet"))


@pytest.mark.parametrize("n", [1, 3, None], ids=["n=1", "n=3", "n=all"])
def test_shards_to_examples_rebuild_the_window_for_any_n(pair_shards, n):
    table = read_shards(pair_shards, "pair")
    examples, stats = build_examples(table, n=n, policy=FitPolicy(trim_after_window=False))
    local, episode = examples
    assert local["chosen_loss_mask"] == EXPECTED[n]
    assert local["rejected_loss_mask"] == loss_mask(REJECTED[1], REJECTED[2], "local", n).tolist()
    assert episode["chosen_loss_mask"] == [int(r == A) for r in ROLE]
    assert local["prompt_ids"] == PROMPT and local["chosen_ids"] == CHOSEN[0]
    assert dict(stats.trained) == {"episode": 1, "local": 1}
    # where the gradient goes: the loss-window tokens of each kind's trained pairs
    for kind, ex in (("local", local), ("episode", episode)):
        assert stats.trained_tokens[kind] == sum(ex["chosen_loss_mask"]) + sum(ex["rejected_loss_mask"]) > 0


def test_pair_rows_carry_no_loss_window_only_what_train_builds_it_from():
    assert not {"chosen_loss_mask", "rejected_loss_mask", "window_n"} & set(PAIR_SCHEMA.names)
    assert {"chosen_role", "chosen_turn", "rejected_role", "rejected_turn"} <= set(PAIR_SCHEMA.names)


@pytest.mark.parametrize("bad", [0, -1])
def test_a_window_n_below_one_is_not_a_window(bad):
    with pytest.raises(ValueError, match="window n must be >= 1 or None"):
        loss_mask(ROLE, TURN, "local", bad)


def test_completion_after_the_window_is_dropped_and_counted(pair_shards):
    table = read_shards(pair_shards, "pair")
    (local, episode), stats = build_examples(table, kinds=("local", "episode"), n=1)
    assert local["chosen_ids"] == CHOSEN[0][:2] and local["chosen_loss_mask"] == [1, 1]
    assert local["rejected_ids"] == [200] and local["rejected_loss_mask"] == [1]
    # episode: everything up to the last assistant token stays
    assert episode["chosen_ids"] == CHOSEN[0][:12] and episode["rejected_ids"] == REJECTED[0]
    assert stats.tail_tokens_trimmed == (13 - 2) + (6 - 1) + (13 - 12) + 0


def test_max_length_drops_the_oldest_prompt_messages_and_keeps_system_task_and_window():
    cmask = loss_mask(*CHOSEN[1:], "local", 3)
    rmask = loss_mask(*REJECTED[1:], "local", 3)
    # chosen is 9 tokens after trimming to its window: 16 + 9 = 25 tokens, 3 too many for 22
    out = fit_pair(PROMPT, CHOSEN[0], REJECTED[0], cmask, rmask, FitPolicy(22, 2, START, True))
    # the cut (7 + 3 = 10) lands inside the old observation: the context restarts at the next message
    assert out.prompt_ids == [START, 10, 11, 12, START, 20, 21] + [START, 40, 41, START, 50]
    assert out.prompt_tokens_dropped == 4
    assert out.chosen_ids == CHOSEN[0][:9] and out.chosen_loss_mask == EXPECTED[3][:9]
    assert len(out.prompt_ids) + len(out.chosen_ids) <= 22
    # keeping only the system message lets the task go first
    out = fit_pair(PROMPT, CHOSEN[0], REJECTED[0], cmask, rmask, FitPolicy(22, 1, START, True))
    assert out.prompt_ids == [START, 10, 11, 12] + [START, 30, 31, 32, START, 40, 41, START, 50]


def test_a_pair_that_fits_is_left_untouched():
    cmask = loss_mask(*CHOSEN[1:], "local", 3)
    rmask = loss_mask(*REJECTED[1:], "local", 3)
    out = fit_pair(PROMPT, CHOSEN[0], REJECTED[0], cmask, rmask, FitPolicy(25, 2, START, True))
    assert out.prompt_ids == PROMPT and out.prompt_tokens_dropped == 0


def test_pairs_that_still_do_not_fit_are_counted_and_skipped_or_raise(pair_shards):
    table = read_shards(pair_shards, "pair")
    # the local window needs 9 tokens and system + task 7: 15 cannot hold it; the episode pair (prompt 7,
    # window 12) cannot fit either
    examples, stats = build_examples(table, n=3, policy=FitPolicy(15, 2, START, True))
    assert examples == []
    assert dict(stats.too_long) == {"episode": 1, "local": 1}
    assert set(stats.too_long_ids) == {"local-0", "episode-0"}
    assert "SKIPPED 2" in stats.report() and "max_length=15" in stats.report()
    with pytest.raises(ValueError, match=r"pair local-0 .* does not fit max_length=15.*train_overflow"):
        build_examples(table, n=3, policy=FitPolicy(15, 2, START, True), overflow="error")
    # keeping only the system message frees the task's 3 tokens: the local pair fits in 16 + 3 - 3
    examples, stats = build_examples(table, kinds=("local",), n=3, policy=FitPolicy(13, 1, START, True))
    assert [e["pair_id"] for e in examples] == ["local-0"] and stats.too_long["local"] == 0


def test_kind_selection_and_mix_ratio():
    side = ([5, 6], [A, A], [0, 0])
    rows = [_row(f"l{i}", "local", [START, 9], side, side) for i in range(6)]
    rows += [_row(f"e{i}", "episode", [START, 9], side, side) for i in range(2)]
    table = pa.Table.from_pylist(rows, schema=PAIR_SCHEMA)
    only_ep, stats = build_examples(table, kinds=("episode",))
    assert [e["pair_id"] for e in only_ep] == ["e0", "e1"] and stats.not_selected["local"] == 6
    mixed, stats = build_examples(table, local_fraction=0.5, seed=3)
    kinds = [e["kind"] for e in mixed]
    assert kinds.count("local") == 2 and kinds.count("episode") == 2
    assert stats.dropped_by_mix["local"] == 4
    again, _ = build_examples(table, local_fraction=0.5, seed=3)
    assert [e["pair_id"] for e in again] == [e["pair_id"] for e in mixed]  # seeded


def test_branch_pool_filter_and_pair_cap():
    side = ([5, 6], [A, A], [0, 0])
    rows = [_row(f"l{i}", "local", [START, 9], side, side) for i in range(6)]
    for i, row in enumerate(rows):
        row["branch_pool"] = "ordinary" if i % 3 == 0 else "post_skill"
    rows += [_row(f"e{i}", "episode", [START, 9], side, side) for i in range(2)]
    table = pa.Table.from_pylist(rows, schema=PAIR_SCHEMA)
    ordinary, stats = build_examples(table, branch_pools="ordinary")
    assert [e["pair_id"] for e in ordinary] == ["l0", "l3", "e0", "e1"]  # episode pairs are not filtered
    assert stats.other_pool["local"] == 4
    post, _ = build_examples(table, branch_pools="post_skill", kinds=("local",))
    assert [e["pair_id"] for e in post] == ["l1", "l2", "l4", "l5"]
    capped, stats = build_examples(table, max_pairs=3, seed=1)
    assert len(capped) == 3 and sum(stats.dropped_by_cap.values()) == 5 and sum(stats.trained.values()) == 3
    again, _ = build_examples(table, max_pairs=3, seed=1)
    assert [e["pair_id"] for e in again] == [e["pair_id"] for e in capped]  # seeded
    assert len(build_examples(table, max_pairs=100)[0]) == 8  # a cap above the count changes nothing


def test_label_reason_filter_keeps_episode_pairs():
    side = ([5, 6], [A, A], [0, 0])
    rows = [_row(f"l{i}", "local", [START, 9], side, side) for i in range(5)]
    for i, row in enumerate(rows):
        row["label_reason"] = "success_vs_failure" if i % 2 == 0 else "efficiency"
    rows[4]["label_reason"] = "success_rate"
    rows.append(_row("e0", "episode", [START, 9], side, side) | {"label_reason": "success_vs_failure"})
    table = pa.Table.from_pylist(rows, schema=PAIR_SCHEMA)
    svf, stats = build_examples(table, local_reasons="success_vs_failure")
    assert [e["pair_id"] for e in svf] == ["l0", "l2", "e0"] and stats.other_reason["local"] == 3
    eff, _ = build_examples(table, local_reasons="efficiency")
    assert [e["pair_id"] for e in eff] == ["l1", "l3", "e0"]
    rate, _ = build_examples(table, local_reasons="success_rate")
    assert [e["pair_id"] for e in rate] == ["l4", "e0"]
    assert len(build_examples(table)[0]) == 6


def test_a_side_without_trainable_tokens_is_skipped():
    no_assistant = ([5, 6], [B, B], [0, 0])
    table = pa.Table.from_pylist(
        [_row("x", "local", [START], ([5], [A], [0]), no_assistant)], schema=PAIR_SCHEMA
    )
    examples, stats = build_examples(table)
    assert examples == [] and stats.empty_window["local"] == 1


def test_collator_puts_the_loss_mask_into_completion_mask():
    rows = [
        {"prompt_ids": [1, 2, 3], "chosen_ids": [4, 5, 6], "rejected_ids": [7], "kind": "local",
         "chosen_loss_mask": [1, 0, 1], "rejected_loss_mask": [1]},
        {"prompt_ids": [8], "chosen_ids": [9, 10], "rejected_ids": [11, 12, 13], "kind": "episode",
         "chosen_loss_mask": [0, 1], "rejected_loss_mask": [1, 1, 0], "ref_chosen_logps": -1.0,
         "ref_rejected_logps": -2.0},
    ]  # fmt: skip
    rows[0].update(ref_chosen_logps=-3.0, ref_rejected_logps=-4.0)
    out = MaskedPreferenceCollator(pad_token_id=0)(rows)
    assert out["input_ids"].tolist() == [
        [1, 2, 3, 4, 5, 6],
        [8, 9, 10, 0, 0, 0],
        [1, 2, 3, 7, 0, 0],
        [8, 11, 12, 13, 0, 0],
    ]
    assert out["completion_mask"].tolist() == [
        [0, 0, 0, 1, 0, 1],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 1, 1, 0, 0, 0],
    ]
    assert out["attention_mask"].sum(1).tolist() == [6, 3, 4, 4]
    assert out["pair_kind"].tolist() == [1, 0]
    assert torch.equal(out["ref_chosen_logps"], torch.tensor([-3.0, -1.0]))


def test_collator_refuses_rows_that_were_not_fitted():
    row = {"pair_id": "p9", "prompt_ids": [1] * 8, "chosen_ids": [2] * 4, "rejected_ids": [3],
           "chosen_loss_mask": [1] * 4, "rejected_loss_mask": [1]}  # fmt: skip
    with pytest.raises(ValueError, match="pair p9: 12 tokens exceed max_length=10"):
        MaskedPreferenceCollator(pad_token_id=0, max_length=10)([row])
    with pytest.raises(ValueError, match="pair p9: chosen_loss_mask has 3 entries for 4 chosen tokens"):
        MaskedPreferenceCollator(pad_token_id=0)([{**row, "chosen_loss_mask": [1, 1, 1]}])
