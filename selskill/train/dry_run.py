"""The train stage's dry run (`--dry_run`): what training would do, with nothing loaded or written.

It resolves the policy and the accelerate config, counts the pairs through the same verified
reader and pair builder training uses when the label stage is there (with `train_objective:
sft_wins`, the winning episodes of the sample stage, as `selskill.train.wins` selects them),
and prints the batch size, the steps and the adapter, so a recipe is checked before it costs a GPU.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from selskill.data.contract import StageRefused, read_stage
from selskill.data.layout import StageDir, resolve_round_policy
from selskill.data.shards import ShardError
from selskill.train.inputs import upstream_of
from selskill.train.launch import read_accelerate_config, under_launcher


def count_steps(pairs: int, cfg, world_size: int) -> int:
    """Optimizer steps the Trainer will take for `pairs` rows (its own formula, even batches per rank)."""
    if cfg.max_steps > 0:
        return cfg.max_steps
    batches = math.ceil(pairs / (cfg.per_device_train_batch_size * world_size))
    per_epoch = max(math.ceil(batches / cfg.gradient_accumulation_steps), 1)
    return math.ceil(cfg.num_train_epochs * per_epoch)


def dry_run(run, policy, cfg, out=print) -> dict:
    """Resolve files, count pairs when shards exist, print batch size and steps. Loads no weights.

    `cfg` is the recipe's train section; the plan is that of the DPOConfig training would build from it
    (`selskill.train.args`), with the bf16 check deferred to the machine that trains."""
    from selskill.train.args import training_args
    from selskill.train.lora import peft_config

    cfg = training_args(run.replace(dry_run=True), policy, cfg)
    info = _launch_info(cfg)
    try:
        model_path, source = resolve_round_policy(run, policy)
        info["policy"] = f"{model_path} ({source})"
    except FileNotFoundError as exc:
        model_path, info["policy"] = None, f"not available yet: {exc}"
    upstream = StageDir.of(run.runs_dir, run.exp, run.round, upstream_of(cfg)[0])
    if cfg.train_objective == "sft_wins":
        _count_wins(info, upstream, run, cfg)
    else:
        _count_pairs(info, upstream, run, cfg, model_path)
    n = info[_unit(cfg)]
    steps = count_steps(n, cfg, info["world_size"]) if n else (cfg.max_steps if cfg.max_steps > 0 else None)
    info["steps"] = steps
    info["warmup_steps"] = cfg.get_warmup_steps(steps) if steps else None
    info["peft"] = peft_config(cfg)  # builds peft's LoraConfig: its own checks run here too
    _print_plan(info, run, cfg, upstream, out)
    return info


def _unit(cfg) -> str:
    """What a training row is: a pair, or with `sft_wins` a winning episode."""
    return "wins" if cfg.train_objective == "sft_wins" else "pairs"


def _read_complete(info: dict, stage: StageDir, kind: str, run, **kw):
    """The rows of `stage` through the verified reader, or None (`info["upstream_problem"]` says why when it
    is there but incomplete)."""
    if not (stage.shard_files() or stage.completed_ranks()):
        return None
    try:
        return read_stage(stage, kind, run.world_size, **kw)
    except (FileNotFoundError, ShardError, StageRefused) as exc:
        info["upstream_problem"] = str(exc)
        return None


def _count_wins(info: dict, sample: StageDir, run, cfg) -> None:
    """`info["wins"]`: the winning episodes `train_objective: sft_wins` would train (None without a complete
    sample stage)."""
    from selskill.train.wins import COLUMNS, win_rows

    info["wins"] = None
    table = _read_complete(info, sample, "rollout", run, columns=COLUMNS)
    if table is not None:
        rows, stats = win_rows(table, cfg.max_length)  # an overflow is counted here, not refused
        info["wins"] = len(rows)
        info["row_report"] = stats.report()


def _launch_info(cfg) -> dict:
    """The processes training would run in (the launch this runs under, else the recipe's accelerate
    config, else one) and the effective batch size."""
    info: dict = {}
    world = int(os.environ.get("WORLD_SIZE", "0")) if under_launcher() else 0
    if cfg.train_accelerate_config:
        conf = read_accelerate_config(cfg.train_accelerate_config)
        info["accelerate"] = {
            "config": cfg.train_accelerate_config,
            "distributed_type": conf.get("distributed_type"),
            "num_processes": conf.get("num_processes", 1),
            "zero_stage": (conf.get("deepspeed_config") or {}).get("zero_stage"),
            "mixed_precision": conf.get("mixed_precision"),
        }
        world = world or int(conf.get("num_processes", 1))
    world = world or 1
    eff = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * world
    info.update(world_size=world, effective_batch_size=eff)
    return info


def _count_pairs(info: dict, label: StageDir, run, cfg, model_path: str | None) -> None:
    """`info["pairs"]`: the pairs training would build from a complete label stage (None without one, and
    `upstream_problem` says why when it is there but incomplete)."""
    info["pairs"] = None
    table = _read_complete(info, label, "pair", run)  # the pairs training would read, verified alike
    if table is None:
        return
    from selskill.train.pairs import build_from_config

    tokenizer = None
    if model_path and Path(model_path).is_dir():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
    examples, stats = build_from_config(table, cfg, tokenizer)
    info["pairs"] = len(examples)
    info["row_report"] = stats.report()


def _print_plan(info: dict, run, cfg, upstream: StageDir, out) -> None:
    from selskill.train.lora import describe

    world = info["world_size"]
    out(
        f"dry run: {run.exp} round {run.round} -> {StageDir.of(run.runs_dir, run.exp, run.round, 'train').path}"
    )
    out(f"  policy: {info['policy']}")
    if "accelerate" in info:
        a = info["accelerate"]
        out(
            f"  launch: {a['config']} ({a['distributed_type']}, {a['num_processes']} processes, "
            f"zero stage {a['zero_stage']}, mixed precision {a['mixed_precision']})"
        )
    out(
        f"  effective batch size: {info['effective_batch_size']} = {cfg.per_device_train_batch_size} per device x "
        f"{cfg.gradient_accumulation_steps} accumulation x {world} processes"
    )
    loss = (
        "SFT on the round's winning episodes (train_objective sft_wins)"
        if cfg.train_objective == "sft_wins"
        else f"{'+'.join(cfg.loss_type)} beta={cfg.beta}"
    )
    pairs = (
        ""
        if cfg.train_objective == "sft_wins"
        else f"pairs {cfg.train_pair_kinds}, window n={cfg.train_window_n}, "
    )
    out(
        f"  loss: {loss}, lr={cfg.learning_rate} {cfg.lr_scheduler_type.value}, "
        f"warmup {cfg.warmup_steps}, epochs {cfg.num_train_epochs}, max_length {cfg.max_length}, "
        f"{pairs}bf16 {cfg.bf16}"
        + (
            " (not supported on this machine: checked when training)"
            if getattr(cfg, "bf16_deferred", False)
            else ""
        )
        + f", gradient checkpointing {cfg.gradient_checkpointing}, precompute_ref_log_probs {cfg.precompute_ref_log_probs}"
        + f", prefix sharing {cfg.train_prefix_sharing}"
    )
    out(f"  peft: {describe(info['peft'], reference=cfg.train_objective == 'dpo')}")
    unit = _unit(cfg)
    if info[unit] is None:
        examples = ", ".join(f"{p} {unit} -> {count_steps(p, cfg, world)}" for p in (500, 2000, 10000))
        name = upstream.path.name
        why = (
            f"the {name} stage is not complete: {info['upstream_problem']}"
            if "upstream_problem" in info
            else (f"no shards at {upstream.shards} yet")
        )
        out(f"  {unit}: {why}; steps: {examples}")
    else:
        out("  " + info["row_report"].replace("\n", "\n  "))
        out(f"  steps: {info['steps']} (warmup {info['warmup_steps']})")
