"""The offline init policy: generated games -> demonstrations -> tokenizer -> tiny Qwen3 -> SFT.

`build_init_policy` is what `selskill init` / `make init` runs on a machine with no model.
It writes `runs/<exp>/round_0/train/model` (round 1's starting policy) and, in that
directory's parent, `init_manifest.json` (settings, demo statistics, loss curve, timings)
and finally `COMPLETED`. A second call with the same settings finds both and returns at
once; a call with different settings refuses to overwrite unless `redo=True`.

Training is TRL's `SFTTrainer` on demonstrations tokenized by the chat template
(`sft_dataset`: input ids + a loss mask) in two phases over the same demonstrations. Phase 1 (`pretrain_epochs`) puts every token in the
loss: a model trained from scratch sees only ~6% of the tokens as assistant tokens, too
little signal to learn to read its context (copy "alarmclock 1" from "On the desk 1, you
see a alarmclock 1"), and the observations are full of exactly that structure. Phase 2
(`epochs`) is the policy SFT proper on assistant tokens only: the ChatML template's
`{% generation %}` markers put only the assistant turns (decision + `<|im_end|>`) in the
loss; system prompt, observations and skill returns are context only. Injected wrong
moves (`Demo.untrained_turns`) are context in both phases. At equal compute
the two-phase recipe reached a held-out teacher-forced turn accuracy of 37% against 21%
for assistant-only training (40 games per type, 6 epochs in all). bf16/fp16 and gradient
checkpointing are off (CPU).
Demonstrations longer than `max_length` tokens are dropped rather than truncated (a
truncated demo would teach an unfinished episode).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from selskill.agent.turn_format import TurnFormat
from selskill.config import bad_value, changed_settings, check_at_least, check_choice
from selskill.policy.bootstrap import TinyArch, build_model, train_tokenizer
from selskill.policy.demos import (
    DEFAULT_MAX_ENV_STEPS,
    DEMO_FORMAT,
    DEMO_LISTING_STYLE,
    Demo,
    DemoMix,
    build_demos,
    demo_stats,
    tokenizer_corpus,
)

COMPLETED = "COMPLETED"
MANIFEST = "init_manifest.json"
MANIFEST_VERSION = 1
DAGGER_DEMOS = "dagger_demos.jsonl"  # the relabelled demonstrations of a DAgger build (all iterations)


@dataclass(frozen=True)
class DaggerSettings:
    """DAgger after the SFT (`selskill.policy.dagger.run_dagger`); `iterations=0` turns it off."""

    iterations: int = 0
    epochs: float = 2.0
    lr: float = 1e-3
    points: int = 2
    max_env_steps: int = 30
    temperature: float = 0.0
    base: str = ""  # an existing init model (same settings, DAgger off) to start from
    fresh_games: bool = False  # iteration i plays new generated train games, not the SFT's

    def __post_init__(self):
        if self.iterations < 0 or self.points < 1 or self.epochs <= 0 or self.max_env_steps < 1:
            raise ValueError(
                f"DAgger settings out of range: {self} (init_dagger_iters >= 0, init_dagger_points >= 1, "
                "init_dagger_epochs > 0, init_dagger_env_steps >= 1)"
            )
        if self.base and not self.iterations:
            raise ValueError("init_dagger_from is set but init_dagger_iters is 0: set init_dagger_iters >= 1")


@dataclass
class InitConfig:
    """Recipe keys of the init stage (`init_` prefix: they share one flat recipe with TRL's)."""

    init_games_per_type: int = field(default=40, metadata={"help": "generated train games per task type"})
    init_game_size: str = field(
        default="small", metadata={"help": "generated scene size: tiny, small or real"}
    )
    init_max_env_steps: int = field(
        default=DEFAULT_MAX_ENV_STEPS, metadata={"help": "demos needing more environment steps are dropped"}
    )
    init_vocab_size: int = field(
        default=2048, metadata={"help": "BPE vocabulary size of the local tokenizer"}
    )
    init_hidden_size: int = field(default=256, metadata={"help": "model width"})
    init_intermediate_size: int = field(default=768, metadata={"help": "MLP width"})
    init_layers: int = field(default=4, metadata={"help": "transformer layers"})
    init_heads: int = field(default=4, metadata={"help": "attention heads"})
    init_kv_heads: int = field(default=2, metadata={"help": "key/value heads"})
    init_head_dim: int = field(default=64, metadata={"help": "attention head size"})
    init_pretrain_epochs: float = field(
        default=4.0,
        metadata={"help": "first phase: epochs with every token in the loss, no system prompt (0 = skip)"},
    )
    init_epochs: float = field(
        default=8.0, metadata={"help": "second phase: epochs on assistant tokens only"}
    )
    init_lr: float = field(default=4e-3, metadata={"help": "peak learning rate (AdamW, cosine, warmup)"})
    init_warmup_ratio: float = field(default=0.05, metadata={"help": "warmup share of the SFT steps"})
    init_batch_size: int = field(default=2, metadata={"help": "demonstrations per optimizer step"})
    init_max_length: int = field(default=4096, metadata={"help": "longer demonstrations are dropped"})
    init_logging_steps: int = field(default=10, metadata={"help": "loss is logged every this many steps"})
    init_demo_opening_memory: float = field(default=DemoMix.opening_memory, metadata={"help": "see DemoMix"})
    init_demo_premature_start: float = field(
        default=DemoMix.premature_start, metadata={"help": "see DemoMix"}
    )
    init_demo_premature_seen: float = field(default=DemoMix.premature_seen, metadata={"help": "see DemoMix"})
    init_demo_repeat_failed: float = field(default=DemoMix.repeat_failed, metadata={"help": "see DemoMix"})
    init_demo_after_failure_memory: float = field(
        default=DemoMix.after_failure_memory, metadata={"help": "see DemoMix"}
    )
    init_demo_useful: float = field(default=DemoMix.useful, metadata={"help": "see DemoMix"})
    init_demo_place_memory: float = field(default=DemoMix.place_memory, metadata={"help": "see DemoMix"})
    init_demo_wrong_executable: float = field(
        default=DemoMix.wrong_executable, metadata={"help": "see DemoMix"}
    )
    init_demo_second_memory: float = field(default=DemoMix.second_memory, metadata={"help": "see DemoMix"})
    init_demo_random_memory: float = field(default=DemoMix.random_memory, metadata={"help": "see DemoMix"})
    init_demo_mistake: float = field(default=DemoMix.mistake, metadata={"help": "see DemoMix"})
    init_demo_false_take: float = field(default=DemoMix.false_take, metadata={"help": "see DemoMix"})
    init_demo_search: str = field(
        default=DemoMix.search,
        metadata={
            "help": "expert search order: prior (likely places first) | sweep (every receptacle by name)"
        },
    )

    init_dagger_iters: int = field(
        default=0,
        metadata={
            "help": "DAgger iterations after SFT: play the policy on the train games, let the expert label "
            "the states it reached, SFT on all demonstrations so far (0 = off; selskill/policy/dagger.py)"
        },
    )
    init_dagger_epochs: float = field(
        default=2.0, metadata={"help": "epochs per DAgger iteration over the aggregated demonstrations"}
    )
    init_dagger_lr: float = field(default=1e-3, metadata={"help": "peak learning rate of the DAgger SFT"})
    init_dagger_points: int = field(
        default=2, metadata={"help": "relabelled demonstrations per policy episode (from its disagreements)"}
    )
    init_dagger_env_steps: int = field(
        default=30,
        metadata={"help": "environment steps of a DAgger policy episode (and of the expert after it)"},
    )
    init_dagger_temperature: float = field(
        default=0.0, metadata={"help": "sampling temperature of the DAgger policy episodes (0 = greedy)"}
    )
    init_dagger_fresh_games: bool = field(
        default=False,
        metadata={
            "help": "each DAgger iteration plays init_games_per_type new generated train games per type "
            "(false: the games of the demonstrations)"
        },
    )
    init_dagger_from: str = field(
        default="",
        metadata={
            "help": "start DAgger from this existing init model (built with the same settings, DAgger off) "
            "instead of training the base policy again"
        },
    )
    # benchmark bfcl (selskill/policy/bfcl_init.py): demonstrations are the train split's ground truth
    init_bfcl_tasks: int = field(
        default=0,
        metadata={
            "help": "benchmark bfcl: train tasks demonstrated, the first N in the order the sample stage takes "
            "them (0 = every task of the train split)"
        },
    )
    init_bfcl_opening_memory: float = field(default=0.5, metadata={"help": "benchmark bfcl: see BfclDemoMix"})
    init_bfcl_useful: float = field(default=0.8, metadata={"help": "benchmark bfcl: see BfclDemoMix"})
    init_bfcl_reference_memory: float = field(
        default=0.15, metadata={"help": "benchmark bfcl: see BfclDemoMix"}
    )
    init_bfcl_wrong_executable: float = field(
        default=0.15, metadata={"help": "benchmark bfcl: see BfclDemoMix"}
    )
    init_bfcl_missing_function: float = field(
        default=0.8, metadata={"help": "benchmark bfcl: see BfclDemoMix"}
    )

    def __post_init__(self):
        from selskill.envs.alfworld_gen import SIZES

        check_choice(self, "init_game_size", SIZES)
        check_choice(self, "init_demo_search", ("prior", "sweep"))
        check_at_least(
            self,
            1,
            "init_games_per_type",
            "init_max_env_steps",
            "init_vocab_size",
            "init_hidden_size",
            "init_intermediate_size",
            "init_layers",
            "init_heads",
            "init_kv_heads",
            "init_head_dim",
            "init_batch_size",
            "init_max_length",
            "init_logging_steps",
            "init_dagger_points",
            "init_dagger_env_steps",
        )
        check_at_least(
            self,
            0,
            "init_pretrain_epochs",
            "init_epochs",
            "init_dagger_iters",
            "init_dagger_epochs",
            "init_dagger_temperature",
        )
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if (
                f.name.startswith("init_demo_") and isinstance(value, float)
            ) or f.name == "init_warmup_ratio":
                if not 0 <= value <= 1:
                    raise bad_value(f.name, value, "in [0, 1]", "a probability or share")
        for key in ("init_lr", "init_dagger_lr"):
            if getattr(self, key) <= 0:
                raise bad_value(key, getattr(self, key), "> 0", "a learning rate")

    def bfcl_demo_mix(self):
        """The `init_bfcl_*` rates as a `BfclDemoMix` (which checks them)."""
        from selskill.policy.bfcl_demos import BfclDemoMix

        prefix = "init_bfcl_"
        return BfclDemoMix(**{f.name[len(prefix) :]: getattr(self, f.name) for f in dataclasses.fields(self)
                              if f.name.startswith(prefix) and f.name != "init_bfcl_tasks"})  # fmt: skip

    def demo_mix(self) -> DemoMix:
        prefix = "init_demo_"
        return DemoMix(**{f.name[len(prefix) :]: getattr(self, f.name) for f in dataclasses.fields(self)
                          if f.name.startswith(prefix)})  # fmt: skip

    def arch(self) -> TinyArch:
        return TinyArch(
            hidden_size=self.init_hidden_size,
            intermediate_size=self.init_intermediate_size,
            num_hidden_layers=self.init_layers,
            num_attention_heads=self.init_heads,
            num_key_value_heads=self.init_kv_heads,
            head_dim=self.init_head_dim,
        )

    def build_kwargs(self) -> dict:
        """Keyword arguments of `build_init_policy` (add out_dir, games_dir, seed)."""
        return {
            "n_train_games": self.init_games_per_type,
            "game_size": self.init_game_size,
            "max_env_steps": self.init_max_env_steps,
            "demo_mix": self.demo_mix(),
            "vocab_size": self.init_vocab_size,
            "arch": self.arch(),
            "pretrain_epochs": self.init_pretrain_epochs,
            "epochs": self.init_epochs,
            "lr": self.init_lr,
            "warmup_ratio": self.init_warmup_ratio,
            "batch_size": self.init_batch_size,
            "max_length": self.init_max_length,
            "logging_steps": self.init_logging_steps,
            "dagger": DaggerSettings(
                iterations=self.init_dagger_iters,
                epochs=self.init_dagger_epochs,
                lr=self.init_dagger_lr,
                points=self.init_dagger_points,
                max_env_steps=self.init_dagger_env_steps,
                temperature=self.init_dagger_temperature,
                base=self.init_dagger_from,
                fresh_games=self.init_dagger_fresh_games,
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
    from selskill.envs.alfworld import TRAJ_FILE, find_games
    from selskill.envs.alfworld_gen import TASK_TYPES, generate_games

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
    chosen = pick(find_games(root, "train")) if (root / "train").is_dir() else {}
    if any(len(chosen.get(t, [])) < per_type for t in TASK_TYPES):
        generate_games(
            root, per_type=first + per_type, seed=seed, split="train", size=size, progress=progress
        )
        chosen = pick(find_games(root, "train"))
    records = [r for t in TASK_TYPES for r in sorted(chosen.get(t, []), key=lambda r: r.task_id)]
    return records


# --- SFT --------------------------------------------------------------------------------


def demo_token_lengths(tokenizer, demos: list[Demo]) -> list[int]:
    return [len(tokenizer.apply_chat_template(d.messages, tokenize=True, return_dict=True)["input_ids"])
            for d in demos]  # fmt: skip


def sft_dataset(demos: list[Demo], tokenizer, drop_system: bool = False, assistant_only: bool = True):
    """Tokenized rows (`input_ids`, `assistant_masks`) that TRL's SFTTrainer trains as they are.

    The mask is the chat template's assistant mask (`assistant_only`) or all ones, minus
    every `Demo.untrained_turns` assistant turn (injected mistakes: context, not targets).
    `drop_system` leaves out the system prompt (phase 1: it is the same in every
    demonstration, ~25-35% of the tokens, and teaches nothing about the game).
    """
    from datasets import Dataset

    rows = []
    for d in demos:
        messages = [m for m in d.messages if not (drop_system and m["role"] == "system")]
        enc = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ids, turn_mask = list(enc["input_ids"]), list(enc["assistant_masks"])
        mask = list(turn_mask) if assistant_only else [1] * len(ids)
        skip = set(d.untrained_turns)
        turn, inside = -1, False
        for i, bit in enumerate(turn_mask):
            if bit and not inside:
                turn += 1
            inside = bool(bit)
            if bit and turn in skip:
                mask[i] = 0
        if skip and turn + 1 != sum(1 for m in messages if m["role"] == "assistant"):
            raise ValueError(f"{d.task_id}: the chat template's assistant mask does not match the turns")
        rows.append({"input_ids": ids, "assistant_masks": mask})
    return Dataset.from_list(rows)


def init_device() -> str:
    """Where the init build trains and plays its DAgger episodes: the GPU when there is one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def sft_config(
    output_dir: str | Path,
    *,
    seed: int,
    epochs: float,
    lr: float,
    batch_size: int,
    max_length: int,
    warmup_ratio: float = 0.05,
    logging_steps: int = 10,
    report_to: str | list[str] = "none",
    progress: bool = True,
    use_cpu: bool | None = None,
):
    """TRL SFT arguments for the CPU-friendly init training.

    Which tokens carry the loss is decided by `sft_dataset`'s `assistant_masks` column (TRL
    builds the labels from it), so TRL's own `assistant_only_loss` stays off.
    """
    from trl import SFTConfig

    if use_cpu is None:
        use_cpu = init_device() == "cpu"
    return SFTConfig(
        output_dir=str(output_dir),
        num_train_epochs=epochs,
        learning_rate=lr,
        lr_scheduler_type="cosine",
        warmup_steps=warmup_ratio,
        weight_decay=0.0,
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=1,
        max_length=max_length,
        assistant_only_loss=False,
        packing=False,
        # similar lengths in one batch: less padding, which is pure waste on a CPU
        train_sampling_strategy="group_by_length",
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=use_cpu,
        seed=seed,
        data_seed=seed,
        logging_steps=logging_steps,
        save_strategy="no",
        report_to=report_to,
        disable_tqdm=not progress,
        dataloader_num_workers=0,
    )


def sft_train(
    model, tokenizer, demos: list[Demo], args, drop_system: bool = False, assistant_only: bool = True
) -> tuple[object, dict]:
    """SFT `model` on `demos`; returns the trainer and training stats (loss curve, tokens/s)."""
    from trl import SFTTrainer

    dataset = sft_dataset(demos, tokenizer, drop_system=drop_system, assistant_only=assistant_only)
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    n_tokens = sum(len(ids) for ids in trainer.train_dataset["input_ids"])
    n_trained = sum(sum(1 for x in labels if x != -100) for labels in trainer.train_dataset["labels"]) \
        if "labels" in trainer.train_dataset.column_names else None  # fmt: skip
    start = time.perf_counter()
    output = trainer.train()
    seconds = time.perf_counter() - start
    epochs = float(args.num_train_epochs)
    losses = [
        {"step": e["step"], "epoch": round(e.get("epoch", 0.0), 3), "loss": e["loss"]}
        for e in trainer.state.log_history
        if "loss" in e
    ]
    stats = {
        "epochs": epochs,
        "train_seconds": round(seconds, 1),
        "steps": trainer.state.global_step,
        "final_train_loss": output.training_loss,
        "loss_curve": losses,
        "tokens_per_epoch": n_tokens,
        "assistant_tokens_per_epoch": n_trained,
        "tokens_per_second": round(n_tokens * epochs / seconds, 1) if seconds > 0 else None,
    }
    return trainer, stats


# --- the whole build ------------------------------------------------------------------------


def _settings(**kwargs) -> dict:
    out = {}
    for key, value in kwargs.items():
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        elif isinstance(value, Path):
            value = str(value)
        out[key] = value
    return json.loads(json.dumps(out, sort_keys=True))


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


def read_manifest(out_dir: str | Path) -> dict | None:
    path = Path(out_dir).parent / MANIFEST
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def is_complete(out_dir: str | Path) -> bool:
    out_dir = Path(out_dir)
    return (out_dir.parent / COMPLETED).is_file() and (out_dir / "config.json").is_file()


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
    max_env_steps: int = DEFAULT_MAX_ENV_STEPS,
    game_size: str = "small",
    games_seed: int | None = None,
    fmt: TurnFormat = DEMO_FORMAT,
    listing_style: str = DEMO_LISTING_STYLE,
    dagger: DaggerSettings | None = None,
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
    `epochs` with the assistant tokens only (the policy).
    """
    out_dir = Path(out_dir)
    stage_dir = out_dir.parent
    demo_mix = demo_mix or DemoMix()
    arch = arch or TinyArch()
    games_seed = seed if games_seed is None else games_seed
    settings = _settings(
        version=MANIFEST_VERSION,
        games_dir=Path(games_dir).resolve(),
        n_train_games=n_train_games,
        seed=seed,
        games_seed=games_seed,
        game_size=game_size,
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
    if not settings["demo_mix"].get("false_take"):
        # keys added later join the settings only when used: earlier builds stay reusable
        settings["demo_mix"].pop("false_take", None)
    dagger = dagger or DaggerSettings()
    base_manifest: dict = {}
    if dagger.iterations:
        # only DAgger builds carry the key: builds without it keep their manifests valid
        if dagger.base:
            base_manifest = _check_base(dagger.base, settings)
        settings["dagger"] = _settings(d=dagger)["d"]
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
        max_env_steps=max_env_steps,
        fmt=fmt,
        listing_style=listing_style,
        progress=progress,
    )
    timings["demos_seconds"] = round(time.perf_counter() - t, 1)
    if not report.demos:
        raise RuntimeError(f"no winning demonstration from {len(records)} games: {dict(report.dropped)}")

    t = time.perf_counter()
    corpus = tokenizer_corpus(report.demos, fmt=fmt, listing_style=listing_style)
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
        from selskill.policy.dagger import run_dagger

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
            mix=demo_mix, sft=common, prior=prior, first_iteration=first,
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


def reuse_or_start(out_dir: Path, stage_dir: Path, settings: dict, redo: bool) -> bool:
    """True when `out_dir` holds a complete init built with `settings` (reuse it); a complete
    init built otherwise is refused naming what differs; else the stage is reset for a build."""
    if not redo and is_complete(out_dir):
        manifest = read_manifest(out_dir) or {}
        if manifest.get("settings") == settings:
            return True
        differ = changed_settings(manifest.get("settings") or {}, settings)
        raise FileExistsError(
            f"{out_dir} holds an init policy built with other settings: {'; '.join(differ)} (built -> asked; "
            f"{stage_dir / MANIFEST}). Pass the settings it was built with, --redo to rebuild it, or choose "
            "another experiment"
        )
    (stage_dir / COMPLETED).unlink(missing_ok=True)
    stage_dir.mkdir(parents=True, exist_ok=True)
    return False


def save_init_policy(
    out_dir: Path, model, tokenizer, *, work: Path, report, too_long: int, kept, kept_lengths,
    settings: dict, train: dict, timings: dict, t_all: float,
) -> Path:  # fmt: skip
    """Model (tmp + rename), then the manifest, then COMPLETED: a crash leaves the init incomplete."""
    stage_dir = out_dir.parent
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    shutil.rmtree(work, ignore_errors=True)
    timings["total_seconds"] = round(time.perf_counter() - t_all, 1)

    stats = report.stats()
    stats["dropped"]["too_long"] = too_long
    manifest = {
        "settings": settings,
        "model_dir": str(out_dir),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
        "demos": stats,
        "demo_tokens": {
            "mean": round(sum(kept_lengths) / max(1, len(kept_lengths)), 1),
            "max": max(kept_lengths, default=0),
            "min": min(kept_lengths, default=0),
            "total": sum(kept_lengths),
        },
        "train": train,
        "timings": timings,
        "task_ids": [d.task_id for d in kept],
        "demo_task_types": dict(Counter(d.task_type for d in kept)),
    }
    (stage_dir / (MANIFEST + ".tmp")).write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(stage_dir / (MANIFEST + ".tmp"), stage_dir / MANIFEST)
    (stage_dir / COMPLETED).write_text(json.dumps({"seconds": timings["total_seconds"]}) + "\n")
    return out_dir


def build_init_policy_from_config(
    config: InitConfig, out_dir: str | Path, *, games_dir: str | Path, seed: int, **kwargs
) -> Path:
    """`build_init_policy` with the recipe's `InitConfig` and TRL's recipe-wide `seed`."""
    return build_init_policy(out_dir, games_dir=games_dir, seed=seed, **{**config.build_kwargs(), **kwargs})


__all__ = [
    "COMPLETED",
    "MANIFEST",
    "InitConfig",
    "build_init_policy",
    "build_init_policy_from_config",
    "demo_stats",
    "demo_token_lengths",
    "init_device",
    "is_complete",
    "read_manifest",
    "sft_config",
    "sft_train",
    "train_games",
]
