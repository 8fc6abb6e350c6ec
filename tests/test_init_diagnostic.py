"""`selskill bench init-accuracy` counts the demonstrated turns a model reproduces."""

import torch

from selskill.agent.turn_format import render_action, render_skill_call
from selskill.benchmarks.alfworld import turn_accuracy as mod
from selskill.sft.demos import Demo


class _Next:
    """Test double: a 'model' whose argmax is the true next token, except inside `wrong` spans."""

    def __init__(self, vocab, wrong=()):
        self.vocab, self.wrong = vocab, list(wrong)

    def __call__(self, input_ids):
        ids = input_ids[0].tolist()
        logits = torch.zeros(1, len(ids), self.vocab)
        for p in range(len(ids) - 1):
            target = ids[p + 1]
            if any(a <= p + 1 < b for a, b in self.wrong):
                target = (target + 1) % self.vocab
            logits[0, p, target] = 1.0
        return type("Out", (), {"logits": logits})()


def test_turn_accuracy_by_kind(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": render_action("go to desk 1")},
        {"role": "user", "content": "obs"},
        {"role": "assistant", "content": render_skill_call("heat_object", None)},
        {"role": "user", "content": "obs"},
        {"role": "assistant", "content": render_action("take mug 1 from desk 1")},
    ]
    demo = Demo("t", "pick_heat_then_place_in_recep", messages, 1, 1, 2)
    vocab = len(tok)
    perfect = mod.turn_accuracy(_Next(vocab), tok, [demo])
    assert perfect["turns"] == 3 and perfect["exact"] == 1.0
    assert perfect["by_kind"] == {"go to": "1/1", "tool heat_object": "1/1", "take": "1/1"}

    # one wrong token inside the last assistant turn: only that turn counts as missed
    enc = tok.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    last = max(i for i, bit in enumerate(enc["assistant_masks"]) if bit)
    missed = mod.turn_accuracy(_Next(vocab, wrong=[(last - 1, last)]), tok, [demo])
    assert missed["by_kind"] == {"go to": "1/1", "tool heat_object": "1/1", "take": "0/1"}
    assert missed["exact"] == round(2 / 3, 3)

    # an injected mistake (untrained turn) is not counted
    demo.untrained_turns = [0]
    assert mod.turn_accuracy(_Next(vocab), tok, [demo])["turns"] == 2
