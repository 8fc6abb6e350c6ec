"""`selskill bench dpo-step`: DPO steps of SelSkillDPOTrainer against stock trl.DPOTrainer on the same batches.

It lives beside the trainer because it drives the trainer's internals (`training_step`,
`compute_loss`, the collators) step by step, which no round does. Two modes.

Without --round: synthetic pairs, one step of our trainer against TRL's. Both trainers get the
same tokenized batch, with our loss mask equal to the plain completion mask (1 on every
completion token), the same freshly built model and the same reference. The reference differs
from the policy (another seed), so the loss is not trivially log 2. The step is forward +
backward + optimizer step; steps alternate between the two trainers so a busy neighbour slows
both alike. Prints both loss trajectories (they must agree) and the time ratio (ours / stock).

    OMP_NUM_THREADS=1 selskill bench dpo-step [--pairs 4 --prompt 384 --completion 256 --steps 20]

With --round DIR (a round directory with label shards) and --policy: that round's real pairs,
fitted by the recipe's train section, go once through each of stock TRL, ours unpacked
(train_prefix_sharing none), `pair` and `branch`, side by side in one process. A step is the
pairs of one branch point (one prompt after fitting): stock, none and pair take them one pair
per micro-batch (the recipes' batch 1), branch all at once; then one AdamW step. `none-bp` is
ours unpacked on branch's micro-batches: the loss branch must reproduce (the sft term averages
over a micro-batch's tokens, so batching changes it; packing must not). Policy and
reference start as the round's policy, the reference runs every step (no precompute), and the
modes take turns on every branch point so that a busy neighbour slows all alike. It prints
tokens through the model, step time and loss per mode for the local pairs, the episode pairs
and both; stock TRL trains every completion token (no loss mask), so its loss differs. With
--train-stage it then times the whole train stage (`selskill.train.run`, the recipe as is)
once per mode on a copy of the round's shards:

    OMP_NUM_THREADS=1 selskill bench dpo-step --round runs/m27x/round_1 \
        --policy runs/m27/round_0/train/model [--recipe recipes/tiny.yaml] [--train-stage]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main(args: argparse.Namespace) -> int:
    """`selskill bench dpo-step`: the round mode with --round, else the synthetic one."""
    os.environ.setdefault("WANDB_MODE", "disabled")
    if args.round:
        if not args.policy:
            raise ValueError("--round needs --policy, the model directory that round trains")
        return round_bench(args)
    return synthetic_bench(args)


# --- synthetic mode -------------------------------------------------------------------------------------

CORPUS = [
    "You are an agent solving a task in a text-based household environment.",
    "Your task is to: put a hot apple in fridge. <action>go to countertop 1</action>",
    "On the countertop 1, you see a apple 1, a knife 2, and a mug 3. You heat the apple 1.",
]


def synthetic_bench(args) -> int:
    import numpy as np
    import torch

    from selskill.policy.bootstrap import train_tokenizer

    torch.manual_seed(args.seed)
    tok = train_tokenizer(CORPUS * 20, vocab_size=554)
    rows = _batch_rows(len(tok), args, np.random.default_rng(args.seed))
    stock, ours = _synthetic_trainers(args, tok, rows)
    stock_batch = stock.data_collator(
        [{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in rows]
    )
    our_batch = ours.data_collator(rows)
    for key in ("input_ids", "attention_mask", "completion_mask"):
        assert torch.equal(stock_batch[key], our_batch[key]), f"batches differ in {key}"
    losses, times = _alternate_steps(args, {"stock": (stock, stock_batch), "ours": (ours, our_batch)})
    _print_synthetic(args, tok, ours, our_batch, losses, times)
    return 0


def _batch_rows(vocab: int, args, rng) -> list[dict]:
    rows = []
    for i in range(args.pairs):
        c_len = args.completion - (i % 3) * 7  # ragged, so padding is exercised
        r_len = args.completion - ((i + 1) % 3) * 11
        rows.append(
            {
                "pair_id": f"bench-{i}",
                "kind": "episode" if i % 2 else "local",
                "prompt_ids": rng.integers(3, vocab, args.prompt).tolist(),
                "chosen_ids": rng.integers(3, vocab, c_len).tolist(),
                "rejected_ids": rng.integers(3, vocab, r_len).tolist(),
                "chosen_loss_mask": [1] * c_len,
                "rejected_loss_mask": [1] * r_len,
            }
        )
    return rows


def _tiny_arch(args):
    from selskill.config.init import TinyArch

    heads = max(args.hidden // 64, 1)
    return TinyArch(
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1),
        head_dim=64,
    )


def _synthetic_trainers(args, tok, rows):
    """(stock TRL, ours): the same freshly built model, and the same reference from another seed."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from selskill.policy.bootstrap import build_model
    from selskill.train.pairs import examples_to_dataset
    from selskill.train.trainer import SelSkillDPOTrainer

    arch = _tiny_arch(args)
    cfg = dict(
        output_dir=tempfile.mkdtemp(prefix="bench_dpo_"),
        per_device_train_batch_size=args.pairs,
        learning_rate=1e-5,
        bf16=args.bf16,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        max_length=None,
        seed=args.seed,
        disable_tqdm=True,
    )
    # Stock DPOTrainer cannot take pre-tokenized rows through its dataset preparation, so it is built on a
    # small text dataset; the timed batch is the same tokenized batch for both trainers.
    text = Dataset.from_dict({"prompt": ["a task"] * 2, "chosen": [" good"] * 2, "rejected": [" bad"] * 2})
    stock = DPOTrainer(
        build_model(tok, arch, seed=args.seed),
        ref_model=build_model(tok, arch, seed=args.seed + 1),
        args=DPOConfig(**cfg),
        train_dataset=text,
        processing_class=tok,
    )
    ours = SelSkillDPOTrainer(
        build_model(tok, arch, seed=args.seed),
        ref_model=build_model(tok, arch, seed=args.seed + 1),
        args=DPOConfig(**cfg),
        train_dataset=examples_to_dataset(rows),
        processing_class=tok,
    )
    return stock, ours


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed_step(trainer, batch) -> tuple[float, float]:
    """(seconds, loss) of one forward + backward + optimizer step on `batch`."""
    if trainer.optimizer is None:
        trainer.create_optimizer()
        trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train() otherwise
    _sync()
    start = time.perf_counter()
    loss = trainer.training_step(trainer.model, dict(batch))
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    _sync()
    return time.perf_counter() - start, loss.item()


def _alternate_steps(args, runs: dict) -> tuple[dict, dict]:
    """Losses of every step and times of the timed ones, per name of `runs` ({name: (trainer, batch)});
    the trainers take turns, first one then the other, so a busy neighbour slows both alike."""
    losses = {name: [] for name in runs}
    times = {name: [] for name in runs}
    for i in range(args.warmup + args.steps):
        for name, (trainer, batch) in list(runs.items())[:: 1 if i % 2 else -1]:
            dt, loss = _timed_step(trainer, batch)
            losses[name].append(loss)
            if i >= args.warmup:
                times[name].append(dt)
    return losses, times


def _print_synthetic(args, tok, ours, our_batch, losses, times) -> None:
    import torch

    n_params = sum(p.numel() for p in ours.model.parameters())
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = int(our_batch["attention_mask"].sum())
    device = str(ours.args.device) + (
        f" ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else ""
    )
    print(
        f"model: Qwen3 {args.layers} layers x {args.hidden}, {n_params / 1e6:.2f}M params, vocab {len(tok)}; batch: "
        f"{args.pairs} pairs x 2 sides, {our_batch['input_ids'].shape[1]} padded length, {tokens} tokens; "
        f"device {device}, bf16 {args.bf16}, torch threads {torch.get_num_threads()}"
    )
    diff = max(abs(a - b) for a, b in zip(losses["stock"], losses["ours"], strict=True))
    print(
        f"loss: step 1 stock {losses['stock'][0]:.8f} ours {losses['ours'][0]:.8f}; step {len(losses['ours'])} "
        f"stock {losses['stock'][-1]:.8f} ours {losses['ours'][-1]:.8f}; max |diff| over all steps {diff:.2e}"
    )
    print(
        f"step time (median of {args.steps}, forward+backward+AdamW): stock {med['stock'] * 1e3:.1f} ms  "
        f"ours {med['ours'] * 1e3:.1f} ms  ratio ours/stock {med['ours'] / med['stock']:.3f}"
    )


# --- round mode -----------------------------------------------------------------------------------------

MODES = ("stock", "none", "pair", "none-bp", "branch")
BY_BRANCH_POINT = ("none-bp", "branch")  # one micro-batch per branch point; the others one per pair
# the loss each mode must reproduce: ours unpacked on the same micro-batches (the sft term averages
# over a micro-batch's tokens, so the batching, not the packing, decides its value)
SAME_BATCHES = {"stock": "none", "none": "none", "pair": "none", "none-bp": "none-bp", "branch": "none-bp"}


def _round_inputs(args):
    """(train config, tokenizer, fitted examples, shard paths) of the round, as its train stage builds them."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from selskill.data.shards import read_shards
    from selskill.train.pairs import build_from_config
    from selskill.train.run import parse

    shards = sorted((Path(args.round) / "label" / "shards").glob("*.parquet"))
    if not shards:
        raise FileNotFoundError(
            f"no label shards under {args.round}/label/shards: --round takes a round directory (runs/<exp>/round_<r>)"
        )
    _, _, cfg = parse(["--config", args.recipe, "--report_to", "none", "--bf16", "false"])
    tok = AutoTokenizer.from_pretrained(args.policy)
    examples, stats = build_from_config(read_shards(shards, "pair"), cfg, tok)
    print(stats.report())
    return cfg, tok, examples, shards


def _round_trainers(args, cfg, tok, examples, out_dir):
    import copy

    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import DPOTrainer

    from selskill.train.pairs import examples_to_dataset
    from selskill.train.trainer import SelSkillDPOTrainer

    def model():
        return AutoModelForCausalLM.from_pretrained(args.policy)

    trainers = {}
    for mode in MODES:
        conf = copy.deepcopy(cfg)
        conf.output_dir = f"{out_dir}/{mode}"
        conf.train_prefix_sharing = mode if mode in ("pair", "branch") else "none"
        conf.precompute_ref_log_probs = False
        conf.disable_tqdm, conf.save_strategy = True, "no"
        if mode == "stock":  # TRL's own collator and preparation (a text dataset: _synthetic_trainers)
            text = Dataset.from_dict(
                {"prompt": ["a task"] * 2, "chosen": [" good"] * 2, "rejected": [" bad"] * 2}
            )
            trainers[mode] = DPOTrainer(
                model(), ref_model=model(), args=conf, train_dataset=text, processing_class=tok
            )
        else:
            trainers[mode] = SelSkillDPOTrainer(
                model(),
                ref_model=model(),
                args=conf,
                train_dataset=examples_to_dataset(examples),
                processing_class=tok,
            )
    return trainers


def _micro_batches(trainer, mode, pairs):
    """Collated micro-batches of one step: one per pair, or the whole branch point for `branch`."""
    groups = [pairs] if mode in BY_BRANCH_POINT else [[p] for p in pairs]
    if mode == "stock":
        keys = ("prompt_ids", "chosen_ids", "rejected_ids")
        return [trainer.data_collator([{k: p[k] for k in keys} for p in g]) for g in groups]
    return [trainer.data_collator(g) for g in groups]


def _tokens(batch) -> int:
    from selskill.train.prefix_sharing import packed_tokens

    return packed_tokens(batch) if "packed_segments" in batch else int(batch["input_ids"].numel())


def _round_step(trainer, batches, weights):
    if trainer.optimizer is None:
        trainer.create_optimizer()
    trainer.model.train()
    start = time.perf_counter()
    total = 0.0
    for batch, weight in zip(batches, weights, strict=True):
        batch = {k: v.to(trainer.args.device) for k, v in batch.items()}
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(trainer.model, batch)
        (loss * weight).backward()
        total += loss.item() * weight
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    _sync()
    return time.perf_counter() - start, total


def round_bench(args) -> int:
    import torch

    from selskill.train.prefix_sharing import prompt_groups

    torch.manual_seed(args.seed)
    load = os.getloadavg()
    cfg, tok, examples, shards = _round_inputs(args)
    out_dir = tempfile.TemporaryDirectory(prefix="bench_dpo_round_")
    trainers = _round_trainers(args, cfg, tok, examples, out_dir.name)
    # a local pair branching at the first turn has its task's episode prompt: kept apart, so that
    # every row of the table holds one kind only (training would share that prompt too)
    groups = prompt_groups([[e["kind"] == "local", *e["prompt_ids"]] for e in examples])
    groups.sort(key=lambda g: examples[g[0]]["kind"] != "local")  # local branch points first
    rows = {
        mode: {"local": [0, 0.0, []], "episode": [0, 0.0, []]} for mode in MODES
    }  # tokens, seconds, losses
    for step, group in enumerate(groups):
        pairs = [examples[i] for i in group]
        kind = pairs[0]["kind"]
        order = MODES[step % len(MODES) :] + MODES[: step % len(MODES)]
        for mode in order:
            batches = _micro_batches(trainers[mode], mode, pairs)
            weights = [1.0] if mode in BY_BRANCH_POINT else [1 / len(pairs)] * len(pairs)
            seconds, loss = _round_step(trainers[mode], batches, weights)
            row = rows[mode][kind]
            row[0] += sum(_tokens(b) for b in batches)
            row[1] += seconds
            row[2].append(loss)
    n_local = sum(e["kind"] == "local" for e in examples)
    print(
        f"\nround {args.round}: {len(examples)} pairs ({n_local} local) at {len(groups)} prompts (per kind); policy "
        f"{args.policy}; recipe {args.recipe} (window n={cfg.train_window_n}, loss {'+'.join(cfg.loss_type)}); "
        f"torch threads {torch.get_num_threads()}; load average at start {load[0]:.2f}, now {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'pairs':9} {'mode':7} {'tokens':>9} {'seconds':>9} {'vs stock':>9} {'mean loss':>11} {'max |loss - unpacked|':>22}"
    )
    for label, kinds in (("local", ["local"]), ("episode", ["episode"]), ("all", ["local", "episode"])):
        stock_s = sum(rows["stock"][k][1] for k in kinds)
        for mode in MODES:
            tokens = sum(rows[mode][k][0] for k in kinds)
            seconds = sum(rows[mode][k][1] for k in kinds)
            losses = [x for k in kinds for x in rows[mode][k][2]]
            if not losses:
                continue
            same = [x for k in kinds for x in rows[SAME_BATCHES[mode]][k][2]]
            diff = max(abs(a - b) for a, b in zip(losses, same, strict=True))
            print(
                f"{label:9} {mode:7} {tokens:9d} {seconds:9.2f} {stock_s / seconds:8.2f}x "
                f"{sum(losses) / len(losses):11.6f} {diff:22.2e}"
            )
    if args.train_stage:
        train_stage_times(args, shards)
    return 0


def train_stage_times(args, shards) -> None:
    """The whole train stage (selskill.train.run on the recipe) once per prefix-sharing mode."""
    import json
    import shutil
    from pathlib import Path

    from selskill.train.run import parse
    from selskill.train.stage import run_train

    os.environ["TQDM_DISABLE"] = "1"  # TRL's reference precompute bar
    root = Path(tempfile.mkdtemp(prefix="bench_dpo_stage_"))
    print("\ntrain stage (recipe as is, wall seconds incl. loading, reference precompute, saving):")
    variants = [("none", []), ("pair", []), ("branch", []),
                ("branch", ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1"])]  # fmt: skip
    for mode, extra in variants:
        exp = f"{mode}{'-b4' if extra else ''}"
        label = root / exp / "round_1" / "label" / "shards"
        label.mkdir(parents=True)
        for p in shards:
            shutil.copy(p, label / p.name)
        argv = ["--config", args.recipe, "--runs_dir", str(root), "--exp", exp, "--round", "1",
                "--model_name_or_path", args.policy, "--train_prefix_sharing", mode, "--report_to", "none",
                "--save_strategy", "no", "--disable_tqdm", "true", "--logging_steps", "100000", *extra]  # fmt: skip
        start = time.perf_counter()
        run_train(*parse(argv))
        wall = time.perf_counter() - start
        done = json.loads((root / exp / "round_1" / "train" / "COMPLETED").read_text())
        print(
            f"  {exp:9} {wall:8.1f} s wall, {done['seconds']:8.1f} s trainer, {done['global_step']} steps, "
            f"train_loss {done['train_loss']:.6f}, load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
    shutil.rmtree(root, ignore_errors=True)
