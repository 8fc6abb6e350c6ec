"""Where a round's signal goes: does each model prefer the side its pairs chose?

    python pipelines/probe_pairs.py --config recipes/mini.yaml --exp mini --round 1 \
        --models init=runs/mini/round_0/train/model r1=runs/mini/round_1/train/model

Reads round r's pair shards, fits and windows them as training does (the recipe's train
section), and measures for every model, teacher-forced on the recorded sequences: at the first
token where chosen and rejected differ (the branch decision of a local pair), the log-prob margin
and whether the model's greedy choice is the chosen side; over each side's loss window, the summed
log-prob difference; against the first model, the DPO reward margin. Per pair kind, printed and
written to runs/<exp>/round_<r>/probe_pairs.json (or --out). selskill.train.probe has the logic.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path


def _own_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This script's options; every other argument is the recipe's (--config, --exp, --round, ...)."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ap.add_argument("--models", nargs="+", default=[], metavar="NAME=PATH")
    ap.add_argument("--out")
    args, rest = ap.parse_known_args(argv)
    for entry in args.models:
        if not entry.partition("=")[2]:
            raise ValueError(f"--models takes NAME=PATH entries, got {entry!r}")
    args.models = [tuple(entry.split("=", 1)) for entry in args.models]
    return args, rest


def main(argv=None) -> int:
    from selskill.errors import run_main

    return run_main(lambda: _probe(list(sys.argv[1:] if argv is None else argv)))


def _probe(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    args, rest = _own_args(argv)
    models, out = args.models, args.out
    if not models:
        raise ValueError("give --models NAME=PATH [NAME=PATH ...] (the first is the reference)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selskill.config import load_recipe
    from selskill.data.contract import read_stage
    from selskill.data.layout import StageDir, round_dir
    from selskill.logs import ROOT
    from selskill.train.pairs import build_from_config
    from selskill.train.probe import pair_preferences, summarize_preferences

    recipe = load_recipe(rest)
    log = logging.getLogger(f"{ROOT}.probe_pairs")
    run = recipe.run
    table = read_stage(StageDir.of(run.runs_dir, run.exp, run.round, "label"), "pair", run.world_size)
    tok = AutoTokenizer.from_pretrained(models[0][1])
    examples, _ = build_from_config(table, recipe.train, tok)
    log.info(f"{len(examples)} trainable pairs of {table.num_rows}")
    rows: dict[str, list[dict]] = {}
    for name, path in models:
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
        rows[name] = pair_preferences(model, examples)
        del model
    ref = rows[models[0][0]]
    summary = {
        name: summarize_preferences(r, None if name == models[0][0] else ref, beta=recipe.train.beta)
        for name, r in rows.items()
    }
    keys = (
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
    print("model | kind | " + " | ".join(keys))
    for name, by_kind in summary.items():
        for kind, s in by_kind.items():
            vals = [f"{s[k]:.3f}" if isinstance(s.get(k), float) else str(s.get(k, "-")) for k in keys]
            print(f"{name} | {kind} | " + " | ".join(vals))
    path = Path(out) if out else round_dir(run.runs_dir, run.exp, run.round) / "probe_pairs.json"
    path.write_text(json.dumps({"models": dict(models), "summary": summary, "pairs": rows}, indent=1))
    log.info(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
