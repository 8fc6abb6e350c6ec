"""The offline BFCL init policy: train-split ground truth -> demonstrations -> tokenizer -> tiny Qwen3 -> SFT.

What `make round RECIPE=recipes/bfcl_tiny.yaml` builds at `runs/<exp>/round_0/train/model` when
the recipe has no model. It is the ALFWorld init (`selskill.init.alfworld`) with BFCL's
demonstration source (`selskill.init.bfcl_demos`): the same tokenizer, model and TRL SFT
(`train_tokenizer`, `build_model`, `sft_train`), the same `init_manifest.json` + `COMPLETED`
contract (a second call with the same settings returns at once; other settings are refused
unless `redo`), and the same two phases. One difference: phase 1 keeps the system prompt,
since on BFCL it holds the task's function docs, the names and arguments the calls copy.
Demonstrations come only from the train split's scenarios (the split is by scenario index,
so no test scenario's variant is ever demonstrated). No DAgger.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

from selskill.benchmarks.bfcl import load_bfcl_skills
from selskill.benchmarks.bfcl.episode import BfclTurnFormat
from selskill.config.init import InitConfig
from selskill.init.alfworld import init_arch
from selskill.init.bfcl_demos import (
    DEMO_FORMAT,
    DEMO_LISTING_STYLE,
    BfclDemoMix,
    bfcl_tokenizer_corpus,
    build_bfcl_demos,
)
from selskill.init.sft import (
    build_listings,
    demo_token_lengths,
    reuse_or_start,
    save_init_policy,
    settings_record,
    sft_config,
    sft_train,
)
from selskill.policy.bootstrap import TinyArch, build_model, train_tokenizer
from selskill.skills import SkillLibrary
from selskill.skills.retrieval import SkillRetriever

MANIFEST_VERSION = 2


def build_bfcl_init_policy(
    out_dir: str | Path,
    *,
    categories: tuple[str, ...],
    scenarios: Sequence[int],
    withheld_callable: bool = False,
    task_ids: Sequence[str] | None = None,
    seed: int = 42,
    mix: BfclDemoMix | None = None,
    vocab_size: int = 2048,
    arch: TinyArch | None = None,
    pretrain_epochs: float = 2.0,
    epochs: float = 4.0,
    lr: float = 4e-3,
    batch_size: int = 2,
    max_length: int = 4096,
    warmup_ratio: float = 0.05,
    logging_steps: int = 10,
    fmt: BfclTurnFormat = DEMO_FORMAT,
    listing_style: str = DEMO_LISTING_STYLE,
    library: SkillLibrary | None = None,
    retriever: SkillRetriever | None = None,
    report_to: str | list[str] = "none",
    progress: bool = True,
    redo: bool = False,
) -> Path:
    """Build (or reuse) the BFCL init policy at `out_dir`; returns `out_dir`.

    `scenarios` are the train split's (`RunConfig.bfcl_split("train")`). Demonstrates their tasks
    in `categories`, or only the train tasks `task_ids` (`train/<BFCL id>`). `library` (default:
    the 18 BFCL skills) and `retriever` are the rounds': the demonstrations list as they will.
    """
    from selskill.benchmarks.bfcl.env import BfclEnv

    out_dir = Path(out_dir)
    stage_dir = out_dir.parent
    mix = mix or BfclDemoMix()
    arch = arch or TinyArch()
    settings = settings_record(
        version=MANIFEST_VERSION,
        env="bfcl",
        categories=list(categories),
        scenarios=list(scenarios),
        withheld_callable=withheld_callable,
        task_ids=list(task_ids) if task_ids is not None else None,
        seed=seed,
        mix=mix,
        vocab_size=vocab_size,
        arch=arch,
        pretrain_epochs=pretrain_epochs,
        epochs=epochs,
        lr=lr,
        warmup_ratio=warmup_ratio,
        batch_size=batch_size,
        max_length=max_length,
        fmt=fmt,
        listing_style=listing_style,
    )
    listings = build_listings(settings, load_bfcl_skills(), library, retriever, listing_style)
    if reuse_or_start(out_dir, stage_dir, settings, redo):
        return out_dir
    timings: dict[str, float] = {}
    t_all = time.perf_counter()

    t = time.perf_counter()
    env = BfclEnv(categories, scenarios=scenarios, withheld_callable=withheld_callable, id_prefix="train/")
    ids = list(task_ids) if task_ids is not None else env.task_ids()
    report = build_bfcl_demos(
        env, mix=mix, seed=seed, fmt=fmt, listing_style=listing_style, library=listings.library,
        retriever=listings.retriever, task_ids=ids,
    )  # fmt: skip
    timings["demos_seconds"] = round(time.perf_counter() - t, 1)
    if not report.demos:
        raise RuntimeError(f"no winning demonstration from {len(ids)} BFCL tasks: {dict(report.dropped)}")

    t = time.perf_counter()
    tokenizer = train_tokenizer(bfcl_tokenizer_corpus(report.demos, listings.library), vocab_size=vocab_size)
    timings["tokenizer_seconds"] = round(time.perf_counter() - t, 1)
    lengths = demo_token_lengths(tokenizer, report.demos)
    kept = [d for d, n in zip(report.demos, lengths, strict=True) if n <= max_length]
    kept_lengths = [n for n in lengths if n <= max_length]
    if not kept:
        raise RuntimeError(f"every demonstration is longer than init_max_length={max_length} tokens")

    work = stage_dir / "sft"
    common = dict(seed=seed, lr=lr, batch_size=batch_size, max_length=max_length, warmup_ratio=warmup_ratio,
                  logging_steps=logging_steps, report_to=report_to, progress=progress)  # fmt: skip
    train_stats: dict = {"pretrain": None, "sft": None}
    t = time.perf_counter()
    model = build_model(tokenizer, arch, seed=seed)
    if pretrain_epochs > 0:
        args = sft_config(work / "pretrain", epochs=pretrain_epochs, **common)
        trainer, train_stats["pretrain"] = sft_train(model, tokenizer, kept, args, assistant_only=False)
        model = trainer.model
    trainer, train_stats["sft"] = sft_train(
        model, tokenizer, kept, sft_config(work / "sft", epochs=epochs, **common)
    )
    model = trainer.model
    timings["train_seconds"] = round(time.perf_counter() - t, 1)

    return save_init_policy(
        out_dir, model, tokenizer, work=work, report=report, too_long=len(report.demos) - len(kept),
        kept=kept, kept_lengths=kept_lengths, settings=settings, train=train_stats, timings=timings, t_all=t_all,
    )  # fmt: skip


def bfcl_demo_mix(config: InitConfig) -> BfclDemoMix:
    """The `init_bfcl_*` rates as a `BfclDemoMix` (which checks them)."""
    prefix = "init_bfcl_"
    return BfclDemoMix(**{f.name[len(prefix) :]: getattr(config, f.name) for f in dataclasses.fields(config)
                          if f.name.startswith(prefix) and f.name != "init_bfcl_tasks"})  # fmt: skip


def build_bfcl_init_policy_from_config(
    config: InitConfig, out_dir: str | Path, *, run, seed: int, **kwargs
) -> Path:
    """`build_bfcl_init_policy` with the recipe's `InitConfig` (`init_*` keys) and `RunConfig` (`bfcl_*`);
    `task_ids` (which train tasks to demonstrate) is the caller's."""
    return build_bfcl_init_policy(
        out_dir,
        categories=run.benchmark_settings.categories,
        scenarios=run.benchmark_settings.split("train"),
        withheld_callable=run.benchmark_settings.bfcl_withheld_callable,
        seed=seed,
        mix=bfcl_demo_mix(config),
        vocab_size=config.init_vocab_size,
        arch=init_arch(config),
        pretrain_epochs=config.init_pretrain_epochs,
        epochs=config.init_epochs,
        lr=config.init_lr,
        warmup_ratio=config.init_warmup_ratio,
        batch_size=config.init_batch_size,
        max_length=config.init_max_length,
        logging_steps=config.init_logging_steps,
        **kwargs,
    )
