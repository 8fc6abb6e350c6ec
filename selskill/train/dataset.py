"""The train dataset: the label stage's pairs as token rows, in a directory under the train stage.

The main process builds it once and every process loads that directory, which is what TRL's
`precompute_ref_log_probs` cache needs with several processes (docs/design.md, "The train
dataset is a directory"); a resumed run reuses it while the pair shards and the `train_*`
keys are unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path

from selskill.data.contract import read_stage
from selskill.data.layout import StageDir
from selskill.data.removal import remove_outputs, replace_output
from selskill.data.shards import write_json_atomic

logger = logging.getLogger(__name__)

DATASET_DIR = "dataset"
STATS_FILE = "pairs_stats.json"


class NoTrainablePairs(ValueError):
    """The round left nothing to train on (no trainable pair; with `train_objective: sft_wins`, no clean
    win): the user's data, not a bug (the replication skips an ablation variant that ends here instead
    of stopping the benchmark)."""


def _dataset_key(label_fingerprint: str, cfg) -> str:
    """What the cached pair dataset depends on: the label shards' content, every `train_*` key, max_length, seed.

    The keys are taken from the config class, not listed by hand, so that a new `train_*` key
    cannot be left out (a resumed run with it changed would train on the old dataset). A key
    that does not change the pairs only costs a rebuild.
    """
    knobs = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name.startswith("train_")}
    knobs.update(max_length=cfg.max_length, seed=cfg.seed, label=label_fingerprint)
    return hashlib.sha256(json.dumps(knobs, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _dataset_problem(out_dir: Path) -> str | None:
    """Why `out_dir` is not a whole saved dataset (None: it is): every file `save_to_disk` lists must be there."""
    try:
        files = [f["filename"] for f in json.loads((out_dir / "state.json").read_text())["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return "no readable state.json"
    missing = [f for f in ("dataset_info.json", *files) if not (out_dir / f).is_file()]
    return f"{', '.join(missing)} missing" if missing else None


def build_train_dataset(
    label: StageDir, key: str, cfg, tokenizer, out_dir: Path, is_main: bool, world_size: int
):
    """The label stage's pairs -> token rows saved under out_dir (built by the main process unless the
    rows of the same `key` are there), loaded in every process."""
    from datasets import load_from_disk

    from selskill.train.pairs import build_from_config, examples_to_dataset

    stamp = out_dir / "build.json"
    built = is_main and stamp.is_file() and json.loads(stamp.read_text()).get("key") == key
    if built and (problem := _dataset_problem(out_dir)):
        logger.info(
            f"train: {out_dir} is incomplete ({problem}; a removal or a build was killed): building it again"
        )
        built = False
    if is_main and not built:
        table = read_stage(label, "pair", world_size)
        examples, stats = build_from_config(table, cfg, tokenizer)
        logger.info(stats.report())
        if not examples:
            raise ValueError(
                f"no trainable pairs in the label stage at {label.shards} "
                f"(train_pair_kinds={cfg.train_pair_kinds}, max_length={cfg.max_length}): see the counts above"
            )
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        remove_outputs([tmp], "dataset")
        examples_to_dataset(examples).save_to_disk(str(tmp))
        write_json_atomic({"key": key, "stats": stats.to_dict()}, tmp / "build.json")
        replace_output(tmp, out_dir, "dataset")
        write_json_atomic(stats.to_dict(), out_dir.parent / STATS_FILE)
    return load_from_disk(str(out_dir))


def load_train_dataset(run, cfg, label: StageDir, label_fingerprint: str, tokenizer, state, stage_path: Path):
    """The round's train dataset, built by the main process first (the others wait, then load it)."""
    key = _dataset_key(label_fingerprint, cfg)
    with state.main_process_first():
        dataset = build_train_dataset(
            label, key, cfg, tokenizer, stage_path / DATASET_DIR, state.is_main_process, run.world_size
        )
    if len(dataset) == 0:
        raise NoTrainablePairs(
            f"round {run.round} has no trainable pairs (see the discard reasons in {label.stats}): local pairs need "
            "a successful continuation at a branch point and episode pairs a success among a task's samples. Sample "
            "more (sample_k, sample_max_tasks, fork_k_*), give episodes more steps (max_decisions), or start from a "
            "stronger policy"
        )
    return dataset
