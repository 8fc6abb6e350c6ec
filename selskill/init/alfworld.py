"""The offline ALFWorld init policy: generated games -> demonstrations -> tokenizer -> tiny Qwen3 -> SFT.

`build_init_policy` is what `selskill init` / `make init` runs on a machine with no model.
It writes `runs/<exp>/round_0/train/model` (round 1's starting policy) and, in that
directory's parent, `init_manifest.json` (settings, demo statistics, loss curve, timings)
and finally `COMPLETED`. A second call with the same settings finds both and returns at
once; a call with different settings refuses to overwrite unless `redo=True`.

Training is TRL's SFT (`selskill.init.sft`) in two phases over the same demonstrations.
Phase 1 (`pretrain_epochs`) puts every token in the loss: a model trained from scratch sees
only a small fraction of the tokens as assistant tokens, too little signal to learn to read
its context (copy "alarmclock 1" from "On the desk 1, you see a alarmclock 1"), and the
observations are full of exactly that structure. Phase 2
(`epochs`) is the policy SFT proper on assistant tokens only: the ChatML template's
`{% generation %}` markers put only the assistant turns (decision + `<|im_end|>`) in the
loss; system prompt, observations and skill returns are context only. Injected wrong
moves (`Demo.untrained_turns`) are context in both phases. At equal compute the two-phase
recipe reproduces clearly more held-out turns than assistant-only training (docs/benchmarks.md,
"What shaped the init's demonstrations and SFT"). `init_dagger_iters`
adds DAgger after the SFT (`selskill.init.dagger`).
Demonstrations longer than `max_length` tokens are dropped rather than truncated (a
truncated demo would teach an unfinished episode).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import defaultdict
from pathlib import Path

from selskill.agent.turn_format import TurnFormat
from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.config.init import InitConfig
from selskill.config.rollout import MAX_DECISIONS
from selskill.data.inputs import changed_settings
from selskill.init.dagger import DAGGER_DEMOS, DaggerSettings, run_dagger
from selskill.init.demos import (
    DEFAULT_MAX_ENV_STEPS,
    DEMO_FORMAT,
    DEMO_LISTING_STYLE,
    Demo,
    DemoMix,
    build_demos,
    tokenizer_corpus,
)
from selskill.init.sft import (
    COMPLETED,
    MANIFEST,
    build_listings,
    demo_token_lengths,
    is_complete,
    read_manifest,
    reuse_or_start,
    save_init_policy,
    settings_record,
    sft_config,
    sft_train,
)
from selskill.policy.bootstrap import TinyArch, build_model, train_tokenizer
from selskill.skills import SkillLibrary
from selskill.skills.retrieval import SkillRetriever

MANIFEST_VERSION = 1


# --- the recipe's init section as build arguments ------------------------------------------


def demo_mix(config: InitConfig) -> DemoMix:
    """The `init_demo_*` rates as a `DemoMix` (which checks them)."""
    prefix = "init_demo_"
    return DemoMix(**{f.name[len(prefix) :]: getattr(config, f.name) for f in dataclasses.fields(config)
                      if f.name.startswith(prefix)})  # fmt: skip


def init_arch(config: InitConfig) -> TinyArch:
    """The model shape of the `init_*` keys (both builders' models)."""
    return TinyArch(
        hidden_size=config.init_hidden_size,
        intermediate_size=config.init_intermediate_size,
        num_hidden_layers=config.init_layers,
        num_attention_heads=config.init_heads,
        num_key_value_heads=config.init_kv_heads,
        head_dim=config.init_head_dim,
    )


def build_kwargs(config: InitConfig, action_choice: str = "free") -> dict:
    """Keyword arguments of `build_init_policy` (add out_dir, games_dir, seed); `action_choice`: the
    rollout section's, which DAgger's own rollouts follow."""
    return {
        "n_train_games": config.init_games_per_type,
        "game_size": config.init_game_size,
        "max_decisions": config.init_max_decisions,
        "max_env_steps": config.init_max_env_steps,
        "demo_mix": demo_mix(config),
        "vocab_size": config.init_vocab_size,
        "arch": init_arch(config),
        "pretrain_epochs": config.init_pretrain_epochs,
        "epochs": config.init_epochs,
        "lr": config.init_lr,
        "warmup_ratio": config.init_warmup_ratio,
        "batch_size": config.init_batch_size,
        "max_length": config.init_max_length,
        "logging_steps": config.init_logging_steps,
        "dagger": DaggerSettings(
            iterations=config.init_dagger_iters,
            epochs=config.init_dagger_epochs,
            lr=config.init_dagger_lr,
            points=config.init_dagger_points,
            max_env_steps=config.init_dagger_env_steps,
            temperature=config.init_dagger_temperature,
            base=config.init_dagger_from,
            fresh_games=config.init_dagger_fresh_games,
            action_choice=action_choice,
        ),
    }


# --- games --------------------------------------------------------------------------------


def train_games(
    games_dir: str | Path,
    per_type: int,
    seed: int,
    size: str = "small",
    progress: bool = False,
    first: int = 0,
):
    """Generated train games `first` .. `first + per_type - 1` of each type under `games_dir`, made if missing."""
    from selskill.benchmarks.alfworld.env import TRAJ_FILE, find_games
    from selskill.benchmarks.alfworld.generate import TASK_TYPES, check_generator_version, generate_games

    def pick(index):
        chosen: dict[str, list] = defaultdict(list)
        for record in sorted(index.games, key=lambda r: r.task_id):
            meta = json.loads((Path(record.path).parent / TRAJ_FILE).read_text()).get("selskill") or {}
            if (
                meta.get("seed") == seed
                and meta.get("size") == size
                and first <= meta.get("index", -1) < first + per_type
            ):
                chosen[record.task_type].append(record)
        return chosen

    root = Path(games_dir)
    check_generator_version(root)
    chosen = pick(find_games(root, "train")) if (root / "train").is_dir() else {}
    if any(len(chosen.get(t, [])) < per_type for t in TASK_TYPES):
        generate_games(
            root, per_type=first + per_type, seed=seed, split="train", size=size, progress=progress
        )
        chosen = pick(find_games(root, "train"))
    records = [r for t in TASK_TYPES for r in sorted(chosen.get(t, []), key=lambda r: r.task_id)]
    return records


# --- the whole build ------------------------------------------------------------------------


def _check_base(base: str | Path, settings: dict) -> dict:
    """`base` must be a complete init built with exactly these settings (DAgger aside); returns its manifest."""
    base = Path(base)
    if not is_complete(base):
        raise FileNotFoundError(
            f"init_dagger_from={base}: no complete init policy there (expected {base}/config.json and "
            f"{base.parent / COMPLETED}); build it first with `selskill init` and the same settings"
        )
    manifest = read_manifest(base) or {}
    theirs = dict(manifest.get("settings", {}))
    theirs.pop("dagger", None)  # a DAgger build may be continued: its iterations come first
    differ = changed_settings(theirs, settings)
    if differ:
        raise ValueError(
            f"init_dagger_from={base} was built with other settings ({'; '.join(differ)}; see "
            f"{base.parent / MANIFEST}): pass the overrides it was built with"
        )
    return manifest


def build_init_policy(
    out_dir: str | Path,
    *,
    games_dir: str | Path,
    n_train_games: int = 40,
    seed: int = 42,
    demo_mix: DemoMix | None = None,
    vocab_size: int = 2048,
    arch: TinyArch | None = None,
    pretrain_epochs: float = 4.0,
    epochs: float = 8.0,
    lr: float = 4e-3,
    batch_size: int = 2,
    max_length: int = 4096,
    warmup_ratio: float = 0.05,
    logging_steps: int = 10,
    max_decisions: int = MAX_DECISIONS,
    max_env_steps: int = DEFAULT_MAX_ENV_STEPS,
    game_size: str = "small",
    games_seed: int | None = None,
    fmt: TurnFormat = DEMO_FORMAT,
    listing_style: str = DEMO_LISTING_STYLE,
    dagger: DaggerSettings | None = None,
    library: SkillLibrary | None = None,
    retriever: SkillRetriever | None = None,
    report_to: str | list[str] = "none",
    progress: bool = True,
    redo: bool = False,
) -> Path:
    """Build (or reuse) the offline init policy at `out_dir`; returns `out_dir`.

    `n_train_games` is per task type; `games_seed` (default `seed`) seeds the game
    generator, `seed` the demo mix, the model init and SFT. Training runs in two phases
    over the same demonstrations: `pretrain_epochs` with every token in the loss (the
    model learns the environment's language and to copy names from its context, which a
    from-scratch model does not learn from the few assistant tokens alone), then
    `epochs` with the assistant tokens only (the policy). `library` (default: the 10 ALFWorld
    skills) and `retriever` are the rounds' (`selskill.stages.context.runner_library` and
    `retriever`): the demonstrations list each decision's skills as the rounds will, and are
    kept only if won within `max_decisions` decisions and `max_env_steps` commands, so that the
    init is not taught an episode the rounds' step budget would cut short.
    """
    out_dir = Path(out_dir)
    stage_dir = out_dir.parent
    demo_mix = demo_mix or DemoMix()
    arch = arch or TinyArch()
    games_seed = seed if games_seed is None else games_seed
    settings = settings_record(
        version=MANIFEST_VERSION,
        games_dir=Path(games_dir).resolve(),
        n_train_games=n_train_games,
        seed=seed,
        games_seed=games_seed,
        game_size=game_size,
        max_decisions=max_decisions,
        max_env_steps=max_env_steps,
        demo_mix=demo_mix,
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
    listings = build_listings(settings, load_alfworld_skills(), library, retriever, listing_style)
    if not settings["demo_mix"].get("false_take"):
        # keys added later join the settings only when used: earlier builds stay reusable
        settings["demo_mix"].pop("false_take", None)
    dagger = dagger or DaggerSettings()
    if dagger.iterations and listings.mode != "all":
        raise ValueError(
            f"init_dagger_iters: {dagger.iterations} with retrieval_mode: {listings.mode}: DAgger's rollouts "
            "list every skill; build the retrieval init with init_dagger_iters: 0"
        )
    base_manifest: dict = {}
    if dagger.iterations:
        # only DAgger builds carry the key: builds without it keep their manifests valid
        if dagger.base:
            base_manifest = _check_base(dagger.base, settings)
        settings["dagger"] = settings_record(d=dagger)["d"]
        if dagger.base:
            settings["dagger"]["base"] = str(Path(dagger.base).resolve())
            settings["dagger"]["base_dagger"] = base_manifest["settings"].get("dagger")
    if reuse_or_start(out_dir, stage_dir, settings, redo):
        return out_dir
    timings: dict[str, float] = {}
    t_all = time.perf_counter()

    t = time.perf_counter()
    records = train_games(games_dir, n_train_games, games_seed, game_size, progress=progress)
    timings["games_seconds"] = round(time.perf_counter() - t, 1)

    t = time.perf_counter()
    report = build_demos(
        records,
        mix=demo_mix,
        seed=seed,
        max_decisions=max_decisions,
        max_env_steps=max_env_steps,
        fmt=fmt,
        listing_style=listing_style,
        library=listings.library,
        retriever=listings.retriever,
        progress=progress,
    )
    timings["demos_seconds"] = round(time.perf_counter() - t, 1)
    if not report.demos:
        raise RuntimeError(f"no winning demonstration from {len(records)} games: {dict(report.dropped)}")

    t = time.perf_counter()
    corpus = tokenizer_corpus(report.demos, listings.library, fmt=fmt, listing_style=listing_style)
    tokenizer = train_tokenizer(corpus, vocab_size=vocab_size)
    timings["tokenizer_seconds"] = round(time.perf_counter() - t, 1)

    lengths = demo_token_lengths(tokenizer, report.demos)
    kept = [d for d, n in zip(report.demos, lengths, strict=True) if n <= max_length]
    kept_lengths = [n for n in lengths if n <= max_length]
    too_long = len(report.demos) - len(kept)

    work = stage_dir / "sft"
    common = dict(seed=seed, lr=lr, batch_size=batch_size, max_length=max_length, warmup_ratio=warmup_ratio,
                  logging_steps=logging_steps, report_to=report_to, progress=progress)  # fmt: skip
    train_stats: dict = {"pretrain": None, "sft": None}
    t = time.perf_counter()
    if dagger.base:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # the base's own tokenizer: the one trained above is identical (same corpus) but the
        # model's embedding rows belong to the base's
        tokenizer = AutoTokenizer.from_pretrained(dagger.base)
        model = AutoModelForCausalLM.from_pretrained(dagger.base)
        train_stats["base"] = str(Path(dagger.base).resolve())
    else:
        model = build_model(tokenizer, arch, seed=seed)
        if pretrain_epochs > 0:
            args = sft_config(work / "pretrain", epochs=pretrain_epochs, **common)
            trainer, train_stats["pretrain"] = sft_train(
                model, tokenizer, kept, args, drop_system=True, assistant_only=False
            )
            model = trainer.model
        args = sft_config(work / "sft", epochs=epochs, **common)
        trainer, train_stats["sft"] = sft_train(model, tokenizer, kept, args)
        model = trainer.model
    timings["train_seconds"] = round(time.perf_counter() - t, 1)
    if dagger.iterations:
        prior, first = [], 0
        if dagger.base:  # continuing a DAgger build: its relabelled demos stay in the aggregate
            base_stage = Path(dagger.base).parent
            if (base_stage / DAGGER_DEMOS).is_file():
                with open(base_stage / DAGGER_DEMOS) as f:
                    prior = [Demo(**json.loads(line)) for line in f]
            # the base may itself continue a build: number on from its last iteration, so fresh
            # games and episode seeds are new ones
            base_iterations = (base_manifest.get("train") or {}).get("dagger") or []
            first = max((it["iteration"] for it in base_iterations), default=-1) + 1
        train_stats["dagger_prior_demos"] = len(prior)
        t = time.perf_counter()

        def dagger_games(it: int):
            if not dagger.fresh_games:
                return records
            return train_games(
                games_dir, n_train_games, games_seed, game_size, progress, first=n_train_games * (it + 1)
            )

        model, train_stats["dagger"], relabelled = run_dagger(
            model, tokenizer, kept, dagger_games, work, dagger, fmt=fmt, listing_style=listing_style,
            mix=demo_mix, sft=common, prior=prior, first_iteration=first, max_decisions=max_decisions,
        )  # fmt: skip
        timings["dagger_seconds"] = round(time.perf_counter() - t, 1)
        with open(stage_dir / (DAGGER_DEMOS + ".tmp"), "w") as f:
            f.writelines(json.dumps(d.to_dict()) + "\n" for d in relabelled)
        os.replace(stage_dir / (DAGGER_DEMOS + ".tmp"), stage_dir / DAGGER_DEMOS)
    phases = [p for p in (train_stats["pretrain"], train_stats["sft"]) if p]
    phases += [it["sft"] for it in train_stats.get("dagger", [])]
    train_seconds = sum(p["train_seconds"] for p in phases)
    train_stats["tokens_per_second"] = (
        round(sum(p["tokens_per_epoch"] * p["epochs"] for p in phases) / train_seconds, 1)
        if train_seconds
        else None
    )

    return save_init_policy(
        out_dir, model, tokenizer, work=work, report=report, too_long=too_long, kept=kept,
        kept_lengths=kept_lengths, settings=settings, train=train_stats, timings=timings, t_all=t_all,
    )  # fmt: skip


def build_init_policy_from_config(
    config: InitConfig,
    out_dir: str | Path,
    *,
    games_dir: str | Path,
    seed: int,
    action_choice: str = "free",
    **kwargs,
) -> Path:
    """`build_init_policy` with the recipe's `InitConfig`, its recipe-wide `seed` and its rollouts' `action_choice`."""
    return build_init_policy(
        out_dir, games_dir=games_dir, seed=seed, **{**build_kwargs(config, action_choice), **kwargs}
    )


__all__ = [
    "COMPLETED",
    "MANIFEST",
    "build_init_policy",
    "build_init_policy_from_config",
    "build_kwargs",
    "demo_mix",
    "init_arch",
    "is_complete",
    "read_manifest",
    "train_games",
]
