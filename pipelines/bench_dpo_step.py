"""Benchmark: one DPO step with SelSkillDPOTrainer vs stock trl.DPOTrainer on the same batch.

Both trainers get the same tokenized batch, with our loss mask equal to the plain completion
mask (1 on every completion token), the same freshly built model and the same reference. The
reference differs from the policy (another seed), so the loss is not trivially log 2. The
step is forward + backward + optimizer step; steps alternate between the two trainers so a busy
neighbour slows both alike. Prints both loss trajectories (they must agree) and the time ratio (ours / stock).

    OMP_NUM_THREADS=1 python pipelines/bench_dpo_step.py [--pairs 4 --prompt 384 --completion 256 --steps 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=4, help="pairs per batch (default 4)")
    p.add_argument("--prompt", type=int, default=384, help="prompt tokens per pair (default 384)")
    p.add_argument("--completion", type=int, default=256, help="completion tokens per side (default 256)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per trainer (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per trainer first (default 3)")
    p.add_argument(
        "--hidden", type=int, default=256, help="hidden size (default 256: the offline tiny policy)"
    )
    p.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision (GPU)")
    p.add_argument("--seed", type=int, default=0)
    return p


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


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "disabled")
    import numpy as np
    import torch
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from selskill.policy.bootstrap import TinyArch, build_model, train_tokenizer
    from selskill.train.pairs import examples_to_dataset
    from selskill.train.trainer import SelSkillDPOTrainer

    torch.manual_seed(args.seed)
    corpus = [
        "You are an agent solving a task in a text-based household environment.",
        "Your task is to: put a hot apple in fridge. <action>go to countertop 1</action>",
        "On the countertop 1, you see a apple 1, a knife 2, and a mug 3. You heat the apple 1.",
    ]
    tok = train_tokenizer(corpus * 20, vocab_size=554)
    rows = _batch_rows(len(tok), args, np.random.default_rng(args.seed))
    heads = max(args.hidden // 64, 1)
    arch = TinyArch(
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1),
        head_dim=64,
    )
    out = tempfile.mkdtemp(prefix="bench_dpo_")
    cfg = dict(
        output_dir=out,
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
    stock_batch = stock.data_collator(
        [{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in rows]
    )
    our_batch = ours.data_collator(rows)
    for key in ("input_ids", "attention_mask", "completion_mask"):
        assert torch.equal(stock_batch[key], our_batch[key]), f"batches differ in {key}"
    n_params = sum(p.numel() for p in ours.model.parameters())

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def step(trainer, batch):
        if trainer.optimizer is None:
            trainer.create_optimizer()
            trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train() otherwise
        sync()
        start = time.perf_counter()
        loss = trainer.training_step(trainer.model, dict(batch))
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - start, loss.item()

    losses = {"stock": [], "ours": []}
    times = {"stock": [], "ours": []}
    for i in range(args.warmup + args.steps):
        for name, trainer, batch in (("stock", stock, stock_batch), ("ours", ours, our_batch))[
            :: 1 if i % 2 else -1
        ]:
            dt, loss = step(trainer, batch)
            losses[name].append(loss)
            if i >= args.warmup:
                times[name].append(dt)

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
    return 0


if __name__ == "__main__":
    from selskill.errors import run_main

    sys.exit(run_main(main))
