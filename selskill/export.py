"""A round's preference pairs in TRL's conversational preference format, for any DPO trainer.

selskill's own trainer reads the pair shards' token ids, so that it trains on exactly the
tokens the policy saw; a trainer that re-renders text through a chat template (stock
`trl.DPOTrainer`, and most others) needs messages instead. The export writes, per pair,
`prompt`, `chosen` and `rejected` as lists of `{"role", "content"}` messages, the pair
rows' own messages unchanged: the runner already writes the standard roles (system: the
protocol and the skill listing; user: the task and every observation; assistant: every
decision; tool: a skill's return, as `TurnFormat.skill_return_message` writes it), so no
role is renamed and no text is rewritten.

What a stock trainer cannot read from messages is selskill's loss window: it trains every
completion token, observations and skill returns included, and every assistant turn of a
local pair, where selskill trains only the assistant tokens of the first n turns after the
branch. `chosen_window_turns` / `rejected_window_turns` name those turns (0-based among the
side's assistant messages), built by the trainer's own rule (`selskill.train.pairs.loss_mask`).
A template that rewrites earlier turns (Qwen3 drops earlier <think> blocks) also renders
other tokens than the policy generated: the shards' token ids stay the exact record.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml

from selskill.config.train import TrainConfig, parse_window_n
from selskill.data.contract import read_stage
from selskill.data.layout import StageDir
from selskill.data.shards import write_parquet_atomic, write_text_atomic
from selskill.train.pairs import loss_mask

CHAT_ROLES = ("system", "user", "assistant", "tool")
DATA_FILE = "data/train-00000-of-00001.parquet"

_MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))

EXPORT_SCHEMA = pa.schema(
    [
        ("prompt", _MESSAGES),
        ("chosen", _MESSAGES),
        ("rejected", _MESSAGES),
        ("pair_id", pa.string()),
        ("kind", pa.string()),
        ("label_reason", pa.string()),
        ("chosen_arm", pa.string()),
        ("rejected_arm", pa.string()),
        ("task_id", pa.string()),
        ("task_type", pa.string()),
        ("round", pa.int32()),
        ("branch_id", pa.string()),
        ("branch_pool", pa.string()),
        ("candidate_skill", pa.string()),
        ("chosen_success", pa.bool_()),
        ("rejected_success", pa.bool_()),
        ("chosen_steps", pa.int32()),
        ("rejected_steps", pa.int32()),
        ("chosen_window_turns", pa.list_(pa.int32())),
        ("rejected_window_turns", pa.list_(pa.int32())),
    ]
)

_COPIED = [n for n in EXPORT_SCHEMA.names if n not in ("prompt", "chosen", "rejected") and "window" not in n]


def _messages(pair: dict, column: str) -> list[dict]:
    raw = pair.get(column)
    if raw is None:
        raise ValueError(
            f"pair {pair['pair_id']!r} has no {column}: its label shard predates stored prompt messages; "
            "rerun the label stage with --redo"
        )
    out = []
    for m in json.loads(raw):
        if (
            not isinstance(m, dict)
            or m.get("role") not in CHAT_ROLES
            or not isinstance(m.get("content"), str)
        ):
            raise ValueError(
                f"pair {pair['pair_id']!r}: {column} holds {m!r}, not a {{'role', 'content'}} message with a role "
                f"in {', '.join(CHAT_ROLES)}; rerun the label stage with --redo to rewrite its messages"
            )
        out.append({"role": m["role"], "content": m["content"]})
    return out


def window_turns(role, turn, kind: str, n: int | None) -> list[int]:
    """The completion's assistant turns that selskill trains (the turns holding a loss-window token)."""
    mask = loss_mask(role, turn, kind, n).astype(bool)
    return sorted({int(t) for t in np.asarray(turn)[mask]})


def conversational_row(pair: dict, n: int | None) -> dict:
    """One PAIR_SCHEMA row as an EXPORT_SCHEMA row (`n`: the local pairs' window, None = every turn)."""
    row = {
        "prompt": _messages(pair, "prompt_messages"),
        "chosen": _messages(pair, "chosen_messages"),
        "rejected": _messages(pair, "rejected_messages"),
        **{c: pair[c] for c in _COPIED},
    }
    for side in ("chosen", "rejected"):
        turns = window_turns(pair[f"{side}_role"], pair[f"{side}_turn"], pair["kind"], n)
        n_assistant = sum(1 for m in row[side] if m["role"] == "assistant")
        if turns and turns[-1] >= n_assistant:
            raise ValueError(
                f"pair {pair['pair_id']!r}: its {side} tokens have assistant turn {turns[-1]} but its {side}_messages "
                f"hold {n_assistant} assistant messages; rerun the label stage with --redo"
            )
        row[f"{side}_window_turns"] = turns
    return row


def export_table(pairs: pa.Table, n: int | None) -> pa.Table:
    return pa.Table.from_pylist([conversational_row(p, n) for p in pairs.to_pylist()], schema=EXPORT_SCHEMA)


def round_window_n(exp_dir: Path, round_: int) -> int | None:
    """The window the round's train stage recorded (`train_window_n`), else the recipe default."""
    config = StageDir.of(exp_dir.parent, exp_dir.name, round_, "train").config
    if config.is_file():
        value = (yaml.safe_load(config.read_text()) or {}).get("train_window_n")
        if value is not None:
            return parse_window_n(value)
    return parse_window_n(TrainConfig.__dataclass_fields__["train_window_n"].default)


def selskill_commit() -> str:
    """The commit of the selskill checkout doing the export ("unknown" outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


@dataclass
class Export:
    out_dir: Path
    data_file: Path
    card: Path
    rows: int
    window_n: int | None


def _counts(table: pa.Table, *columns: str) -> Counter:
    return Counter("/".join(v) for v in zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def dataset_card(table: pa.Table, exp: str, round_: int, n: int | None, recipe: str, commit: str) -> str:
    by_kind = _counts(table, "kind")
    by_reason = _counts(table, "kind", "label_reason")
    window = "every assistant turn" if n is None else f"the first {n} assistant turns"
    lines = [
        "---",
        "configs:",
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        f"    path: {DATA_FILE}",
        "tags:",
        "- dpo",
        "- preference",
        "- agents",
        "---",
        "",
        f"# selskill preference pairs: {exp}, round {round_}",
        "",
        "TRL's conversational preference format: `prompt`, `chosen` and `rejected` are lists of "
        '`{"role", "content"}` messages with roles system (protocol and skill listing), user (task and '
        "observations), assistant (decisions) and tool (a skill's return). `prompt` ends before the first "
        "assistant message the pair compares; each side ends with its last assistant message. Load it with "
        '`datasets.load_dataset("parquet", data_files=...)` and train with `trl.DPOTrainer`.',
        "",
        "## How the pairs were made",
        "",
        "The policy played each task several times (sample), decision points where it could call a skill were "
        "chosen (branch), and each was continued with the skill call forced (invoke) and with it refused "
        "(skip) (fork). A local pair compares the winning arm's best continuation with the losing arm's from "
        "that decision on (success beats failure, then fewer steps); an episode pair compares a task's "
        "shortest successful episode with one of its longest failures from the first decision on. Both sides "
        "of a pair share the prompt exactly.",
        "",
        "## Columns",
        "",
        "- `pair_id`, `kind` (episode | local), `label_reason` (success_vs_failure | success_rate | efficiency)",
        "- `chosen_arm`, `rejected_arm`: invoke | skip for local pairs, empty for episode pairs",
        "- `task_id`, `task_type`, `round`, `branch_id`, `branch_pool`, `candidate_skill` (the skill the "
        "invoke arm calls)",
        "- `chosen_success`, `rejected_success`, `chosen_steps`, `rejected_steps`",
        "- `chosen_window_turns`, `rejected_window_turns`: the assistant turns of each side (0-based among its "
        f"assistant messages) that selskill trains: for local pairs {window}, for episode pairs all of them. "
        "Only their assistant tokens carry loss in selskill; a stock trainer trains every completion token.",
        "",
        "## Provenance",
        "",
        f"- experiment `{exp}`, round {round_}; recipe: {recipe}",
        f"- selskill commit: `{commit}`",
        f"- loss window (train_window_n): {'all' if n is None else n}",
        "",
        "## Counts",
        "",
        f"{table.num_rows} pairs.",
        "",
        "| kind | pairs |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in sorted(by_kind.items())),
        "",
        "| kind / reason | pairs |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in sorted(by_reason.items())),
        "",
    ]
    return "\n".join(lines)


def write_export(
    exp_dir: Path,
    round_: int,
    out_dir: Path,
    window_n: int | str | None = "recipe",
    recipe: str | None = None,
    push_to_hub: str | None = None,
) -> Export:
    """`selskill.api.export_pairs`: round `round_`'s pairs of `exp_dir` (runs/<exp>), read as the train stage
    reads them (every rank complete and verified), written to `out_dir` with its dataset card."""
    stage = StageDir.of(exp_dir.parent, exp_dir.name, round_, "label")
    pairs = read_stage(stage, "pair")
    if pairs.num_rows == 0:
        raise ValueError(
            f"round {round_} of {exp_dir} has no pairs (its label stage kept none): nothing to export"
        )
    n = round_window_n(exp_dir, round_) if window_n == "recipe" else parse_window_n(window_n or "all")
    table = export_table(pairs, n)
    data_file = write_parquet_atomic(table, out_dir / DATA_FILE)
    where = f"the label stage's resolved config is {stage.config.relative_to(exp_dir.parent)}"
    recipe_text = f"`{recipe}` ({where})" if recipe else f"file name not recorded in the run; {where}"
    card = write_text_atomic(
        dataset_card(table, exp_dir.name, round_, n, recipe_text, selskill_commit()), out_dir / "README.md"
    )
    if push_to_hub:
        from datasets import Dataset

        Dataset(table).push_to_hub(push_to_hub)
    return Export(out_dir, data_file, card, table.num_rows, n)
