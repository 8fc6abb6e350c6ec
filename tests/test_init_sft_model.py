"""The SFT init of a given chat model (`init_sft`): assistant tokens only on the model's own chat
template (one without generation markers, as pretrained models ship), the loss falls, the contract
(reuse, refusal of other settings, --redo), resume after a kill equals the uninterrupted SFT, LoRA,
and the init stage taking it from a recipe."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from selskill.benchmarks.alfworld.demos import make_demos
from selskill.config.init import SftSchedule
from selskill.sft.build import (
    COMPLETED,
    MANIFEST,
    fitting,
    has_assistant_mask,
    sft_config,
    sft_dataset,
    turn_tokens,
)
from selskill.sft.demos import DemoReport, DemoSource
from selskill.stages import init_sft
from selskill.stages.init_sft import build_sft_init

IM_END = "<|im_end|>"
# SmolLM2-Instruct's chat template: ChatML with a default system prompt and no generation markers
SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MAX_LENGTH = 2048  # the micro model's positions


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory, tiny_model_dir):
    """The micro Qwen3 as a pretrained chat model ships: its own template, without generation markers."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("chat_model")
    shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = SMOL_TEMPLATE
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tokenizer(chat_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(chat_model)


@pytest.fixture(scope="module")
def demos(small_games, tokenizer):
    """The three shortest demonstrations that fit the micro model."""
    kept, lengths = fitting(tokenizer, make_demos(small_games, seed=0), MAX_LENGTH)
    return [d for _, d in sorted(zip(lengths, kept, strict=True), key=lambda p: p[0])][:3]


def _source(demos) -> DemoSource:
    return DemoSource(
        {"demos": "three fixed ones"}, lambda progress, timings: DemoReport(list(demos), len(demos))
    )


def _schedule(**kw) -> SftSchedule:
    return SftSchedule(**{"epochs": 1, "lr": 1e-2, "warmup_ratio": 0.0, "batch_size": 1,
                          "max_length": MAX_LENGTH, "logging_steps": 1, "save_steps": 1, **kw})  # fmt: skip


def _weights(model_dir):
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def _manifest(out):
    return json.loads((out.parent / MANIFEST).read_text())


# --- which tokens are trained -------------------------------------------------------------------------


def test_only_the_decisions_and_their_end_of_turn_are_trained_on_a_template_without_markers(
    tmp_path, chat_model, tokenizer, demos
):
    from transformers import AutoModelForCausalLM
    from trl import SFTTrainer

    assert not has_assistant_mask(tokenizer)  # TRL's assistant mask would be empty here
    demo = dataclasses.replace(demos[0], untrained_turns=[1])  # an injected wrong move: context only
    args = sft_config(tmp_path / "sft", _schedule(), epochs=1, seed=0, progress=False)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(chat_model), args=args,
                         train_dataset=sft_dataset([demo], tokenizer), processing_class=tokenizer)  # fmt: skip
    row = trainer.train_dataset[0]
    ids, labels = row["input_ids"], row["labels"]
    trained = tokenizer.decode([i for i, lab in zip(ids, labels, strict=True) if lab != -100])
    untrained = tokenizer.decode([i for i, lab in zip(ids, labels, strict=True) if lab == -100])
    turns = [m["content"] for m in demo.messages if m["role"] == "assistant"]
    assert trained == "".join(t + IM_END for i, t in enumerate(turns) if i != 1)
    assert turns[1] + IM_END in untrained and "Your task is to" in untrained
    # the row is the model's own template, rendered: ChatML with its roles, up to the last decision
    text = tokenizer.apply_chat_template(demo.messages, tokenize=False)
    assert tokenizer.decode(ids) == text[: text.rindex(turns[-1] + IM_END) + len(turns[-1] + IM_END)]


def test_turn_by_turn_rows_equal_the_template_mask_where_a_template_has_markers(tiny_model_dir, demos):
    """The rows built turn by turn (as the rounds tokenize) are the ones a generation-marked template gives."""
    from transformers import AutoTokenizer

    from selskill.agent.chat_tokens import ChatTokens

    marked = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert has_assistant_mask(marked)
    for demo in demos:
        enc = marked.apply_chat_template(demo.messages, tokenize=True, return_dict=True,
                                         return_assistant_tokens_mask=True)  # fmt: skip
        ids, mask = turn_tokens(ChatTokens(marked), demo.messages)
        assert (ids, mask) == (list(enc["input_ids"])[: len(ids)], list(enc["assistant_masks"])[: len(ids)])
        assert sum(mask) == sum(enc["assistant_masks"])


def test_a_model_without_a_chat_template_is_refused_before_any_demonstration(tmp_path, tiny_model_dir, demos):
    from transformers import AutoTokenizer

    bare = tmp_path / "bare"
    shutil.copytree(tiny_model_dir, bare)
    tok = AutoTokenizer.from_pretrained(bare)
    tok.chat_template = None
    tok.save_pretrained(bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)

    def played(progress, timings):
        raise AssertionError("demonstrations played")

    with pytest.raises(ValueError, match="has no chat template"):
        build_sft_init(tmp_path / "round_0" / "train" / "model", base=str(bare),
                       source=DemoSource({}, played), schedule=_schedule(), seed=0, progress=False)  # fmt: skip


# --- the build and its contract ------------------------------------------------------------------------


def test_the_sft_init_lowers_the_loss_is_reused_and_refuses_other_settings_without_redo(
    tmp_path, chat_model, demos, monkeypatch
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "runs" / "e" / "round_0" / "train" / "model"
    kwargs = dict(base=str(chat_model), source=_source(demos), seed=0, progress=False)
    schedule = _schedule(epochs=4, batch_size=3, save_steps=0)  # one batch of all three: 4 steps
    assert build_sft_init(out, schedule=schedule, **kwargs) == out
    stage = out.parent
    assert (stage / COMPLETED).is_file() and not (stage / "sft").exists()
    manifest = _manifest(out)
    losses = [e["loss"] for e in manifest["train"]["loss_curve"]]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0], losses
    assert manifest["base"] == str(chat_model) and manifest["settings"]["init_sft"] is True
    assert manifest["settings"]["sft"]["lr"] == 1e-2 and manifest["demos"]["n_demos"] == 3
    assert 0 < manifest["train"]["assistant_tokens_per_epoch"] < manifest["train"]["tokens_per_epoch"]
    # the init is a plain checkpoint of the same model, its own tokenizer and template kept
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert AutoTokenizer.from_pretrained(out).chat_template == SMOL_TEMPLATE
    before, after = _weights(chat_model), _weights(out)
    assert any(not (before[k] == after[k]).all() for k in before)

    def boom(*args, **kw):
        raise AssertionError("trained again")

    monkeypatch.setattr(init_sft, "sft_train", boom)
    assert build_sft_init(out, schedule=schedule, **kwargs) == out  # same settings: reused
    # the logging and checkpoint intervals change no weight: reused too
    assert build_sft_init(
        out, schedule=dataclasses.replace(schedule, logging_steps=5, save_steps=9), **kwargs
    )
    other = dataclasses.replace(schedule, lr=1e-3)
    with pytest.raises(FileExistsError, match=r"sft\.lr: 0\.01 -> 0\.001.*--redo"):
        build_sft_init(out, schedule=other, **kwargs)
    with pytest.raises(FileExistsError, match=r"demos\.demos: 'three fixed ones' -> 'others'"):
        build_sft_init(out, schedule=schedule, **{**kwargs, "source": DemoSource({"demos": "others"}, None)})
    monkeypatch.undo()
    assert build_sft_init(out, schedule=other, redo=True, **kwargs) == out
    assert _manifest(out)["settings"]["sft"]["lr"] == 1e-3


def test_a_killed_sft_resumes_from_its_last_complete_checkpoint_as_if_uninterrupted(
    tmp_path, chat_model, demos, monkeypatch, caplog
):
    """One step per demonstration, a checkpoint after each; killed in step 3 with checkpoint 2 half-written."""
    import torch
    from trl import SFTTrainer

    from selskill.train.checkpoints import INPUTS_FILE

    kwargs = dict(base=str(chat_model), source=_source(demos), schedule=_schedule(), seed=0, progress=False)
    whole = tmp_path / "whole" / "round_0" / "train" / "model"
    build_sft_init(whole, **kwargs)

    out = tmp_path / "killed" / "round_0" / "train" / "model"
    work = out.parent / "sft"
    step = SFTTrainer.training_step
    calls = []

    def killed_in_step_3(self, *args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("killed")
        return step(self, *args, **kw)

    monkeypatch.setattr(SFTTrainer, "training_step", killed_in_step_3)
    with pytest.raises(RuntimeError, match="killed"):
        build_sft_init(out, **kwargs)
    monkeypatch.undo()
    assert not (out.parent / COMPLETED).exists()
    assert all((work / f"checkpoint-{n}" / INPUTS_FILE).is_file() for n in (1, 2))

    # a checkpoint of other settings is not resumed
    with pytest.raises(FileExistsError, match=r"checkpoint of an init SFT with other settings: sft\.lr"):
        build_sft_init(out, **{**kwargs, "schedule": _schedule(lr=1e-3)})

    weights = work / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # the save of step 2 cut short
    build_sft_init(out, **kwargs)
    assert f"skipping {work / 'checkpoint-2'}: model.safetensors is truncated" in caplog.text
    train = _manifest(out)["train"]
    assert train["resumed_from"] == str(work / "checkpoint-1") and train["resumed_at_step"] == 1
    assert train["steps"] == 3
    assert [e["loss"] for e in train["loss_curve"]] == pytest.approx(
        [e["loss"] for e in _manifest(whole)["train"]["loss_curve"]], abs=1e-5
    )
    a, b = _weights(whole), _weights(out)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_a_lora_sft_writes_the_adapter_and_the_base_with_it_merged(tmp_path, chat_model, demos):
    from peft import LoraConfig

    out = tmp_path / "round_0" / "train" / "model"
    peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    build_sft_init(out, base=str(chat_model), source=_source(demos[:2]), schedule=_schedule(save_steps=0),
                   seed=0, peft=peft, lora={"lora_r": 4}, progress=False)  # fmt: skip
    assert (out.parent / "adapter" / "adapter_config.json").is_file()
    manifest = _manifest(out)
    assert manifest["settings"]["lora"] == {"lora_r": 4} and manifest["adapter"] == str(
        out.parent / "adapter"
    )
    before, after = _weights(chat_model), _weights(out)
    assert before.keys() == after.keys()  # a plain checkpoint: no adapter weights left in it
    changed = {k for k in before if not (before[k] == after[k]).all()}
    assert changed and all(".q_proj." in k or ".v_proj." in k for k in changed)


# --- from a recipe -------------------------------------------------------------------------------------


def test_the_init_stage_fine_tunes_the_recipes_model_and_round_1_starts_from_it(tmp_path, chat_model):
    from selskill.config import load_recipe
    from selskill.config.run import PolicyConfig
    from selskill.data.layout import resolve_round_policy
    from selskill.stages.table import ensure_init_policy

    run = ["--config", "recipes/micro.yaml", "--runs_dir", str(tmp_path / "runs"), "--games_dir",
           str(tmp_path / "games"), "--model_name_or_path", str(chat_model)]  # fmt: skip
    argv = [*run, "--init_sft", "true", "--init_games_per_type", "1", "--init_epochs", "1", "--init_lr", "1e-3",
            "--init_batch_size", "4", "--init_max_length", str(MAX_LENGTH), "--init_save_steps", "0"]  # fmt: skip
    recipe = load_recipe(argv)
    with pytest.raises(FileNotFoundError, match=r"fine-tunes model_name_or_path .* into it \(init_sft\)"):
        resolve_round_policy(recipe.run, recipe.policy)
    out = ensure_init_policy(recipe)
    assert out == tmp_path / "runs" / "micro" / "round_0" / "train" / "model"
    path, source = resolve_round_policy(recipe.run, recipe.policy)
    assert path == str(out) and "fine-tuned by the init stage (init_sft)" in source
    manifest = _manifest(out)
    settings = manifest["settings"]
    # ALFWorld's demonstrations as its offline init plays them: the recipe's games, budget and mix
    assert settings["demos"]["games_dir"] == str((tmp_path / "games").resolve())
    assert settings["demos"]["game_size"] == "tiny" and settings["demos"]["max_decisions"] == 15
    assert settings["sft"] == {"epochs": 1.0, "lr": 1e-3, "warmup_ratio": 0.05, "batch_size": 4,
                               "max_length": MAX_LENGTH}  # fmt: skip
    assert manifest["demos"]["n_demos"] > 0 and manifest["lora"] is None
    # a changed key is refused without --redo
    with pytest.raises(FileExistsError, match=r"sft\.epochs: 1\.0 -> 2\.0"):
        ensure_init_policy(load_recipe([*argv, "--init_epochs", "2"]))
    # without init_sft the model is round 1's as it is, and nothing is built
    plain = load_recipe(run)
    assert ensure_init_policy(plain) is None
    assert resolve_round_policy(plain.run, plain.policy)[0] == str(chat_model)
    with pytest.raises(ValueError, match="init_sft: true fine-tunes model_name_or_path, which is empty"):
        PolicyConfig(init_sft=True)


def test_bfcl_hands_the_sft_its_offline_inits_ground_truth_demonstrations(tmp_path, chat_model, monkeypatch):
    pytest.importorskip("bfcl_eval")
    from selskill.config import load_recipe
    from selskill.stages import table

    recipe_file = tmp_path / "bfcl.yaml"
    recipe_file.write_text(
        "benchmark: bfcl\nbfcl_categories: base\nbfcl_scenarios: '139'\nturn_doc_style: brief\n"
        f"runs_dir: {tmp_path / 'runs'}\nmodel_name_or_path: {chat_model}\ninit_sft: true\nseed: 0\n"
    )
    recipe = load_recipe(["--config", str(recipe_file)])
    handed = {}
    monkeypatch.setattr(init_sft, "sft_from_recipe", lambda r, out, base, source: handed.update(locals()))
    table.ensure_init_policy(recipe)
    assert handed["base"] == str(chat_model) and handed["out"].parts[-3:] == ("round_0", "train", "model")
    source = handed["source"]
    settings = source.settings
    assert settings["env"] == "bfcl" and settings["categories"] == ["base"] and settings["seed"] == 0
    report = source.play(False, {})
    assert report.demos and all(d.task_id.startswith("train/") for d in report.demos)
