"""SelSkillDPOTrainer: the loss mask reaches TRL's loss exactly; short runs train; the stage contract.

Models are tiny (2 layers, hidden 64) and built offline; the reference is built with another
seed so that losses and log-prob ratios are not trivially log 2 / 0.
"""

import hashlib
import inspect
import json
import math
import re
from pathlib import Path

import pytest
import torch
from train_helpers import (
    BAD,
    GOOD,
    SYSTEM,
    TASK,
    fixture_rows,
    micro_model,
    micro_tokenizer,
    pair_row,
    write_label_stage,
)

from selskill.config.train import TrainConfig
from selskill.train.pairs import examples_to_dataset, loss_mask
from selskill.train.trainer import OVERRIDDEN_HOOKS, TRL_VERSION, SelSkillDPOTrainer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok():
    return micro_tokenizer()


def _args(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        learning_rate=1e-3,
        max_steps=4,
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        max_length=None,
    )
    base.update(kw)
    return TrainConfig(**base)


def _trainer(tok, examples, tmp_path, **kw):
    return SelSkillDPOTrainer(
        micro_model(tok, seed=0),
        ref_model=micro_model(tok, seed=1),
        args=_args(tmp_path, **kw),
        train_dataset=examples_to_dataset(examples),
        processing_class=tok,
    )


def _local_example(tok, n=1, pair_id="m0"):
    """A local pair whose n=1 window leaves observations, a skill return and later turns outside the mask."""
    row = pair_row(tok, pair_id, "local", [SYSTEM, TASK], GOOD, BAD)
    return {
        "pair_id": pair_id,
        "kind": "local",
        "prompt_ids": row["prompt_ids"],
        "chosen_ids": row["chosen_ids"],
        "rejected_ids": row["rejected_ids"],
        "chosen_loss_mask": loss_mask(row["chosen_role"], row["chosen_turn"], "local", n).tolist(),
        "rejected_loss_mask": loss_mask(row["rejected_role"], row["rejected_turn"], "local", n).tolist(),
    }


class _Capture:
    """Per-sequence summed log-probs of every fused forward of a module."""

    def __init__(self, module):
        self.logps = []
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        if getattr(output, "log_probs", None) is not None:
            self.logps.append(output.log_probs.detach().sum(1).clone())


def _on_device(trainer, batch):
    return {k: v.to(trainer.args.device) for k, v in batch.items()}


def _loss_and_logps(trainer, examples):
    batch = _on_device(trainer, trainer.data_collator(examples))
    pol, ref = _Capture(trainer.model), _Capture(trainer.ref_model)
    try:
        with torch.no_grad():
            loss = trainer.compute_loss(trainer.model, dict(batch))
    finally:
        pol.handle.remove()
        ref.handle.remove()
    return loss, pol.logps[0], ref.logps[0]


# --- the contract with trl ------------------------------------------------------------------------------

# sha256[:16] of inspect.getsource() of every trl hook the trainer overrides or relies on, in trl 1.16.0.
TRL_SOURCES = {
    "DPOTrainer._prepare_dataset": "35e349e8e8266df4",  # overridden: pass pre-tokenized rows through
    "DPOTrainer._set_signature_columns_if_needed": "71225a628baed4cb",  # extended: keep mask + kind columns
    "DPOTrainer.compute_ref_log_probs": "90611af9cbadb8ec",  # wrapped: drop pair_kind before the forward
    "DPOTrainer.compute_loss": "c453890e84beb4cb",  # wrapped: pop pair_kind, per-kind metrics
    "DPOTrainer._compute_loss": "5e58a1699e0d76cd",  # relied on: labels/log-probs from completion_mask
    "DPOTrainer._precompute_ref_logps": "f2c098c7da6ca701",  # relied on: uses self.data_collator, cache by path
    "DataCollatorForPreference.torch_call": "0b8bb4c294bf8420",  # mirrored by MaskedPreferenceCollator
    "DPOTrainer._get_train_sampler": "1580d7493244e637",  # overridden for branch: rows by branch point
    # relied on by prefix_sharing: the fused forward takes pre-shifted `shift_labels` and the 4D mask as given
    "utils.add_fused_lm_head": "422d009f04b66659",
}


def test_trl_contract():
    import trl
    from trl import DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    pin = re.search(r"^trl==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)
    assert trl.__version__ == pin == TRL_VERSION, (
        f"trl {trl.__version__} is installed, constraints.txt pins {pin}, selskill.train.trainer was checked against "
        f"{TRL_VERSION}: install the pinned trl, or re-verify the trainer against the new one and update all three"
    )
    overridden = {n for n in vars(SelSkillDPOTrainer) if hasattr(DPOTrainer, n) and not n.startswith("__")}
    assert overridden == set(OVERRIDDEN_HOOKS), "list every overridden DPOTrainer method in OVERRIDDEN_HOOKS"
    assert {f"DPOTrainer.{n}" for n in OVERRIDDEN_HOOKS} <= set(TRL_SOURCES)
    from trl.trainer import utils

    owners = {
        "DPOTrainer": DPOTrainer,
        "DataCollatorForPreference": DataCollatorForPreference,
        "utils": utils,
    }
    changed = []
    for qualname, expected in TRL_SOURCES.items():
        owner, name = qualname.split(".")
        src = inspect.getsource(getattr(owners[owner], name))
        if hashlib.sha256(src.encode()).hexdigest()[:16] != expected:
            changed.append(qualname)
    assert not changed, (
        f"trl changed {changed} since {TRL_VERSION}: selskill/train/trainer.py overrides or relies on them (see the "
        f"comments in TRL_SOURCES). Re-check what each assumes, then update the hashes in this test."
    )
    # what the overrides assume, stated as behaviour: labels come from completion_mask; only these keys are not
    # passed to the model; the collator's fields are the ones MaskedPreferenceCollator inherits
    src = inspect.getsource(DPOTrainer._compute_loss)
    assert 'labels = inputs["input_ids"].masked_fill(completion_mask == 0, -100)' in src
    assert '_non_model_keys = {"completion_mask", "ref_chosen_logps", "ref_rejected_logps"}' in src
    assert "collate_fn=self.data_collator" in inspect.getsource(DPOTrainer._precompute_ref_logps)
    sig = inspect.signature(DPOTrainer._prepare_dataset)
    assert list(sig.parameters) == ["self", "dataset", "processing_class", "args", "dataset_name"]


# --- the mask, exactly --------------------------------------------------------------------------------


def test_masked_out_positions_get_exactly_zero_gradient(tok, tmp_path):
    ex = _local_example(tok, n=1)
    # the unpacked rows' hidden states are read below (packed rows: tests/test_train_prefix_sharing.py)
    trainer = _trainer(tok, [ex], tmp_path, train_prefix_sharing="none")
    batch = _on_device(trainer, trainer.data_collator([ex]))
    mask = batch["completion_mask"].cpu()
    grabbed = {}

    def keep(name):
        def hook(module, args, output):
            if output.requires_grad:
                output.retain_grad()
                grabbed[name] = output

        return hook

    backbone = trainer.model.model
    handles = [
        backbone.norm.register_forward_hook(keep("hidden")),
        backbone.embed_tokens.register_forward_hook(keep("embed")),
    ]
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, dict(batch))
    loss.backward()
    for h in handles:
        h.remove()
    # final hidden state at t predicts token t+1: exactly zero gradient wherever token t+1 is not trained
    hidden_grad = grabbed["hidden"].grad.abs().sum(-1)[:, :-1].cpu()
    predicts_masked = mask[:, 1:] == 0
    assert predicts_masked.any() and (~predicts_masked).sum() >= 4
    assert torch.all(hidden_grad[predicts_masked] == 0)
    assert torch.all(hidden_grad[~predicts_masked] > 0)
    # tokens after the last trained token (later turns, observations, skill returns) get no gradient at all
    embed_grad = grabbed["embed"].grad.abs().sum(-1).cpu()
    for row in range(mask.shape[0]):
        last = int(mask[row].nonzero().max())
        assert torch.all(embed_grad[row, last + 1 :] == 0)
        assert embed_grad[row, :last].sum() > 0
    # and the trainable parameters do get a gradient
    assert trainer.model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_changing_tokens_outside_the_mask_changes_nothing_and_inside_it_does(tok, tmp_path):
    ex = _local_example(tok, n=1)
    trainer = _trainer(tok, [ex], tmp_path)
    loss, logps, ref_logps = _loss_and_logps(trainer, [ex])
    assert 0 < loss.item() and abs(loss.item() - math.log(2)) > 1e-4  # policy != reference

    c_last = max(i for i, m in enumerate(ex["chosen_loss_mask"]) if m)
    r_last = max(i for i, m in enumerate(ex["rejected_loss_mask"]) if m)
    assert len(ex["chosen_ids"]) - c_last > 20  # later turns, observations and a skill return follow
    other = tok.convert_tokens_to_ids("<action>")
    outside = dict(ex)
    outside["chosen_ids"] = ex["chosen_ids"][: c_last + 1] + [other] * (len(ex["chosen_ids"]) - c_last - 1)
    outside["rejected_ids"] = ex["rejected_ids"][: r_last + 1] + [other] * (
        len(ex["rejected_ids"]) - r_last - 1
    )
    loss2, logps2, ref_logps2 = _loss_and_logps(trainer, [outside])
    assert torch.equal(loss, loss2) and torch.equal(logps, logps2) and torch.equal(ref_logps, ref_logps2)

    inside = dict(ex)
    inside["chosen_ids"] = list(ex["chosen_ids"])
    first_trained = ex["chosen_loss_mask"].index(1)
    inside["chosen_ids"][first_trained + 1] = other
    loss3, logps3, ref_logps3 = _loss_and_logps(trainer, [inside])
    assert loss3 != loss and logps3[0] != logps[0] and ref_logps3[0] != ref_logps[0]
    assert logps3[1] == logps[1]  # the rejected side did not change


def test_window_n_changes_what_is_trained(tok, tmp_path):
    ex1, ex3 = _local_example(tok, n=1), _local_example(tok, n=3)
    assert sum(ex3["chosen_loss_mask"]) > sum(ex1["chosen_loss_mask"])
    trainer = _trainer(tok, [ex1], tmp_path)
    _, logps1, _ = _loss_and_logps(trainer, [ex1])
    _, logps3, _ = _loss_and_logps(trainer, [ex3])
    assert torch.all(logps3 < logps1)  # more tokens in the window, more (negative) log-prob mass


def test_same_loss_as_stock_dpo_trainer_with_a_plain_completion_mask(tok, tmp_path):
    from datasets import Dataset
    from trl import DPOTrainer

    rows = [_local_example(tok, pair_id=f"s{i}") for i in range(2)]
    for r in rows:
        r["chosen_loss_mask"] = [1] * len(r["chosen_ids"])
        r["rejected_loss_mask"] = [1] * len(r["rejected_ids"])
    ours = _trainer(tok, rows, tmp_path)
    text = Dataset.from_dict({"prompt": ["a"], "chosen": [" b"], "rejected": [" c"]})
    stock = DPOTrainer(
        micro_model(tok, seed=0),
        ref_model=micro_model(tok, seed=1),
        args=_args(tmp_path),
        train_dataset=text,
        processing_class=tok,
    )
    stock_batch = stock.data_collator(
        [{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in rows]
    )
    our_batch = ours.data_collator(rows)
    for key in ("input_ids", "attention_mask", "completion_mask"):
        assert torch.equal(stock_batch[key], our_batch[key])
    with torch.no_grad():
        ls = stock.compute_loss(stock.model, _on_device(stock, stock_batch))
        lo = ours.compute_loss(ours.model, _on_device(ours, our_batch))
    torch.testing.assert_close(ls, lo, rtol=1e-4, atol=1e-6)  # the last bits may differ between CPUs
    assert ours._metrics["train"]["rewards/margins"] == pytest.approx(
        stock._metrics["train"]["rewards/margins"], rel=1e-3
    )


def test_metrics_are_split_by_pair_kind(tok, tmp_path):
    local = _local_example(tok, n=3, pair_id="k0")
    episode = {**_local_example(tok, n=3, pair_id="k1"), "kind": "episode"}
    episode["chosen_loss_mask"] = [int(m) for m in episode["chosen_loss_mask"]]
    trainer = _trainer(tok, [local, episode], tmp_path)
    with torch.no_grad():
        loss = trainer.compute_loss(
            trainer.model, _on_device(trainer, trainer.data_collator([local, episode]))
        )
    m = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    assert {"episode/loss", "local/loss", "episode/rewards/margins", "local/rewards/accuracies"} <= set(m)
    assert (m["episode/loss"] + m["local/loss"]) / 2 == pytest.approx(loss.item(), abs=1e-6)
    for name in ("rewards/margins", "rewards/chosen", "rewards/accuracies"):
        assert (m[f"episode/{name}"] + m[f"local/{name}"]) / 2 == pytest.approx(m[name], abs=1e-6)
    trainer._metrics["train"].clear()
    with torch.no_grad():
        trainer.compute_loss(trainer.model, _on_device(trainer, trainer.data_collator([local])))
    assert not any(k.startswith("episode/") for k in trainer._metrics["train"])  # no pair of that kind


def test_precomputed_reference_gives_the_same_loss(tok, tmp_path):
    rows = [_local_example(tok, n=3, pair_id=f"r{i}") for i in range(2)]
    live = _trainer(tok, rows, tmp_path / "a")
    pre = _trainer(tok, rows, tmp_path / "b", precompute_ref_log_probs=True)
    assert "ref_chosen_logps" in pre.train_dataset.column_names
    batch = [dict(r) for r in pre.train_dataset]
    with torch.no_grad():
        a = live.compute_loss(live.model, _on_device(live, live.data_collator(rows)))
        b = pre.compute_loss(pre.model, _on_device(pre, pre.data_collator(batch)))
    assert abs(a.item() - b.item()) < 1e-5


def test_rejects_rows_without_loss_masks(tok, tmp_path):
    from datasets import Dataset

    ds = Dataset.from_dict({"prompt_ids": [[1]], "chosen_ids": [[2]], "rejected_ids": [[3]]})
    with pytest.raises(
        ValueError, match=r"lacks columns \['chosen_loss_mask', 'rejected_loss_mask'\].*build_examples"
    ):
        SelSkillDPOTrainer(micro_model(tok), ref_model=micro_model(tok), args=_args(tmp_path), train_dataset=ds,
                           processing_class=tok)  # fmt: skip


# --- the train stage end to end -----------------------------------------------------------------------


def _setup_run(tok, root: Path, n_pairs=16):
    init = root / "t" / "round_0" / "train" / "model"
    tok.save_pretrained(init)
    micro_model(tok, seed=0).save_pretrained(init)
    rows = fixture_rows(tok, n_pairs)
    half = n_pairs // 2
    write_label_stage(root, "t", 1, [rows[:half], rows[half:]])
    return init


def _argv(root, *extra):
    return [
        "--config", str(ROOT / "recipes" / "tiny.yaml"), "--runs_dir", str(root), "--exp", "t", "--round", "1",
        "--learning_rate", "1e-3", "--logging_steps", "1", "--seed", "0",
        "--loss_type", "sigmoid",  # plain DPO: its loss is log 2 while policy == reference
        *extra,
    ]  # fmt: skip


def test_short_run_lowers_the_loss_changes_parameters_and_resumes(tok, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selskill.train.run import parse
    from selskill.train.stage import run_train

    init = _setup_run(tok, tmp_path)
    train_dir = tmp_path / "t" / "round_1" / "train"
    run_train(*parse(_argv(tmp_path, "--max_steps", "6", "--save_steps", "3")))
    done = json.loads((train_dir / "COMPLETED").read_text())
    assert done["global_step"] == 6 and done["pairs"] == 16 and done["world_size"] == 1
    assert done["first_logged_loss"] == pytest.approx(math.log(2), abs=1e-6)  # policy == reference at start
    assert done["last_logged_loss"] < 0.5 * math.log(2)
    stats = json.loads((train_dir / "pairs_stats.json").read_text())
    assert stats["trained"] == {"episode": 8, "local": 8} and stats["window_n"] == "3"

    trained = AutoModelForCausalLM.from_pretrained(train_dir / "model")
    start = AutoModelForCausalLM.from_pretrained(init)
    diffs = [
        (a - b).abs().max().item() for a, b in zip(trained.parameters(), start.parameters(), strict=True)
    ]
    assert min(diffs) > 0  # every tensor moved
    assert AutoTokenizer.from_pretrained(train_dir / "model").get_vocab() == tok.get_vocab()
    assert (train_dir / "config.yaml").is_file() and (train_dir / "checkpoint-6").is_dir()

    # a complete round is skipped (where and how often it saves is not an input); an interrupted one resumes
    # from its last checkpoint and ends where the uninterrupted run did
    capsys.readouterr()
    run_train(*parse(_argv(tmp_path, "--max_steps", "6", "--save_steps", "2")))
    assert "is complete" in capsys.readouterr().err
    import shutil

    for p in ("COMPLETED", "model", "checkpoint-6"):
        shutil.rmtree(train_dir / p) if (train_dir / p).is_dir() else (train_dir / p).unlink()
    run_train(*parse(_argv(tmp_path, "--max_steps", "6", "--save_steps", "3")))
    out = capsys.readouterr().err
    assert f"resuming from {train_dir / 'checkpoint-3'}" in out
    resumed = json.loads((train_dir / "COMPLETED").read_text())
    assert resumed["global_step"] == 6 and resumed["resumed_at_step"] == 3
    assert resumed["logged_losses"] == pytest.approx(done["logged_losses"], abs=1e-6)
    assert resumed["fingerprint"] == done["fingerprint"]


def test_episode_only_and_local_only_select_their_pairs(tok, tmp_path):
    from selskill.train.run import parse
    from selskill.train.stage import run_train

    _setup_run(tok, tmp_path, n_pairs=4)
    run_train(
        *parse(_argv(tmp_path, "--max_steps", "1", "--train_pair_kinds", "local", "--save_strategy", "no"))
    )
    stats = json.loads((tmp_path / "t" / "round_1" / "train" / "pairs_stats.json").read_text())
    assert stats["trained"] == {"local": 2} and stats["not_selected"] == {"episode": 2}


def test_errors_name_the_missing_input_and_the_fix(tok, tmp_path, capsys):
    from selskill.train.run import parse
    from selskill.train.stage import run_train

    run, policy, cfg = parse(_argv(tmp_path))
    with pytest.raises(
        FileNotFoundError, match=r"no policy at .*round_0/train/model .*build the init policy"
    ):
        run_train(run, policy, cfg)
    init = tmp_path / "t" / "round_0" / "train" / "model"
    tok.save_pretrained(init)
    micro_model(tok).save_pretrained(init)
    with pytest.raises(
        FileNotFoundError, match=r"no pair shards in .*round_1/label/shards: run the label stage"
    ):
        run_train(run, policy, cfg)
    run, policy, cfg = parse(_argv(tmp_path, "--round", "3"))
    with pytest.raises(FileNotFoundError, match=r"no policy at .*round_2/train/model.*finish round 2 first"):
        run_train(run, policy, cfg)
    with pytest.raises(
        ValueError, match="train_window_n must be a positive number of assistant turns or 'all'"
    ):
        parse(_argv(tmp_path, "--train_window_n", "two"))
    for old in ("0", "-1", "null"):  # older spellings of "every turn": one spelling now
        with pytest.raises(ValueError, match="train_window_n: .* is spelled `train_window_n: all`"):
            parse(_argv(tmp_path, "--train_window_n", old))
    assert parse(_argv(tmp_path, "--train_window_n", "ALL"))[2].window_turns is None
    with pytest.raises(SystemExit):
        parse(_argv(tmp_path, "--train_branch_pools", "entropy"))
    assert "invalid choice: 'entropy'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="train_max_pairs must be >= 0"):
        parse(_argv(tmp_path, "--train_max_pairs", "-1"))


def test_a_round_without_pairs_fails_naming_the_cause(tok, tmp_path):
    """Zero pairs is a round that cannot train: say so and what to change, never train on nothing."""
    import pyarrow as pa

    from selskill.config import PolicyConfig, RunConfig
    from selskill.config.train import TrainConfig
    from selskill.data.schema import PAIR_SCHEMA
    from selskill.train.stage import run_train

    run = RunConfig(exp="t", runs_dir=str(tmp_path), round=1)
    model_dir = tmp_path / "t" / "round_0" / "train" / "model"
    tok.save_pretrained(model_dir)
    micro_model(tok).save_pretrained(model_dir)
    write_label_stage(tmp_path, "t", 1, [pa.Table.from_pylist([], schema=PAIR_SCHEMA).to_pylist()])
    cfg = TrainConfig(output_dir=str(tmp_path / "o"), bf16=False, report_to="none")
    with pytest.raises(ValueError, match="no trainable pairs"):
        run_train(run, PolicyConfig(), cfg)


def test_dataset_cache_key_covers_every_train_key(tmp_path):
    """A resumed run with a changed pair selection or other label shards must rebuild the cached dataset."""
    import dataclasses

    from selskill.train.dataset import _dataset_key

    cfg = TrainConfig(output_dir=str(tmp_path / "o"), bf16=False, report_to="none")
    base = _dataset_key("label-a", cfg)
    assert _dataset_key("label-a", cfg) == base and _dataset_key("label-b", cfg) != base
    for change in ({"train_branch_pools": "ordinary"}, {"train_max_pairs": 7}, {"train_window_n": "1"},
                   {"max_length": 512}, {"seed": 3}):  # fmt: skip
        assert _dataset_key("label-a", dataclasses.replace(cfg, **change)) != base, change


def test_bench_dpo_step_gives_stock_trl_s_losses(capsys):
    """`selskill bench dpo-step` on synthetic pairs: our step and stock TRL's see the same batch and lose alike."""
    from selskill.cli import main

    argv = ["bench", "dpo-step", "--pairs", "2", "--prompt", "16", "--completion", "24"]
    assert main([*argv, "--steps", "2", "--warmup", "1", "--hidden", "64", "--layers", "1"]) == 0
    out = capsys.readouterr().out
    assert float(re.search(r"max \|diff\| over all steps (\S+)", out).group(1)) < 1e-6
    assert re.search(r"ratio ours/stock \d+\.\d+", out)
    assert main(["bench", "dpo-step", "--round", "runs/x/round_1"]) == 2
    assert capsys.readouterr().err == "error: --round needs --policy, the model directory that round trains\n"
