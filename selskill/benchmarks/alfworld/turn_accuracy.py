"""How often an init policy reproduces its demonstrations' turns: `selskill bench init-accuracy`.

Greedy success compounds per-turn errors, so a low success rate alone does not say whether
the policy failed to fit its demonstrations or failed to generalise from them. This rebuilds
demonstrations with the init's own recorded settings (format, mix, seed), on some of its
training games and on held-out games, and counts the assistant turns that greedy decoding
reproduces token for token under teacher forcing (the argmax at every position of the turn
is the demonstrated token), overall and by turn kind (`go to`, `take`, tool calls per skill,
...). Skill-call decisions in the demonstrations are drawn at rates below 1 by design
(selskill/sft/demos.py), so those kinds cannot reach 100%; the manual actions can.
"""

from __future__ import annotations

import random
from collections import defaultdict


def turn_kind(text: str, skill_names) -> str:
    """`go to`, `take`, ... for an action; `tool <name>` for a skill call (as the runner parses it)."""
    from selskill.agent.parser import parse_turn

    turn = parse_turn(text, skill_names)
    if turn.skill:  # also an unknown skill's name: kinds show what the policy writes
        return f"tool {turn.skill}"
    words = (turn.action or "").split()
    return " ".join(words[:2] if words[:1] == ["go"] else words[:1]) or "other"


def turn_accuracy(model, tokenizer, demos) -> dict:
    import torch

    from selskill.benchmarks.alfworld import load_alfworld_skills
    from selskill.sft.build import sft_dataset

    skill_names = load_alfworld_skills().names
    kinds: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in sft_dataset(demos, tokenizer):
        ids, mask = row["input_ids"], row["assistant_masks"]
        with torch.inference_mode():
            pred = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()
        i = 0
        while i < len(mask):
            if not mask[i]:
                i += 1
                continue
            j = i
            while j < len(mask) and mask[j]:
                j += 1
            tally = kinds[turn_kind(tokenizer.decode(ids[i:j]), skill_names)]
            tally[0] += all(pred[k - 1] == ids[k] for k in range(i, j))
            tally[1] += 1
            i = j
    hit, total = sum(v[0] for v in kinds.values()), sum(v[1] for v in kinds.values())
    return {
        "turns": total,
        "exact": round(hit / total, 3) if total else 0.0,
        "by_kind": {k: f"{v[0]}/{v[1]}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][1])},
    }


def init_turn_accuracy(model_dir: str, heldout: str, games: int = 30) -> dict:
    """`turn_accuracy` of the init policy at `model_dir` on `games` of its train games and of the
    valid_seen games under `heldout`, each side's demonstrations rebuilt from its manifest."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selskill.benchmarks.alfworld.demos import DemoBudget, DemoMix, build_demos
    from selskill.benchmarks.alfworld.env import find_games
    from selskill.benchmarks.alfworld.init_policy import train_games
    from selskill.benchmarks.alfworld.turn_format import AlfworldTurnFormat
    from selskill.sft.build import read_manifest
    from selskill.sft.demos import DemoPrompts

    manifest = read_manifest(model_dir)
    if manifest is None:
        raise ValueError(
            f"{model_dir}: no init_manifest.json beside it; this diagnostic reads the init's settings"
        )
    s = manifest["settings"]
    kwargs = {
        "mix": DemoMix(**s["demo_mix"]),
        "seed": s["seed"],
        "prompts": DemoPrompts(AlfworldTurnFormat(**s["fmt"]), s["listing_style"]),
        # a manifest without a decision budget cut its demonstrations at twice the command budget
        "budget": DemoBudget(s.get("max_decisions", 2 * s["max_env_steps"]), s["max_env_steps"]),
    }
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    trained = train_games(s["games_dir"], s["n_train_games"], s["seed"], s["game_size"])
    random.Random(0).shuffle(trained)
    held = find_games(heldout, splits="valid_seen").games[:games]
    result = {}
    for name, records, split in (("train", trained[:games], "train"), ("heldout", held, "valid_seen")):
        demos = build_demos(records, split=split, **kwargs).demos
        result[name] = {"demos": len(demos), **turn_accuracy(model, tokenizer, demos)}
    return result
