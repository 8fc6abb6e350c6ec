"""LoRA DPO (`use_peft` and TRL's `lora_*` keys): only the adapter trains, the reference is the base
with the adapter disabled, the stage checkpoints, resumes, precomputes the reference, and hands the
next round a merged model it trains on in turn. Tiny models, built offline, on the CPU.
"""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from train_helpers import fixture_rows, micro_model, micro_tokenizer, write_label_stage

from selskill.train.pairs import examples_to_dataset, loss_mask
from selskill.train.trainer import SelSkillDPOTrainer

ROOT = Path(__file__).resolve().parents[1]
LORA = ("--use_peft", "true", "--lora_r", "8", "--lora_alpha", "16", "--lora_target_modules", "all-linear")


@pytest.fixture(scope="module")
def tok():
    return micro_tokenizer()


def _examples(tok, n=4):
    out = []
    for row in fixture_rows(tok, n):
        ex = {k: row[k] for k in ("pair_id", "kind", "prompt_ids", "chosen_ids", "rejected_ids")}
        for side in ("chosen", "rejected"):
            ex[f"{side}_loss_mask"] = loss_mask(
                row[f"{side}_role"], row[f"{side}_turn"], row["kind"], 3
            ).tolist()
        out.append(ex)
    return out


def _cfg(tmp_path, **kw):
    from selskill.config.train import TrainConfig

    base = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, bf16=False, report_to="none",
        save_strategy="no", learning_rate=1e-2, max_steps=4, logging_steps=1, disable_tqdm=True, seed=0,
        max_length=None, use_peft=True, lora_r=8, lora_alpha=16, lora_dropout=0.0,
        lora_target_modules=["all-linear"],
    )  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


def _logps(trainer, examples, ref: bool):
    batch = {k: v.to(trainer.args.device) for k, v in trainer.data_collator(examples).items()}
    batch.pop("pair_kind")
    with torch.no_grad():
        if ref:
            return torch.cat(trainer.compute_ref_log_probs(trainer.model, batch))
        labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
        kw = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}
        return trainer.model(**kw, labels=labels, fused_lm_head=True).log_probs.sum(1)


def test_the_lora_keys_are_trls_and_build_its_peft_config(tmp_path):
    from selskill.train.lora import peft_config
    from selskill.train.run import parse

    _, _, cfg = parse(["--config", str(ROOT / "recipes" / "tiny.yaml"), *LORA, "--lora_dropout", "0.1"])
    lora = peft_config(cfg)
    assert (lora.r, lora.lora_alpha, lora.lora_dropout, lora.target_modules) == (8, 16, 0.1, "all-linear")
    assert lora.task_type == "CAUSAL_LM"
    assert peft_config(parse(["--config", str(ROOT / "recipes" / "tiny.yaml")])[2]) is None  # off by default
    # a TRL model-loading key is refused naming the key that replaces it here
    with pytest.raises(ValueError, match="dtype \\(TRL's ModelConfig key; here .*model_init_kwargs"):
        parse(["--config", str(ROOT / "recipes" / "tiny.yaml"), "--dtype", "bfloat16"])


def test_only_the_adapter_trains_and_the_reference_is_the_base(tok, tmp_path):
    from selskill.train.lora import peft_config

    examples, cfg = _examples(tok), _cfg(tmp_path)
    trainer = SelSkillDPOTrainer(
        micro_model(tok, seed=0), args=cfg, train_dataset=examples_to_dataset(examples), processing_class=tok,
        peft_config=peft_config(cfg),
    )  # fmt: skip
    assert trainer.ref_model is None  # no second copy: the reference is the policy with its adapter disabled
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    base_logps = _logps(trainer, examples, ref=False)  # lora_B starts at zero: the policy is the base
    trainer.train()

    after = dict(trainer.model.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n].detach())}
    assert moved == trainable  # every adapter tensor moved, nothing of the base did
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[0] == pytest.approx(math.log(2), abs=1e-6) and losses[-1] < losses[0]
    assert any(
        "local/rewards/margins" in h for h in trainer.state.log_history
    )  # per-kind metrics still logged
    # the reference is still the base; the policy moved away from it
    assert torch.allclose(_logps(trainer, examples, ref=True), base_logps, atol=1e-5)
    assert not torch.allclose(_logps(trainer, examples, ref=False), base_logps, atol=1e-3)


def _setup(tok, root: Path, round_: int = 1, n_pairs: int = 8) -> Path:
    """The round-0 model (kept if there) and round `round_`'s pairs, as the label stage writes them."""
    init = root / "t" / "round_0" / "train" / "model"
    if not init.is_dir():
        tok.save_pretrained(init)
        micro_model(tok, seed=0).save_pretrained(init)
    write_label_stage(root, "t", round_, [fixture_rows(tok, n_pairs)])
    return init


def _argv(root, *extra):
    return [
        "--config", str(ROOT / "recipes" / "tiny.yaml"), "--runs_dir", str(root), "--exp", "t",
        "--learning_rate", "1e-2", "--logging_steps", "1", "--seed", "0", "--loss_type", "sigmoid",
        "--lora_dropout", "0.0", "--report_to", "none", *LORA, *extra,
    ]  # fmt: skip


def test_lora_stage_checkpoints_resumes_and_chains_rounds(tok, tmp_path, capsys):
    """tiny.yaml precomputes the reference: the precomputed pass runs with the adapter disabled."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selskill.data.layout import resolve_round_policy
    from selskill.train.run import parse
    from selskill.train.stage import run_train

    init = _setup(tok, tmp_path)
    train_dir = tmp_path / "t" / "round_1" / "train"
    run, policy, cfg = parse(_argv(tmp_path, "--round", "1", "--max_steps", "4", "--save_steps", "2"))
    assert cfg.precompute_ref_log_probs
    run_train(run, policy, cfg)
    done = json.loads((train_dir / "COMPLETED").read_text())
    assert done["adapter"] == str(train_dir / "adapter") and done["global_step"] == 4
    assert done["first_logged_loss"] == pytest.approx(math.log(2), abs=1e-6)  # reference == base == start
    assert done["last_logged_loss"] < done["first_logged_loss"]
    # checkpoints hold the adapter, not the model
    ckpt = train_dir / "checkpoint-4"
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "model.safetensors").exists()
    assert (train_dir / "adapter" / "adapter_config.json").is_file()

    # model/ is a plain checkpoint: the base with the adapter merged in; what LoRA does not touch is the base's
    merged = AutoModelForCausalLM.from_pretrained(train_dir / "model")
    base = AutoModelForCausalLM.from_pretrained(init)
    assert not any(p.name.startswith("adapter") for p in (train_dir / "model").iterdir())
    with_adapter = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(init), train_dir / "adapter"
    )
    ids = torch.tensor([fixture_rows(tok, 1)[0]["prompt_ids"][:40]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, with_adapter(ids).logits, atol=1e-5)
        assert not torch.allclose(merged(ids).logits, base(ids).logits, atol=1e-3)
    m, b = dict(merged.named_parameters()), dict(base.named_parameters())
    assert torch.equal(m["model.embed_tokens.weight"], b["model.embed_tokens.weight"])
    assert torch.equal(m["model.norm.weight"], b["model.norm.weight"])
    assert not torch.equal(
        m["model.layers.0.self_attn.q_proj.weight"], b["model.layers.0.self_attn.q_proj.weight"]
    )
    assert AutoTokenizer.from_pretrained(train_dir / "model").get_vocab() == tok.get_vocab()

    # an interrupted round resumes from its last checkpoint (the adapter and its optimizer state) and ends
    # where the uninterrupted run did (a fresh adapter would log log 2 again at step 3)
    for name in ("COMPLETED", "model", "adapter", "checkpoint-4"):
        shutil.rmtree(train_dir / name) if (train_dir / name).is_dir() else (train_dir / name).unlink()
    capsys.readouterr()
    run_train(*parse(_argv(tmp_path, "--round", "1", "--max_steps", "4", "--save_steps", "2")))
    said = capsys.readouterr()
    assert f"resuming from {train_dir / 'checkpoint-2'}" in said.out + said.err
    resumed = json.loads((train_dir / "COMPLETED").read_text())
    assert resumed["global_step"] == 4 and resumed["resumed_at_step"] == 2
    assert resumed["logged_losses"] == pytest.approx(done["logged_losses"], abs=1e-6)
    assert done["logged_losses"][2] < 0.9 * math.log(2)

    # round 2 starts from round 1's merged model and trains a fresh adapter against it as the reference
    _setup(tok, tmp_path, round_=2)
    run2, policy2, cfg2 = parse(_argv(tmp_path, "--round", "2", "--max_steps", "1", "--save_strategy", "no"))
    assert resolve_round_policy(run2, policy2)[0] == str(train_dir / "model")
    run_train(run2, policy2, cfg2)
    done2 = json.loads((tmp_path / "t" / "round_2" / "train" / "COMPLETED").read_text())
    assert done2["policy_source"] == str(train_dir / "model")
    assert done2["first_logged_loss"] == pytest.approx(
        math.log(2), abs=1e-6
    )  # the reference is round 1's policy
    adapter_cfg = json.loads(
        (tmp_path / "t" / "round_2" / "train" / "adapter" / "adapter_config.json").read_text()
    )
    assert adapter_cfg["base_model_name_or_path"] == str(train_dir / "model")
