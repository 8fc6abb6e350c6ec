"""Does a trained model prefer what its pairs chose? The pair-level check behind a flat round.

A round that leaves held-out SR flat has lost its signal somewhere: in the labels, in a DPO
step too weak to move the policy, or in a step that moves the policy on its own pairs but does
not carry to other games. Held-out SR cannot tell these apart; the pairs themselves can. For
each trainable pair (fitted and windowed exactly as training fits it) and each model this
measures, teacher-forced:

- the **decision**: the first token where chosen and rejected differ (for a local pair, the
  branch point's invoke-or-skip token). `decision_margin` is log p(chosen token) − log p(rejected
  token) there, and `decision_greedy` whether the chosen token is the model's argmax: the
  greedy choice the model would make at that point of the recorded prefix.
- the **window**: the summed log-probabilities of each side over its loss window (what DPO's
  sigmoid loss compares), and their difference.

Comparing the init with the trained model on the same pairs shows whether the step moved the
policy where the pairs point (decision shares up, window differences up) and by how much, per
pair kind; the DPO reward margin β·Δ follows from the window differences of the two models.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

# the columns of the printed table, per model and pair kind
COLUMNS = (
    "pairs",
    "decision_prefers_chosen",
    "decision_greedy_chosen",
    "decision_greedy_rejected",
    "decision_margin_mean",
    "window_prefers_chosen",
    "window_diff_mean",
    "reward_margin_mean",
    "reward_accuracy",
)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where `a` and `b` differ (None: one is a prefix of the other)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None


def _side(model, prompt: list[int], completion: list[int], mask: list[int], divergence: int | None):
    """(summed log-prob over the loss window, log-probs over the vocabulary at the divergence position)."""
    import torch

    ids = torch.tensor([prompt + completion], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    target = ids[0, 1:]
    token_logp = logp.gather(1, target[:, None])[:, 0]
    start = len(prompt) - 1  # the position predicting the first completion token
    comp = token_logp[start : start + len(completion)]
    m = torch.tensor(mask[: len(completion)], dtype=torch.float32)
    window = float((comp * m).sum())
    at = None
    if divergence is not None:
        at = logp[start + divergence]
    return window, at


def pair_preferences(model, examples: Sequence[dict]) -> list[dict]:
    """Per fitted pair: the decision margin and greedy choice, and each side's window log-prob."""
    out = []
    for ex in examples:
        prompt, chosen, rejected = list(ex["prompt_ids"]), list(ex["chosen_ids"]), list(ex["rejected_ids"])
        d = first_divergence(chosen, rejected)
        c_window, at = _side(model, prompt, chosen, list(ex["chosen_loss_mask"]), d)
        r_window, _ = _side(model, prompt, rejected, list(ex["rejected_loss_mask"]), None)
        row = {
            "pair_id": ex["pair_id"],
            "kind": ex["kind"],
            "chosen_window_logp": c_window,
            "rejected_window_logp": r_window,
            "window_diff": c_window - r_window,
            "divergence": d,
        }
        if at is not None:
            c_tok, r_tok = chosen[d], rejected[d]
            row["decision_margin"] = float(at[c_tok] - at[r_tok])
            row["decision_greedy"] = bool(int(at.argmax()) == c_tok)
            row["decision_greedy_rejected"] = bool(int(at.argmax()) == r_tok)
        out.append(row)
    return out


def summarize_preferences(
    rows: Sequence[dict], reference: Sequence[dict] | None = None, beta: float = 0.1
) -> dict:
    """Per pair kind: shares and means of `pair_preferences` rows (and DPO reward margins vs `reference`)."""
    ref = {r["pair_id"]: r for r in reference or ()}
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_kind[r["kind"]].append(r)
        by_kind["all"].append(r)
    out = {}
    for kind, rs in sorted(by_kind.items()):
        dec = [r for r in rs if "decision_margin" in r]
        s = {
            "pairs": len(rs),
            "window_diff_mean": float(np.mean([r["window_diff"] for r in rs])),
            "window_prefers_chosen": float(np.mean([r["window_diff"] > 0 for r in rs])),
        }
        if dec:
            s["decision_margin_mean"] = float(np.mean([r["decision_margin"] for r in dec]))
            s["decision_prefers_chosen"] = float(np.mean([r["decision_margin"] > 0 for r in dec]))
            s["decision_greedy_chosen"] = float(np.mean([r["decision_greedy"] for r in dec]))
            s["decision_greedy_rejected"] = float(np.mean([r["decision_greedy_rejected"] for r in dec]))
        if ref:
            both = [(r, ref[r["pair_id"]]) for r in rs if r["pair_id"] in ref]
            if both:
                margins = [
                    beta
                    * (
                        (r["chosen_window_logp"] - f["chosen_window_logp"])
                        - (r["rejected_window_logp"] - f["rejected_window_logp"])
                    )
                    for r, f in both
                ]
                s["reward_margin_mean"] = float(np.mean(margins))
                s["reward_accuracy"] = float(np.mean([m > 0 for m in margins]))
                dd = [
                    r["decision_margin"] - f["decision_margin"]
                    for r, f in both
                    if "decision_margin" in r and "decision_margin" in f
                ]
                if dd:
                    s["decision_margin_change_mean"] = float(np.mean(dd))
        out[kind] = s
    return out


def format_preferences(summary: dict[str, dict[str, dict]]) -> str:
    """`{model: summarize_preferences(...)}` as a `model | kind | ...` table, one line per model and kind."""
    lines = ["model | kind | " + " | ".join(COLUMNS)]
    for name, by_kind in summary.items():
        for kind, s in by_kind.items():
            cells = [f"{s[k]:.3f}" if isinstance(s.get(k), float) else str(s.get(k, "-")) for k in COLUMNS]
            lines.append(f"{name} | {kind} | " + " | ".join(cells))
    return "\n".join(lines)


def probe_round(recipe, models: Sequence[tuple[str, str]], out: str | None = None) -> dict:
    """Round `recipe.run.round`'s pairs, fitted as its train stage fits them, probed under every
    `(name, model directory)` of `models`; the first is the reference of the reward margins. Writes
    the rows and the summary to `out` (default runs/<exp>/round_<r>/probe_pairs.json) and returns the summary."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selskill.data.contract import read_stage
    from selskill.data.layout import StageDir, round_dir
    from selskill.train.pairs import build_from_config

    run = recipe.run
    table = read_stage(StageDir.of(run.runs_dir, run.exp, run.round, "label"), "pair", run.world_size)
    examples, _ = build_from_config(table, recipe.train, AutoTokenizer.from_pretrained(models[0][1]))
    logger.info(f"{len(examples)} trainable pairs of {table.num_rows}")
    rows: dict[str, list[dict]] = {}
    for name, path in models:
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
        rows[name] = pair_preferences(model, examples)
        del model
    reference = models[0][0]
    summary = {
        name: summarize_preferences(r, None if name == reference else rows[reference], beta=recipe.train.beta)
        for name, r in rows.items()
    }
    path = Path(out) if out else round_dir(run.runs_dir, run.exp, run.round) / "probe_pairs.json"
    path.write_text(json.dumps({"models": dict(models), "summary": summary, "pairs": rows}, indent=1))
    logger.info(f"wrote {path}")
    return summary
