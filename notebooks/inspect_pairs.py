# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Inspect a round's preference pairs
#
# Look at the pairs a SelSkill round produced before trusting them: how many of each kind
# and label reason, and what a pair actually contains. A pair is rendered as its shared
# prefix (shown once, collapsed when long), then the chosen and rejected completions side
# by side, starting at the **branch point** (red marker). Tokens (or messages, where the
# round's model is absent) are coloured by role (prompt/system, assistant, observation, skill
# return); the tokens DPO trains on (all
# assistant tokens for episode pairs, the first n assistant turns after the branch for local
# pairs; n = 3 unless `render_pair(..., window_n=...)` says otherwise) are highlighted in
# green. The highlight is the trainer's own window, built from each token's role and turn.
#
# Settings come from environment variables so the same notebook runs in the test suite:
# `SELSKILL_RUN` (the experiment directory `runs/<exp>`, default `runs/tiny`), `SELSKILL_ROUND`
# (default: the latest round with pairs), filters `SELSKILL_KIND` (episode|local), `SELSKILL_REASON`
# (success_vs_failure|efficiency), `SELSKILL_TASK_TYPE`, and `SELSKILL_PAIR` (which of the
# filtered pairs to render). Or just edit the next cell.

# %%
import json
import os
from pathlib import Path

from IPython.display import HTML, display

import selskill
from selskill.outputs import pair_html as si

RUN = Path(os.environ.get("SELSKILL_RUN", "runs/tiny"))
ROUND = os.environ.get("SELSKILL_ROUND") or None
KIND = os.environ.get("SELSKILL_KIND") or None
REASON = os.environ.get("SELSKILL_REASON") or None
TASK_TYPE = os.environ.get("SELSKILL_TASK_TYPE") or None
PAIR_INDEX = int(os.environ.get("SELSKILL_PAIR", "0"))

labelled = selskill.rounds(RUN, "label")
# by default the latest round that kept a pair (ranks without pairs write 0-row shards)
rnd = int(ROUND) if ROUND else next((r for r in reversed(labelled) if len(selskill.load_pairs(RUN, r))), None)
if rnd is None:
    raise SystemExit(f"no pairs under {RUN}/round_*/label/shards: run a round first (make round ROUND=1)")
print(f"run {RUN}, rounds with a label stage: {labelled}; inspecting round {rnd}")

# %% [markdown]
# ## Load the pairs
#
# `selskill.load_pairs(run, round)` (and `load_rollouts`, `load_branches`, `load_forks`,
# `load_eval`) return a `datasets.Dataset` of a stage's rows.

# %%
pairs = selskill.load_pairs(RUN, rnd)
print(pairs)

# label stats: how many training tasks were sampled (for pairs/task) and why pairs were dropped
stats = [json.loads(p.read_text()) for p in sorted((RUN / f"round_{rnd}" / "label" / "stats").glob("*.json"))]
n_tasks = sum(s.get("yield", {}).get("tasks", 0) for s in stats) or None
discarded: dict = {}
for s in stats:
    for reason, n in s.get("yield", {}).get("discarded", {}).items():
        discarded[reason] = discarded.get(reason, 0) + n

# %% [markdown]
# ## Yield: pairs by kind and label reason

# %%
SUMMARY_COLUMNS = [
    "round",
    "kind",
    "label_reason",
    "task_type",
    "chosen_arm",
    "chosen_steps",
    "rejected_steps",
]
summary = pairs.select_columns(SUMMARY_COLUMNS)
display(HTML(si.yield_table(summary, n_tasks={rnd: n_tasks} if n_tasks else None)))
display(
    HTML(si.html_table(["discarded because", "count"], sorted((k, v) for k, v in discarded.items() if v)))
)
by_type: dict = {}
for p in summary:
    by_type[p["task_type"]] = by_type.get(p["task_type"], 0) + 1
display(HTML(si.html_table(["task type", "pairs"], sorted(by_type.items()))))

# %% [markdown]
# ## Filter by kind, reason and task type

# %%
view = pairs.filter(si.matches, fn_kwargs={"kind": KIND, "reason": REASON, "task_type": TASK_TYPE})
print(f"{len(view)} of {len(pairs)} pairs match kind={KIND} reason={REASON} task_type={TASK_TYPE}")
display(
    HTML(
        si.pairs_table(
            view.select_columns(
                [
                    "pair_id",
                    "kind",
                    "label_reason",
                    "task_type",
                    "chosen_arm",
                    "rejected_arm",
                    "chosen_steps",
                    "rejected_steps",
                ]
            ),
            limit=25,
        )
    )
)

# %% [markdown]
# ## Render one pair
#
# Tokens are decoded with the tokenizer of the policy that sampled this round (round r-1's
# model) when it exists, the prefix coloured by role using the source rollout (episode pairs)
# or fork (local pairs) it came from. Without that model the pair is shown as the messages its
# row carries, as text, the assistant turns of the loss window highlighted.

# %%
tokenizer = None
model_dir = RUN / f"round_{rnd - 1}" / "train" / "model"
if (model_dir / "tokenizer_config.json").exists():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
print(
    "tokenizer:",
    model_dir if tokenizer is not None else f"none in {model_dir} (showing each message as text)",
)


sources = {}  # stage -> its rows, loaded once


def source_rows(pair: dict) -> dict:
    """The source rows (token ids + roles) of a pair's sides, for the prefix colours."""
    stage, key = ("fork", "fork_id") if pair["kind"] == "local" else ("sample", "rollout_id")
    if stage not in sources:
        try:
            sources[stage] = selskill.load_stage(RUN, rnd, stage).select_columns([key, "token_ids", "role"])
        except FileNotFoundError as exc:  # the prefix is then shown without role colours
            print(f"no source rows for the prefix colours: {exc}")
            sources[stage] = None
    rows = sources[stage]
    if rows is None:
        return {}
    position = {ident: i for i, ident in enumerate(rows[key])}
    wanted = [pair["chosen_source"], pair["rejected_source"]]
    return {ident: rows[position[ident]] for ident in wanted if ident in position}


if len(view) == 0:
    print("no pair matches the filters")
else:
    pair = view[min(PAIR_INDEX, len(view) - 1)]
    roles = si.prefix_roles(pair, source_rows(pair)) if tokenizer is not None else None
    display(HTML(si.render_pair(pair, tokenizer=tokenizer, prompt_roles=roles, max_prefix_tokens=200)))
