"""The offline ALFWorld init policy: generated games -> demonstrations -> tokenizer -> tiny Qwen3 -> SFT.

`build_init_policy` is what `selskill init` / `make init` runs on a machine with no model.
It writes `runs/<exp>/round_0/train/model` (round 1's starting policy) and, in that
directory's parent, `init_manifest.json` (settings, demo statistics, loss curve, timings)
and finally `COMPLETED`. A second call with the same settings finds both and returns at
once; a call with different settings refuses to overwrite unless `redo=True`.

Training is TRL's SFT (`selskill.sft.build`) in two phases over the same demonstrations.
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
adds DAgger after the SFT (`selskill.benchmarks.alfworld.dagger`).
Demonstrations longer than `max_length` tokens are dropped rather than truncated (a
truncated demo would teach an unfinished episode).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.benchmarks.alfworld.dagger import DaggerRun, continued_from, run_dagger, save_relabelled
from selskill.benchmarks.alfworld.demos import ALFWORLD_PROMPTS, build_demos, tokenizer_corpus
from selskill.benchmarks.alfworld.init_config import AlfworldDemos, DaggerSettings
from selskill.config.init import InitTraining
from selskill.data.inputs import changed_settings
from selskill.policy.bootstrap import train_tokenizer
from selskill.sft.build import (
    COMPLETED,
    MANIFEST,
    TrainedDemos,
    build_listings,
    is_complete,
    read_manifest,
    reuse_or_start,
    save_init_policy,
    settings_record,
    timed,
    train_init_model,
    training_record,
)
from selskill.sft.demos import DemoPrompts, DemoSource

MANIFEST_VERSION = 1


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


def _demo_settings(games_dir, seed: int, demos: AlfworldDemos, prompts: DemoPrompts) -> dict:
    """The settings that decide the demonstrations: the games, the expert's mix and budget, the prompts."""
    settings = settings_record(
        version=MANIFEST_VERSION,
        games_dir=Path(games_dir).resolve(),
        n_train_games=demos.games_per_type,
        seed=seed,
        games_seed=seed,
        game_size=demos.game_size,
        max_decisions=demos.budget.max_decisions,
        max_env_steps=demos.budget.max_env_steps,
        demo_mix=demos.mix,
        fmt=prompts.fmt,
        listing_style=prompts.listing_style,
    )
    for later in ("false_take", "no_skills"):
        # keys added later join the settings only when used: earlier builds stay reusable
        if not settings["demo_mix"].get(later):
            settings["demo_mix"].pop(later, None)
    return settings


def _settings(
    games_dir, seed: int, demos: AlfworldDemos, training: InitTraining, prompts: DemoPrompts
) -> dict:
    """The manifest's settings of a build without DAgger (a second build with equal ones reuses it)."""
    return {**_demo_settings(games_dir, seed, demos, prompts), **settings_record(**training_record(training))}


def _play_demos(
    games_dir, seed: int, demos: AlfworldDemos, prompts: DemoPrompts, progress: bool, timings: dict
):
    """(the train games, the expert's winning demonstrations on them); no winning one is an error."""
    with timed(timings, "games_seconds"):
        records = train_games(games_dir, demos.games_per_type, seed, demos.game_size, progress=progress)
    with timed(timings, "demos_seconds"):
        report = build_demos(
            records, prompts=prompts, mix=demos.mix, budget=demos.budget, seed=seed, progress=progress
        )
    if not report.demos:
        raise RuntimeError(f"no winning demonstration from {len(records)} games: {dict(report.dropped)}")
    return records, report


def _record_dagger(settings: dict, dagger: DaggerSettings, mode: str) -> dict:
    """Add DAgger to `settings` (only DAgger builds carry the key: builds without it keep their
    manifests valid); returns the manifest of the build it continues ({} for none)."""
    if not dagger.iterations:
        return {}
    if mode != "all":
        raise ValueError(
            f"init_dagger_iters: {dagger.iterations} with retrieval_mode: {mode}: DAgger's rollouts "
            "list every skill; build the retrieval init with init_dagger_iters: 0"
        )
    base_manifest = _check_base(dagger.base, settings) if dagger.base else {}
    settings["dagger"] = settings_record(d=dagger)["d"]
    if dagger.base:
        settings["dagger"]["base"] = str(Path(dagger.base).resolve())
        settings["dagger"]["base_dagger"] = base_manifest["settings"].get("dagger")
    return base_manifest


def _start_model(
    tokenizer, demos: TrainedDemos, training: InitTraining, base: str, work: Path, *, seed, progress
):
    """(model, tokenizer, train stats): DAgger's `base` as it is, else a model SFT'd on `demos`."""
    if not base:
        model, stats = train_init_model(
            tokenizer, demos.kept, training, work, seed=seed, progress=progress, drop_system=True
        )
        return model, tokenizer, stats
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # the base's own tokenizer: the one trained here is identical (same corpus) but the model's
    # embedding rows belong to the base's
    model = AutoModelForCausalLM.from_pretrained(base)
    stats = {"pretrain": None, "sft": None, "base": str(Path(base).resolve())}
    return model, AutoTokenizer.from_pretrained(base), stats


def _tokens_per_second(train_stats: dict) -> float | None:
    """Over every SFT phase of the build, DAgger's included."""
    phases = [p for p in (train_stats["pretrain"], train_stats["sft"]) if p]
    phases += [it["sft"] for it in train_stats.get("dagger", [])]
    seconds = sum(p["train_seconds"] for p in phases)
    return round(sum(p["tokens_per_epoch"] * p["epochs"] for p in phases) / seconds, 1) if seconds else None


def build_init_policy(
    out_dir: str | Path,
    *,
    games_dir: str | Path,
    seed: int = 42,
    demos: AlfworldDemos | None = None,
    training: InitTraining | None = None,
    dagger: DaggerSettings | None = None,
    prompts: DemoPrompts = ALFWORLD_PROMPTS,
    progress: bool = True,
    redo: bool = False,
) -> Path:
    """Build (or reuse) the offline init policy at `out_dir`; returns `out_dir`.

    `demos.games_per_type` generated train games of each type (under `games_dir`) are played by
    the expert with `demos.mix`; `seed` seeds the games, the mix, the model init and SFT.
    Training runs in `training.sft`'s two phases over the same demonstrations: every token in
    the loss (the model learns the environment's language and to copy names from its context,
    which a from-scratch model does not learn from the few assistant tokens alone), then the
    assistant tokens only (the policy). `prompts` are the rounds' (`build_from_recipe`):
    the demonstrations list each decision's skills as the rounds will, and are kept only if won
    within `demos.budget`, so that the init is not taught an episode the rounds' step budget
    would cut short. `dagger` (iterations > 0) adds DAgger after the SFT.
    """
    out_dir = Path(out_dir)
    stage_dir = out_dir.parent
    demos, training, dagger = demos or AlfworldDemos(), training or InitTraining(), dagger or DaggerSettings()
    settings = _settings(games_dir, seed, demos, training, prompts)
    listings = build_listings(settings, load_alfworld_skills(), prompts)
    base_manifest = _record_dagger(settings, dagger, listings.mode)
    if reuse_or_start(out_dir, stage_dir, settings, redo):
        return out_dir
    timings: dict[str, float] = {}
    t_all = time.perf_counter()
    records, report = _play_demos(games_dir, seed, demos, prompts, progress, timings)
    with timed(timings, "tokenizer_seconds"):
        corpus = tokenizer_corpus(
            report.demos, listings.library, fmt=prompts.fmt, listing_style=prompts.listing_style
        )
        tokenizer = train_tokenizer(corpus, vocab_size=training.vocab_size)
    trained = TrainedDemos.of(report, tokenizer, training.sft.max_length)
    work = stage_dir / "sft"
    with timed(timings, "train_seconds"):
        model, tokenizer, train_stats = _start_model(
            tokenizer, trained, training, dagger.base, work, seed=seed, progress=progress
        )
    if dagger.iterations:
        prior, first = continued_from(dagger, base_manifest)
        train_stats["dagger_prior_demos"] = len(prior)

        def dagger_games(it: int):
            if not dagger.fresh_games:
                return records
            per_type = demos.games_per_type
            return train_games(
                games_dir, per_type, seed, demos.game_size, progress, first=per_type * (it + 1)
            )

        # DAgger's episodes list the benchmark's own skills, all of them (a retrieval build refuses DAgger)
        run = DaggerRun(dagger, DemoPrompts(prompts.fmt, prompts.listing_style), demos.mix,
                        demos.budget.max_decisions, training.sft, seed, progress)  # fmt: skip
        with timed(timings, "dagger_seconds"):
            model, train_stats["dagger"], relabelled = run_dagger(
                model, tokenizer, trained.kept, dagger_games, work, run, prior=prior, first_iteration=first
            )
        save_relabelled(stage_dir, relabelled)
    train_stats["tokens_per_second"] = _tokens_per_second(train_stats)
    return save_init_policy(out_dir, model, tokenizer, work=work, demos=trained, settings=settings,
                            train=train_stats, timings=timings, t_all=t_all)  # fmt: skip


def build_from_recipe(
    recipe, out: Path, *, fmt, train_tasks: Callable[[int], list[str]], library, retriever
) -> Path:
    """The init policy the recipe asks for (what the plugin's `build_init` runs): `fmt`, `library` and
    `retriever` are the rounds' own; ALFWorld's demonstrations play its generated train games."""
    return build_init_policy(
        out,
        games_dir=recipe.settings.games_dir,
        seed=recipe.seed,
        demos=recipe.settings.alfworld_demos(),
        training=recipe.init.training(),
        dagger=recipe.settings.dagger(recipe.rollout.action_choice),
        prompts=DemoPrompts(fmt, recipe.rollout.listing_style, library, retriever),
    )


def demos_from_recipe(
    recipe, *, fmt, train_tasks: Callable[[int], list[str]], library, retriever
) -> DemoSource:
    """The demonstrations `init_sft` fine-tunes a given model on (what the plugin's `init_demos` runs):
    those `build_from_recipe` trains its own model on, with the recipe's mix, budget and prompts."""
    games_dir, seed, demos = recipe.settings.games_dir, recipe.seed, recipe.settings.alfworld_demos()
    prompts = DemoPrompts(fmt, recipe.rollout.listing_style, library, retriever)
    settings = _demo_settings(games_dir, seed, demos, prompts)
    build_listings(settings, load_alfworld_skills(), prompts)

    def play(progress: bool, timings: dict):
        return _play_demos(games_dir, seed, demos, prompts, progress, timings)[1]

    return DemoSource(settings, play)


__all__ = [
    "COMPLETED",
    "MANIFEST",
    "build_from_recipe",
    "demos_from_recipe",
    "build_init_policy",
    "is_complete",
    "read_manifest",
    "train_games",
]
