"""Shared-prefix DPO gives the unpacked trainer's loss, gradients, reference log-probs and metrics.

The pairs are real: tests/data/round_pairs.parquet holds 11 rows of a mini-recipe round-1 label
stage (2 + 2 forks): an episode group of 3 pairs sharing the task prompt and the chosen
trajectory, two local branch points with 2 pairs each, and single local pairs, some with
prompts long enough for the max_length policy to shorten. The models are tiny (2 layers,
hidden 64) with that round's vocabulary; the reference is another seed, so nothing is
trivially log 2. Exactness is relative to the unpacked trainer in fp32 on the CPU (1e-5).
"""

from pathlib import Path

import pytest
import torch
from train_helpers import micro_tokenizer

from selskill.config.train import TrainConfig
from selskill.data.shards import read_shards
from selskill.train import prefix_sharing
from selskill.train.pairs import TOKEN_COLUMNS, FitPolicy, build_examples, examples_to_dataset
from selskill.train.trainer import SelSkillDPOTrainer

PAIRS = Path(__file__).parent / "data" / "round_pairs.parquet"
VOCAB = 1380  # the round's tokenizer
MESSAGE_START = 1  # its <|im_start|>
TOL = 1e-5


@pytest.fixture(scope="module")
def tok():
    return micro_tokenizer()


@pytest.fixture(scope="module")
def table():
    return read_shards([PAIRS], "pair")


@pytest.fixture(scope="module")
def unpacked(tok, tmp_path_factory):
    """The unpacked trainer's step on a batch, computed once per batch and model."""
    cache = {}

    def get(examples, model_type="qwen3", attn="sdpa"):
        key = (str([[e[c] for c in TOKEN_COLUMNS] for e in examples]), model_type, attn)
        if key not in cache:
            trainer = _trainer(tok, examples, tmp_path_factory.mktemp("none"), "none", model_type, attn)
            cache[key] = _step(trainer, examples)
        return cache[key]

    return get


def _model(model_type="qwen3", seed=0, attn="sdpa"):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type,
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=0,
    )
    config._attn_implementation = attn
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config)


def _trainer(tok, examples, tmp_path, mode, model_type="qwen3", attn="sdpa", **kw):
    kw.setdefault("per_device_train_batch_size", len(examples))
    args = TrainConfig(
        output_dir=str(tmp_path / f"out-{mode}-{attn}"),
        bf16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        max_length=None,
        loss_type=["sigmoid", "sft"],  # the recipes' loss: the sft term reads per-token log-probs
        train_prefix_sharing=mode,
        **kw,
    )
    return SelSkillDPOTrainer(
        _model(model_type, 0, attn),
        ref_model=_model(model_type, 1, attn),
        args=args,
        train_dataset=examples_to_dataset(examples),
        processing_class=tok,
    )


def _step(trainer, examples, grad=True):
    """(loss, flat gradient, per-row policy and reference log-probs, metrics) of one batch."""
    captured = {"policy": [], "ref": []}
    hooks = [
        trainer.model.register_forward_hook(lambda m, a, o: captured["policy"].append(o.log_probs.sum(1))),
        trainer.ref_model.register_forward_hook(lambda m, a, o: captured["ref"].append(o.log_probs.sum(1))),
    ]
    batch = trainer.data_collator(examples)
    trainer.model.train()
    trainer.model.zero_grad()
    try:
        with torch.set_grad_enabled(grad):
            loss = trainer.compute_loss(trainer.model, dict(batch))
            if grad:
                loss.backward()
    finally:
        for h in hooks:
            h.remove()
    flat = torch.cat([p.grad.flatten() for p in trainer.model.parameters()]) if grad else None
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    trainer._metrics["train"].clear()
    return loss.detach(), flat, captured["policy"][0].detach(), captured["ref"][0].detach(), metrics, batch


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def _assert_same(packed, unpacked):
    loss, grad, logps, ref, metrics, _ = packed
    loss0, grad0, logps0, ref0, metrics0, _ = unpacked
    assert _rel(loss, loss0) <= TOL, (loss, loss0)
    if grad is not None:
        assert _rel(grad, grad0) <= TOL
    assert _rel(logps, logps0) <= TOL and _rel(ref, ref0) <= TOL
    assert set(metrics) == set(metrics0)
    for name, value in metrics0.items():
        if name == "num_tokens":
            assert metrics[name] == value  # the unpacked batch's tokens, as before
        else:
            assert metrics[name] == pytest.approx(value, rel=TOL, abs=TOL), name


def _examples(table, n, max_length=None):
    policy = FitPolicy(max_length=max_length, message_start_id=MESSAGE_START)
    examples, stats = build_examples(table, n=n, policy=policy)
    return examples, stats


@pytest.mark.parametrize("mode", ["pair", "branch"])
@pytest.mark.parametrize("n", [1, 3, None], ids=["n=1", "n=3", "n=all"])
def test_packed_batch_gives_the_unpacked_loss_gradients_and_metrics(tok, table, tmp_path, unpacked, mode, n):
    examples, stats = _examples(table, n)
    assert stats.trained["episode"] == 3 and stats.trained["local"] == 8
    trainer = _trainer(tok, examples, tmp_path, mode)
    scored = []  # positions that reach the LM head: the trained ones only
    trainer.model.base_model.register_forward_hook(
        lambda m, a, o: scored.append(o.last_hidden_state.shape[1])
    )
    packed = _step(trainer, examples)
    _assert_same(packed, unpacked(examples))
    if mode == "pair":
        assert scored[0] == sum(sum(e["chosen_loss_mask"]) + sum(e["rejected_loss_mask"]) for e in examples)
    batch = packed[-1]
    assert prefix_sharing.packed_tokens(batch) < int(batch["attention_mask"].sum())
    # a tree per pair, or per prompt (the 11 pairs have 7 distinct prompts), side by side in one row
    assert batch["packed_input_ids"].shape[0] == 1 and int(batch["packed_trees"].max()) + 1 == (
        11 if mode == "pair" else 7
    )


def test_prompts_shortened_by_max_length_pack_as_they_were_fitted(tok, table, tmp_path, unpacked):
    examples, stats = _examples(table, 3, max_length=1100)
    assert stats.prompt_truncated["local"] == 7 and stats.trained == {"local": 8}  # episodes do not fit
    # one branch point's two pairs were shortened by different amounts: they no longer share a prompt
    raw = {r["pair_id"]: tuple(r["prompt_ids"]) for r in table.to_pylist()}
    assert (
        len({raw[e["pair_id"]] for e in examples}) == 6
        and len({tuple(e["prompt_ids"]) for e in examples}) == 7
    )
    for mode, trees in (("pair", 8), ("branch", 7)):
        packed = _step(_trainer(tok, examples, tmp_path, mode), examples)
        _assert_same(packed, unpacked(examples))
        assert int(packed[-1]["packed_trees"].max()) + 1 == trees


def test_prompts_of_one_token_and_none(tok, tmp_path, unpacked):
    """Degenerate trees: no prefix left after moving the last prompt token (or none at all)."""
    rows = [
        {"pair_id": f"d{i}", "kind": "local", "prompt_ids": prompt, "chosen_ids": [7, 8, 9, 10], "rejected_ids": [11, 12],
         "chosen_loss_mask": [1, 1, 0, 1], "rejected_loss_mask": [1, 1]}
        for i, prompt in enumerate([[5], [], [5], [3, 4, 5]])
    ]  # fmt: skip
    for mode in ("pair", "branch"):
        _assert_same(_step(_trainer(tok, rows, tmp_path, mode), rows), unpacked(rows))


def test_branch_computes_each_prompt_and_each_continuation_once(table):
    examples, _ = _examples(table, 3)
    episode = [e for e in examples if e["kind"] == "episode"]
    assert (
        len({tuple(e["prompt_ids"]) for e in episode}) == 1
        and len({tuple(e["chosen_ids"]) for e in episode}) == 1
    )
    width = 2 * max(len(e["prompt_ids"]) + len(e[s]) for e in episode for s in ("chosen_ids", "rejected_ids"))
    branch = prefix_sharing.pack_pairs(episode, "branch", width)
    pair = prefix_sharing.pack_pairs(episode, "pair", width)
    p = len(episode[0]["prompt_ids"])
    continuations = [episode[0]["chosen_ids"]] + [e["rejected_ids"] for e in episode]
    # the prompt once (its last token at the head of each continuation), each continuation once
    assert prefix_sharing.packed_tokens(branch) == p - 1 + sum(len(c) + 1 for c in continuations)
    assert prefix_sharing.packed_tokens(pair) == sum(
        p + len(e["chosen_ids"]) + len(e["rejected_ids"]) + 1 for e in episode
    )
    # a continuation's positions continue from the prompt, whichever continuation precedes it
    seg, pos = branch["packed_segments"][0], branch["packed_position_ids"][0]
    for k in range(1, 5):
        assert pos[seg == k].tolist() == list(range(p - 1, p - 1 + int((seg == k).sum())))


def test_padding_rows_and_trees_of_several_lengths(tok, table, tmp_path, unpacked):
    """Batches of one, two and five pairs: the unpacked rows are padded, the packed trees lie side by side."""
    examples, _ = _examples(table, 3)
    for chunk in (examples[:1], examples[3:5], examples[6:]):
        _assert_same(_step(_trainer(tok, chunk, tmp_path, "branch"), chunk), unpacked(chunk))


def test_precomputed_reference_log_probs_are_the_unpacked_ones(tok, table, tmp_path):
    examples, _ = _examples(table, 3)
    cols = {}
    for mode in ("none", "pair", "branch"):
        trainer = _trainer(tok, examples, tmp_path / mode, mode, precompute_ref_log_probs=True,
                           precompute_ref_batch_size=4)  # fmt: skip
        cols[mode] = torch.tensor(
            [trainer.train_dataset["ref_chosen_logps"], trainer.train_dataset["ref_rejected_logps"]]
        )
    assert _rel(cols["pair"], cols["none"]) <= TOL and _rel(cols["branch"], cols["none"]) <= TOL


def test_gradient_checkpointing_replays_the_tree_attention(tok, table, tmp_path, unpacked):
    examples, _ = _examples(table, 3)
    chunk = examples[3:5]
    packed = _step(_trainer(tok, chunk, tmp_path, "branch", gradient_checkpointing=True), chunk)
    _assert_same(packed, unpacked(chunk))


@pytest.mark.parametrize("model_type,attn", [("qwen3", "eager"), ("qwen2", "sdpa"), ("llama", "sdpa")])
def test_other_attentions_and_model_types(tok, table, tmp_path, unpacked, model_type, attn):
    examples, _ = _examples(table, 3)
    chunk = examples[3:5]  # two pairs of one branch point
    packed = _step(_trainer(tok, chunk, tmp_path, "branch", model_type, attn), chunk)
    _assert_same(packed, unpacked(chunk, model_type, attn))


def test_grouped_kv_copied_to_every_head_where_torch_needs_it(tok, table, tmp_path, unpacked, monkeypatch):
    """Off the CPU, K/V are repeated per head before a masked SDPA call (transformers' own rule)."""
    monkeypatch.setattr(prefix_sharing, "_native_gqa", lambda device: False)
    examples, _ = _examples(table, 3)
    chunk = examples[3:5]
    _assert_same(_step(_trainer(tok, chunk, tmp_path, "branch"), chunk), unpacked(chunk))


@pytest.mark.slow
def test_flex_attention_block_mask_gives_the_same_log_probs(tok, table, tmp_path, unpacked):
    """Forward only: torch's FlexAttention has no backward on the CPU (a GPU runs the gradient)."""
    examples, _ = _examples(table, 3)
    chunk = examples[:5]
    packed = _step(_trainer(tok, chunk, tmp_path, "branch", attn="flex_attention"), chunk, grad=False)
    _assert_same(packed, unpacked(chunk))


def test_models_that_take_no_tree_mask_are_refused_with_the_fix(tok, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    rows = [{"pair_id": "p", "kind": "local", "prompt_ids": [1, 5, 6], "chosen_ids": [7, 8], "rejected_ids": [9],
             "chosen_loss_mask": [1, 1], "rejected_loss_mask": [1]}]  # fmt: skip
    args = TrainConfig(output_dir=str(tmp_path), bf16=False, report_to="none", max_length=None)

    def gpt2():
        return GPT2LMHeadModel(
            GPT2Config(vocab_size=VOCAB, n_layer=1, n_embd=32, n_head=2, bos_token_id=2, eos_token_id=2)
        )

    data = examples_to_dataset(rows)
    with pytest.raises(
        ValueError,
        match=r"model types qwen3, qwen2, llama; this policy is 'gpt2'.*train_prefix_sharing: none",
    ):
        SelSkillDPOTrainer(gpt2(), ref_model=gpt2(), args=args, train_dataset=data, processing_class=tok)
    sliding = _model()
    sliding.config.use_sliding_window, sliding.config.sliding_window = True, 16
    with pytest.raises(ValueError, match="needs full attention in every layer"):
        prefix_sharing.check_model(sliding, "pair")
    flash = _model()
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(
        ValueError, match="load it with attn_implementation sdpa .* or set train_prefix_sharing: none"
    ):
        prefix_sharing.check_model(flash, "pair")
    none = TrainConfig(output_dir=str(tmp_path), bf16=False, report_to="none", max_length=None,
                       train_prefix_sharing="none")  # fmt: skip
    SelSkillDPOTrainer(gpt2(), ref_model=gpt2(), args=none, train_dataset=data, processing_class=tok)
    with pytest.raises(ValueError, match="train_prefix_sharing must be one of none, pair, branch"):
        TrainConfig(output_dir=str(tmp_path), bf16=False, report_to="none", train_prefix_sharing="tree")


def test_branch_point_sampler_keeps_a_branch_point_together_in_a_seeded_order():
    groups = prefix_sharing.prompt_groups([[1, 2], [3], [1, 2], [4], [3], [1, 2]])
    assert groups == [[0, 2, 5], [1, 4], [3]]
    sampler = prefix_sharing.BranchPointSampler(groups, seed=7)
    orders = []
    for epoch in range(6):
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert sorted(order) == list(range(6)) and len(sampler) == 6
        starts = [order.index(g[0]) for g in groups]
        for g, s in zip(groups, starts, strict=True):
            assert order[s : s + len(g)] == g  # contiguous, in dataset order
        orders.append(order)
    assert len({tuple(o) for o in orders}) > 1  # the branch points are reshuffled each epoch
    again = prefix_sharing.BranchPointSampler(groups, seed=7)
    again.set_epoch(3)
    assert list(again) == orders[3]


def test_branch_training_batches_follow_the_branch_points(tok, table, tmp_path):
    examples, _ = _examples(table, 3)
    trainer = _trainer(tok, examples, tmp_path, "branch", per_device_train_batch_size=3)
    assert isinstance(trainer._get_train_sampler(), prefix_sharing.BranchPointSampler)
    order = [i for batch in trainer.get_train_dataloader().batch_sampler for i in batch]
    prompts = [tuple(examples[i]["prompt_ids"]) for i in order]
    runs = [p for k, p in enumerate(prompts) if k == 0 or p != prompts[k - 1]]
    assert sorted(order) == list(range(len(examples))) and len(runs) == len(set(prompts)) == 7
