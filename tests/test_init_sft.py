"""Init SFT: assistant-only loss, the loss goes down, save/reload, reuse, and a greedy replay."""

import dataclasses
import json

import pytest

from selskill.agent.parser import parse_turn
from selskill.agent.transcript import after_action, after_skill, opening_messages
from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.benchmarks.alfworld.demos import DEMO_FORMAT, DEMO_LISTING_STYLE, make_demos, tokenizer_corpus
from selskill.benchmarks.alfworld.env import AlfworldEnv, find_games
from selskill.benchmarks.alfworld.episode import NAVIGATION
from selskill.benchmarks.alfworld.init_config import AlfworldDemos, DemoBudget
from selskill.benchmarks.alfworld.init_policy import build_init_policy
from selskill.benchmarks.alfworld.turn_format import AlfworldTurnFormat
from selskill.config.init import InitConfig, InitTraining, SftSchedule
from selskill.config.rollout import MAX_DECISIONS
from selskill.policy.bootstrap import IM_END, TinyArch, build_model, train_tokenizer
from selskill.sft import build as init_sft
from selskill.sft.build import COMPLETED, MANIFEST, sft_config, sft_dataset, sft_train
from selskill.sft.demos import DemoPrompts
from selskill.skills import SkillExecutor, render_listing

MICRO = TinyArch(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32)  # fmt: skip


@pytest.fixture(scope="module")
def demos(small_games):
    return make_demos(small_games, seed=0)


@pytest.fixture(scope="module")
def tokenizer(demos):
    return train_tokenizer(tokenizer_corpus(demos), vocab_size=1024)


def _args(tmp_path, epochs=1, **kw):
    schedule = SftSchedule(**{"lr": 3e-3, "batch_size": 2, "max_length": 4096, "logging_steps": 1, **kw})
    return sft_config(tmp_path / "sft", schedule, epochs=epochs, seed=0, progress=False)


# a build small enough for a test: one game of each type, a micro model, one epoch per phase
MICRO_TRAINING = InitTraining(
    vocab_size=1024, arch=MICRO, sft=SftSchedule(pretrain_epochs=1, epochs=1, lr=3e-3, batch_size=3)
)
MICRO_DEMOS = AlfworldDemos(games_per_type=1)


def _trained_text(trainer, tokenizer, k=0) -> tuple[str, str]:
    row = trainer.train_dataset[k]
    ids, labels = row["input_ids"], row["labels"]
    trained = [i for i, lab in zip(ids, labels, strict=True) if lab != -100]
    untrained = [i for i, lab in zip(ids, labels, strict=True) if lab == -100]
    assert len(trained) + len(untrained) == len(ids)
    return tokenizer.decode(trained), tokenizer.decode(untrained)


def test_only_assistant_tokens_carry_loss(tmp_path, demos, tokenizer):
    from trl import SFTTrainer

    model = build_model(tokenizer, MICRO, seed=0)
    demo = dataclasses.replace(demos[0], untrained_turns=[])
    trainer = SFTTrainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=sft_dataset([demo], tokenizer),
        processing_class=tokenizer,
    )
    trained, untrained = _trained_text(trainer, tokenizer)
    assert trained == "".join(m["content"] + IM_END for m in demo.messages if m["role"] == "assistant")
    assert "Admissible commands" in untrained and "Admissible commands" not in trained


def test_injected_mistakes_are_context_not_targets(tmp_path, demos, tokenizer):
    from trl import SFTTrainer

    demo = demos[0]
    turns = [m["content"] for m in demo.messages if m["role"] == "assistant"]
    skip = [1, len(turns) - 2]
    marked = dataclasses.replace(demo, untrained_turns=skip)
    for assistant_only in (True, False):  # phase 2 and phase 1
        args = _args(tmp_path)
        dataset = sft_dataset(
            [marked], tokenizer, drop_system=not assistant_only, assistant_only=assistant_only
        )
        trainer = SFTTrainer(model=build_model(tokenizer, MICRO, seed=0), args=args, train_dataset=dataset,
                             processing_class=tokenizer)  # fmt: skip
        trained, untrained = _trained_text(trainer, tokenizer)
        kept = [t for i, t in enumerate(turns) if i not in skip]
        if assistant_only:
            assert trained == "".join(t + IM_END for t in kept)
        else:  # every token but the skipped turns
            assert all(t in trained for t in kept) and "Admissible commands" in trained
        for i in skip:
            assert turns[i] + IM_END in untrained


def test_sft_lowers_the_loss(tmp_path, demos, tokenizer):
    model = build_model(tokenizer, MICRO, seed=0)
    _, stats = sft_train(model, tokenizer, demos, _args(tmp_path, epochs=4, lr=1e-2, batch_size=3))
    losses = [e["loss"] for e in stats["loss_curve"]]
    assert len(losses) == 8
    assert losses[-1] < 0.8 * losses[0], losses
    assert stats["tokens_per_second"] > 0


def _greedy_episode(model, tokenizer, games, task_id, max_decisions=12):
    """Test-only greedy play: the transcript the runner would build, one decision at a time."""
    import torch

    library = load_alfworld_skills()
    executor = SkillExecutor(library, NAVIGATION)
    env = AlfworldEnv(games)
    state = env.reset(task_id)
    messages = opening_messages(DEMO_FORMAT, render_listing(library, DEMO_LISTING_STYLE), state)
    end = tokenizer.convert_tokens_to_ids(IM_END)
    for _ in range(max_decisions):
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=40, do_sample=False, eos_token_id=end)
        text = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
        turn = parse_turn(text, library.names)
        if not turn.ok:
            return messages, state, f"malformed:{turn.reason}"
        messages.append(DEMO_FORMAT.assistant_message(text.strip()))
        if turn.kind == "action":
            state = env.step(turn.action)
            messages.append(after_action(DEMO_FORMAT, state))
        else:
            record = executor.execute(env, turn.skill, turn.arguments)
            state = env.state
            messages.append(after_skill(DEMO_FORMAT, record.observation, state))
        if state.won:
            return messages, state, "won"
    return messages, state, "turn_limit"


def test_greedy_replay_of_a_memorised_demo(tmp_path, small_games, demos, tokenizer):
    """Overfit one demo, then play its game greedily: the policy must write the same turns and win.

    This checks that the trained format is exactly the one the policy is sampled with
    (chat template, transcript builders, skill returns, end-of-turn token).
    """
    demo = min((d for d in demos if d.n_skill_calls), key=lambda d: len(d.messages))
    model = build_model(tokenizer, MICRO, seed=0)
    trainer, stats = sft_train(model, tokenizer, [demo], _args(tmp_path, epochs=100, lr=1e-2, batch_size=1))
    games = find_games(small_games, "train")
    messages, state, end = _greedy_episode(trainer.model.eval(), tokenizer, games, demo.task_id)
    assert end == "won", (stats["loss_curve"][-1], messages[2:])
    assert messages == demo.messages


def test_build_reload_and_reuse(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "runs" / "t" / "round_0" / "train" / "model"
    games_dir = tmp_path / "games"
    kwargs = dict(games_dir=games_dir, seed=0, demos=MICRO_DEMOS, training=MICRO_TRAINING, progress=False)
    assert build_init_policy(out, **kwargs) == out
    stage = out.parent
    assert (stage / COMPLETED).is_file() and (out / "config.json").is_file()
    assert not (stage / "sft").exists()  # the trainer's scratch directory is removed
    manifest = json.loads((stage / MANIFEST).read_text())
    assert manifest["settings"]["n_train_games"] == 1 and manifest["demos"]["n_demos"] >= 5
    train = manifest["train"]
    assert train["pretrain"]["steps"] == 2 and train["sft"]["steps"] == 2 and train["tokens_per_second"] > 0
    # the first phase trains every token but the injected wrong moves, the second the assistant's only
    pre = train["pretrain"]
    if manifest["demos"]["mistakes_per_demo"]:
        assert 0.9 * pre["tokens_per_epoch"] < pre["assistant_tokens_per_epoch"] < pre["tokens_per_epoch"]
    else:
        assert pre["assistant_tokens_per_epoch"] == pre["tokens_per_epoch"]
    assert 0 < train["sft"]["assistant_tokens_per_epoch"] < train["sft"]["tokens_per_epoch"]
    assert 0 < manifest["demo_tokens"]["mean"] <= manifest["demo_tokens"]["max"] <= 4096
    assert len(find_games(games_dir, "train").games) == 6  # generated because missing

    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert sum(p.numel() for p in model.parameters()) == manifest["n_parameters"]
    demo = make_demos(find_games(games_dir, "train").games[:1], seed=0)[0]
    ids = tok.apply_chat_template(
        demo.messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert tok.decode(ids["input_ids"]).startswith("<|im_start|>system\n")
    assert 0 < sum(ids["assistant_masks"]) < len(ids["input_ids"])

    # the same settings again: reused, nothing retrained; other settings: refused
    def boom(*args, **kw):
        raise AssertionError("retrained")

    monkeypatch.setattr(init_sft, "sft_train", boom)
    assert build_init_policy(out, **kwargs) == out
    # the logging interval changes no weight: a build differing only in it is reused
    logging = dataclasses.replace(
        MICRO_TRAINING, sft=dataclasses.replace(MICRO_TRAINING.sft, logging_steps=1)
    )
    assert build_init_policy(out, **{**kwargs, "training": logging}) == out
    other_lr = dataclasses.replace(MICRO_TRAINING, sft=dataclasses.replace(MICRO_TRAINING.sft, lr=1e-3))
    with pytest.raises(FileExistsError, match=r"lr: 0\.003 -> 0\.001"):
        build_init_policy(out, **{**kwargs, "training": other_lr})
    # the step budget decides which demonstrations are kept: an init built under another is not reused
    assert manifest["settings"]["max_decisions"] == MAX_DECISIONS
    other_budget = dataclasses.replace(MICRO_DEMOS, budget=DemoBudget(max_decisions=15))
    with pytest.raises(FileExistsError, match=f"max_decisions: {MAX_DECISIONS} -> 15"):
        build_init_policy(out, **{**kwargs, "demos": other_budget})
    # the prompt format is a setting too: a policy is sampled with the format it was trained on
    all_commands = AlfworldTurnFormat(style="compact", admissible_style="all")
    with pytest.raises(FileExistsError):
        build_init_policy(out, **{**kwargs, "prompts": DemoPrompts(all_commands, DEMO_LISTING_STYLE)})
    assert manifest["settings"]["fmt"]["admissible_style"] == "local"


def test_init_config_joins_a_trl_recipe():
    from trl import DPOConfig, SFTConfig, TrlParser

    from selskill.benchmarks.alfworld.config import AlfworldConfig
    from selskill.benchmarks.alfworld.init_config import AlfworldInitKeys
    from selskill.benchmarks.bfcl.init_config import BfclInitKeys

    names = {f.name for t in (InitConfig, AlfworldInitKeys, BfclInitKeys) for f in dataclasses.fields(t)}
    assert all(n.startswith("init_") for n in names)
    trl_names = {f.name for t in (DPOConfig, SFTConfig) for f in dataclasses.fields(t)}
    assert not names & trl_names
    parser = TrlParser((InitConfig, AlfworldConfig, DPOConfig))
    init, alfworld, dpo = parser.parse_args_and_config(
        args=[
            "--output_dir",
            "x",
            "--bf16",
            "false",
            "--init_epochs",
            "2",
            "--init_demo_useful",
            "0.5",
            "--init_layers",
            "3",
            "--seed",
            "7",
        ]
    )
    training = init.training()
    assert training.sft.epochs == 2 and training.arch.num_hidden_layers == 3 and dpo.seed == 7
    assert alfworld.alfworld_demos().mix.useful == 0.5


def _sections():
    from selskill.benchmarks.alfworld.config import AlfworldConfig
    from selskill.benchmarks.alfworld.init_config import AlfworldInitKeys
    from selskill.benchmarks.bfcl.config import BfclConfig
    from selskill.benchmarks.bfcl.init_config import BfclInitKeys

    # (the section a key is parsed into, the keys, the settings objects its builder reads)
    return [
        (InitConfig, dataclasses.fields(InitConfig), lambda c: c.training()),
        (AlfworldConfig, dataclasses.fields(AlfworldInitKeys), lambda c: (c.alfworld_demos(), c.dagger())),
        (BfclConfig, dataclasses.fields(BfclInitKeys), lambda c: c.bfcl_demo_mix()),
    ]


@pytest.mark.parametrize(
    "section,key",
    [(i, f.name) for i, (_, keys, _) in enumerate(_sections()) for f in keys if f.name != "init_bfcl_tasks"],
)
def test_every_init_key_reaches_a_builders_setting(section, key):
    """A recipe key the settings objects do not read would be accepted and then ignored."""
    cls, _, _settings = _sections()[section]
    base = cls(init_dagger_iters=1) if key == "init_dagger_from" else cls()
    value = getattr(base, key)
    other = {"init_game_size": "tiny", "init_demo_search": "sweep", "init_dagger_from": "elsewhere"}.get(key)
    if isinstance(value, bool):
        other = not value
    elif isinstance(value, int):
        other = value + 1
    elif isinstance(value, float):
        other = value / 2 or 0.5
    assert _settings(dataclasses.replace(base, **{key: other})) != _settings(base)
