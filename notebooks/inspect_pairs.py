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
# by side, starting at the **branch point** (red marker). Tokens are coloured by role
# (prompt/system, assistant, observation, skill return); tokens inside the stored loss mask
# (the assistant tokens DPO trains on: all of them for episode pairs, the first n
# assistant turns after the branch for local pairs) are highlighted in green.
#
# Settings come from environment variables so the same notebook runs in the test suite:
# `SELSKILL_RUN` (run directory, default `runs/tiny`), `SELSKILL_ROUND` (default: the latest
# round with pairs), filters `SELSKILL_KIND` (episode|local), `SELSKILL_REASON`
# (success_vs_failure|efficiency), `SELSKILL_TASK_TYPE`, and `SELSKILL_PAIR` (which of the
# filtered pairs to render). Or just edit the next cell.

# %%
import json
import os
from pathlib import Path

import pyarrow.dataset as pads
import pyarrow.parquet as pq
from datasets import load_dataset
from IPython.display import HTML, display

from selskill import inspect as si

RUN = Path(os.environ.get("SELSKILL_RUN", "runs/tiny"))
ROUND = os.environ.get("SELSKILL_ROUND") or None
KIND = os.environ.get("SELSKILL_KIND") or None
REASON = os.environ.get("SELSKILL_REASON") or None
TASK_TYPE = os.environ.get("SELSKILL_TASK_TYPE") or None
PAIR_INDEX = int(os.environ.get("SELSKILL_PAIR", "0"))


def shard_files(round_: int, stage: str) -> list[str]:
    """A stage's non-empty shards (datasets cannot read a 0-row parquet file; ranks without pairs write one)."""
    files = sorted((RUN / f"round_{round_}" / stage / "shards").glob("*.parquet"))
    return [str(p) for p in files if pq.ParquetFile(p).metadata.num_rows > 0]


rounds = sorted(
    int(p.name.split("_", 1)[1])
    for p in RUN.glob("round_*")
    if p.name.split("_", 1)[1].isdigit() and shard_files(int(p.name.split("_", 1)[1]), "label")
)
if not rounds:
    raise SystemExit(f"no pairs under {RUN}/round_*/label/shards: run a round first (make round ROUND=1)")
rnd = int(ROUND) if ROUND else rounds[-1]
print(f"run {RUN}, rounds with pairs: {rounds}; inspecting round {rnd}")

# %% [markdown]
# ## Load the pair shards

# %%
pairs = load_dataset("parquet", data_files=shard_files(rnd, "label"), split="train")
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
SUMMARY_COLUMNS = ["round", "kind", "label_reason", "task_type", "chosen_arm", "chosen_steps", "rejected_steps"]
summary = pairs.select_columns(SUMMARY_COLUMNS)
display(HTML(si.yield_table(summary, n_tasks={rnd: n_tasks} if n_tasks else None)))
display(HTML(si.html_table(["discarded because", "count"], sorted((k, v) for k, v in discarded.items() if v))))
by_type: dict = {}
for p in summary:
    by_type[p["task_type"]] = by_type.get(p["task_type"], 0) + 1
display(HTML(si.html_table(["task type", "pairs"], sorted(by_type.items()))))

# %% [markdown]
# ## Filter by kind, reason and task type

# %%
view = pairs.filter(si.matches, fn_kwargs={"kind": KIND, "reason": REASON, "task_type": TASK_TYPE})
print(f"{len(view)} of {len(pairs)} pairs match kind={KIND} reason={REASON} task_type={TASK_TYPE}")
display(HTML(si.pairs_table(view.select_columns(
    ["pair_id", "kind", "label_reason", "task_type", "chosen_arm", "rejected_arm", "chosen_steps", "rejected_steps"]
), limit=25)))

# %% [markdown]
# ## Render one pair
#
# Tokens are decoded with the tokenizer of the policy that sampled this round (round r-1's
# model) when it exists, else shown as ids. The prefix is coloured by role using the source
# rollout (episode pairs) or fork (local pairs) it came from.

# %%
tokenizer = None
model_dir = RUN / f"round_{rnd - 1}" / "train" / "model"
if (model_dir / "tokenizer_config.json").exists():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
print("tokenizer:", model_dir if tokenizer is not None else "none (showing token ids)")


def source_rows(pair: dict) -> dict:
    """The source rows (token ids + roles) of a pair's sides, for the prefix colours."""
    stage, key = ("fork", "fork_id") if pair["kind"] == "local" else ("sample", "rollout_id")
    files = shard_files(rnd, stage)
    if not files:
        return {}
    ids = [pair["chosen_source"], pair["rejected_source"]]
    table = pads.dataset(files).to_table(columns=[key, "token_ids", "role"], filter=pads.field(key).isin(ids))
    return {row[key]: row for row in table.to_pylist()}


if len(view) == 0:
    print("no pair matches the filters")
else:
    pair = view[min(PAIR_INDEX, len(view) - 1)]
    roles = si.prefix_roles(pair, source_rows(pair))
    display(HTML(si.render_pair(pair, tokenizer=tokenizer, prompt_roles=roles, max_prefix_tokens=200)))
