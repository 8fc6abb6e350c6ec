"""The pair-preference probe: decision margins and window log-probs, teacher-forced."""

import torch
from train_helpers import micro_model, micro_tokenizer

from selskill.train.probe import first_divergence, pair_preferences, summarize_preferences


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def _example(tok, pair_id="local/a>b", kind="local"):
    prompt = _ids(tok, "On the countertop 1, you see a apple 1, a knife 2, and a mug 3.")
    chosen = _ids(tok, '<tool_call>{"name": "heat_object"}</tool_call>')
    rejected = _ids(tok, "<action>go to countertop 1</action>")
    return {
        "pair_id": pair_id,
        "kind": kind,
        "prompt_ids": prompt,
        "chosen_ids": chosen,
        "rejected_ids": rejected,
        "chosen_loss_mask": [1] * len(chosen),
        "rejected_loss_mask": [1] * len(rejected),
    }


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert first_divergence([5], [6]) == 0
    assert first_divergence([1, 2], [1, 2, 3]) is None


def test_window_logp_is_the_models_sequence_logp_and_swapping_sides_flips_every_sign():
    tok = micro_tokenizer()
    model = micro_model(tok).eval()
    ex = _example(tok)
    (row,) = pair_preferences(model, [ex])
    ids = torch.tensor([ex["prompt_ids"] + ex["chosen_ids"]])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    n = len(ex["prompt_ids"])
    expected = float(sum(logp[n - 1 + i, t] for i, t in enumerate(ex["chosen_ids"])))
    assert abs(row["chosen_window_logp"] - expected) < 1e-4

    swapped = dict(
        ex,
        chosen_ids=ex["rejected_ids"],
        rejected_ids=ex["chosen_ids"],
        chosen_loss_mask=ex["rejected_loss_mask"],
        rejected_loss_mask=ex["chosen_loss_mask"],
    )
    (back,) = pair_preferences(model, [swapped])
    assert abs(back["window_diff"] + row["window_diff"]) < 1e-4
    assert abs(back["decision_margin"] + row["decision_margin"]) < 1e-4
    assert not (row["decision_greedy"] and back["decision_greedy"])


def test_masked_tokens_carry_no_window_logp():
    tok = micro_tokenizer()
    model = micro_model(tok).eval()
    ex = _example(tok)
    ex["chosen_loss_mask"] = [0] * len(ex["chosen_ids"])
    (row,) = pair_preferences(model, [ex])
    assert row["chosen_window_logp"] == 0.0


def test_a_step_toward_the_chosen_decision_shows_up_in_the_summary():
    tok = micro_tokenizer()
    model = micro_model(tok)
    ex = _example(tok)
    before = pair_preferences(model.eval(), [ex])
    d = first_divergence(ex["chosen_ids"], ex["rejected_ids"])
    ids = torch.tensor([ex["prompt_ids"] + ex["chosen_ids"]])
    pos = len(ex["prompt_ids"]) - 1 + d
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    for _ in range(20):
        logp = torch.log_softmax(model(input_ids=ids).logits[0, pos], -1)
        loss = -logp[ex["chosen_ids"][d]]
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = pair_preferences(model.eval(), [ex])
    s = summarize_preferences(after, before)["local"]
    assert after[0]["decision_greedy"]
    assert s["decision_prefers_chosen"] == 1.0 and s["decision_margin_change_mean"] > 0
    assert summarize_preferences(before, before)["all"]["reward_margin_mean"] == 0.0
