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
side's assistant messages), built by the trainer's own rule (`selskill.train.pairs.window_turns`).
A template that rewrites earlier turns (Qwen3 drops earlier <think> blocks) also renders
other tokens than the policy generated: the shards' token ids stay the exact record.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import yaml

from selskill.config.window import DEFAULT_WINDOW_N, parse_window_n
from selskill.data.contract import read_stage
from selskill.data.layout import TOKENIZER_FILES, StageDir, policy_dir, round_dir
from selskill.data.shards import write_parquet_atomic, write_text_atomic
from selskill.registry import DEFAULT_BENCHMARK, benchmark
from selskill.train.pairs import window_turns

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
    return parse_window_n(DEFAULT_WINDOW_N)


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
    lengths: Lengths


# DPOConfig's default max_length (TRL 1.16), which the card measures the pairs against
TRL_DEFAULT_MAX_LENGTH = 1024


@dataclass(frozen=True)
class Lengths:
    """Per pair, the prompt's and each completion's length in `unit`: "tokens" as `trl.DPOTrainer` counts them
    (the pair rendered through the chat template of the tokenizer at `source`), or "characters" of the
    messages' contents where no tokenizer was at hand (`source` says why)."""

    unit: str
    source: str
    prompt: list[int]
    chosen: list[int]
    rejected: list[int]

    @property
    def sequence(self) -> list[int]:
        """Each pair's longer sequence: the prompt and its longer completion."""
        return [p + max(c, r) for p, c, r in zip(self.prompt, self.chosen, self.rejected, strict=True)]

    @property
    def max_length(self) -> int:
        """The least `max_length` that trains on every pair whole."""
        return max(self.sequence, default=0)

    def dropped(self, max_length: int) -> int:
        """Pairs `trl.DPOTrainer` drops at `max_length`: their prompt alone has that many tokens or more."""
        return sum(p >= max_length for p in self.prompt)

    def cut(self, max_length: int) -> int:
        """Pairs it keeps but cuts: a completion ends past `max_length`."""
        return sum(p < max_length < s for p, s in zip(self.prompt, self.sequence, strict=True))


def round_tokenizer(exp_dir: Path, round_: int) -> Path | None:
    """The tokenizer folder of the model that sampled round `round_` (round r-1's), else of the model the round
    trained (the same tokenizer); None when neither has one (a round that started from a hub model)."""
    runs, exp = exp_dir.parent, exp_dir.name
    for folder in (policy_dir(runs, exp, round_), round_dir(runs, exp, round_) / "train" / "model"):
        if any((folder / f).is_file() for f in TOKENIZER_FILES):
            return folder
    return None


def character_lengths(table: pa.Table, why: str) -> Lengths:
    def chars(messages: list[dict]) -> int:
        return sum(len(m["content"]) for m in messages)

    rows = table.select(["prompt", "chosen", "rejected"]).to_pylist()
    return Lengths(
        "characters",
        why,
        [chars(r["prompt"]) for r in rows],
        [chars(r["chosen"]) for r in rows],
        [chars(r["rejected"]) for r in rows],
    )


def token_lengths(table: pa.Table, tokenizer, source: str) -> Lengths:
    """Lengths as `trl.DPOTrainer` tokenizes a conversational pair: the prompt with the generation prompt, then
    prompt + chosen and prompt + rejected; the completions start where those renderings part."""
    from trl.data_utils import common_prefix_length

    def ids(messages: list[dict], **kwargs) -> list[int]:
        return tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)["input_ids"]

    prompt, chosen, rejected = [], [], []
    for row in table.select(["prompt", "chosen", "rejected"]).to_pylist():
        alone = ids(row["prompt"], add_generation_prompt=True)
        with_chosen, with_rejected = ids(row["prompt"] + row["chosen"]), ids(row["prompt"] + row["rejected"])
        n = min(common_prefix_length(alone, with_chosen), common_prefix_length(alone, with_rejected))
        prompt.append(n)
        chosen.append(len(with_chosen) - n)
        rejected.append(len(with_rejected) - n)
    return Lengths("tokens", source, prompt, chosen, rejected)


def measure_lengths(table: pa.Table, exp_dir: Path, round_: int, tokenizer: str | None = None) -> Lengths:
    """Token lengths with `tokenizer` (a folder or hub id), else with the round's own tokenizer; character
    lengths, saying why, where the round has none or the install cannot load one."""
    source = tokenizer or round_tokenizer(exp_dir, round_)
    if source is None:
        return character_lengths(
            table,
            f"no tokenizer in {policy_dir(exp_dir.parent, exp_dir.name, round_)} (the model that sampled the "
            "round) and none given (--tokenizer)",
        )
    missing = [m for m in ("transformers", "trl") if importlib.util.find_spec(m) is None]
    if missing and tokenizer is None:
        return character_lengths(
            table, f"{' and '.join(missing)} not installed (pip install 'selskill[train]') to read {source}"
        )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(source))
    if not getattr(tok, "chat_template", None):
        raise ValueError(
            f"the tokenizer at {source} has no chat template, so trl.DPOTrainer cannot render these messages "
            "with it: give --tokenizer the model you will train"
        )
    return token_lengths(table, tok, str(source))


def _spread(values: list[int]) -> str:
    return f"{min(values)} | {int(statistics.median(values))} | {max(values)}"


def lengths_section(lengths: Lengths) -> list[str]:
    """What a `trl.DPOTrainer` user must set for the pairs to train whole, from their measured lengths."""
    table = [
        f"| | min | median | max ({lengths.unit}) |",
        "|---|---|---|---|",
        f"| prompt | {_spread(lengths.prompt)} |",
        f"| chosen | {_spread(lengths.chosen)} |",
        f"| rejected | {_spread(lengths.rejected)} |",
        f"| prompt + longer completion | {_spread(lengths.sequence)} |",
        "",
    ]
    if lengths.unit != "tokens":
        return [
            f"Characters of the messages' contents, not tokens: {lengths.source}. Token counts depend on the "
            "model's tokenizer and chat template, so no `max_length` follows from these; export again with "
            "`--tokenizer MODEL` (the model you will train) for token counts and the DPOConfig settings they "
            "need, or train with `DPOConfig(max_length=None)` (nothing cut, nothing dropped).",
            "",
            *table,
        ]
    n, need, default = len(lengths.prompt), lengths.max_length, TRL_DEFAULT_MAX_LENGTH
    return [
        f"Tokens as `trl.DPOTrainer` counts them with the tokenizer of `{lengths.source}`: each pair rendered "
        "through its chat template, the prompt with the generation prompt, then prompt + chosen and prompt + "
        "rejected.",
        "",
        *table,
        "`trl.DPOTrainer` drops a pair whose prompt alone has `max_length` tokens or more and cuts every other "
        f"sequence to `max_length`. With TRL's default `max_length={default}` it drops "
        f"{lengths.dropped(default)} of these {n} pairs and cuts {lengths.cut(default)} more. DPOConfig has no "
        f"`max_prompt_length`: the prompt counts toward `max_length` (the longest prompt is "
        f"{max(lengths.prompt, default=0)} tokens). To train on every pair whole:",
        "",
        "```python",
        f'DPOConfig(max_length={need}, truncation_mode="keep_start")  # or max_length=None: no limit',
        "```",
        "",
    ]


def round_license(exp_dir: Path, round_: int) -> str:
    """The license of the round's benchmark data (its label stage records the run's `benchmark`)."""
    config = StageDir.of(exp_dir.parent, exp_dir.name, round_, "label").config
    name = (yaml.safe_load(config.read_text()) or {}).get("benchmark") if config.is_file() else None
    try:
        return benchmark(name or DEFAULT_BENCHMARK).data_license
    except ValueError:  # a plugin no longer installed
        return "unknown"


def _counts(table: pa.Table, *columns: str) -> Counter:
    return Counter("/".join(v) for v in zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def dataset_card(
    table: pa.Table,
    exp: str,
    round_: int,
    n: int | None,
    recipe: str,
    commit: str,
    lengths: Lengths,
    license: str = "unknown",
):
    """The dataset card (`huggingface_hub.DatasetCard`): the hub reads its metadata (license, task, the data
    file as the `default` config's train split), a person its text."""
    from huggingface_hub import DatasetCard, DatasetCardData

    by_kind = _counts(table, "kind")
    by_reason = _counts(table, "kind", "label_reason")
    window = "every assistant turn" if n is None else f"the first {n} assistant turns"
    metadata = DatasetCardData(
        license=license,
        task_categories=["text-generation"],
        tags=["dpo", "preference", "agents", "trl", "selskill"],
        pretty_name=f"selskill preference pairs: {exp}, round {round_}",
        configs=[{"config_name": "default", "data_files": [{"split": "train", "path": DATA_FILE}]}],
    )
    lines = [
        f"# selskill preference pairs: {exp}, round {round_}",
        "",
        "TRL's conversational preference format: `prompt`, `chosen` and `rejected` are lists of "
        '`{"role", "content"}` messages with roles system (protocol and skill listing), user (task and '
        "observations), assistant (decisions) and tool (a skill's return). `prompt` ends before the first "
        "assistant message the pair compares; each side ends with its last assistant message. Load it with "
        '`datasets.load_dataset("parquet", data_files=...)` (or by its hub name once pushed) and train with '
        "`trl.DPOTrainer`, setting `max_length` as [Lengths](#lengths) says.",
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
        "## Lengths",
        "",
        *lengths_section(lengths),
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
        f"- license: `{license}`, the license of the benchmark's data the tasks come from",
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
    return DatasetCard(f"---\n{metadata.to_yaml()}\n---\n\n" + "\n".join(lines))


def push_export(out_dir: Path, repo_id: str) -> None:
    """Upload the data file and its card to the hub dataset repo `repo_id` in one commit (created if absent)."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, repo_type="dataset", exist_ok=True)
    api.upload_folder(
        repo_id=repo_id,
        repo_type="dataset",
        folder_path=str(out_dir),
        allow_patterns=[DATA_FILE, "README.md"],
        commit_message="selskill export-pairs: preference pairs and their dataset card",
    )


def write_export(
    exp_dir: Path,
    round_: int,
    out_dir: Path,
    window_n: int | str | None = "recipe",
    recipe: str | None = None,
    push_to_hub: str | None = None,
    tokenizer: str | None = None,
    license: str | None = None,
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
    lengths = measure_lengths(table, exp_dir, round_, tokenizer)
    data_file = write_parquet_atomic(table, out_dir / DATA_FILE)
    where = f"the label stage's resolved config is {stage.config.relative_to(exp_dir.parent)}"
    recipe_text = f"`{recipe}` ({where})" if recipe else f"file name not recorded in the run; {where}"
    card = dataset_card(
        table,
        exp_dir.name,
        round_,
        n,
        recipe_text,
        selskill_commit(),
        lengths,
        license or round_license(exp_dir, round_),
    )
    card_file = write_text_atomic(str(card), out_dir / "README.md")
    if push_to_hub:
        push_export(out_dir, push_to_hub)
    return Export(out_dir, data_file, card_file, table.num_rows, n, lengths)
