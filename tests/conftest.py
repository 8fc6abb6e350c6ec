"""Shared fixtures. The suite is offline: no hub, no wandb, one thread per process."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from selskill.benchmarks.alfworld import generate as alfworld_gen  # noqa: E402


@pytest.fixture(autouse=True)
def _selskill_messages_at_info():
    """Every test starts as a command does: selskill's messages at INFO on stderr (a level a test set stays)."""
    from selskill.monitor.logs import configure

    configure("info")


@pytest.fixture(scope="session")
def small_games(tmp_path_factory):
    """One generated train game per task type (small scenes), written like ALFWorld data."""
    root = tmp_path_factory.mktemp("games")
    alfworld_gen.generate_games(root, per_type=1, seed=0, split="train", size="small")
    return root


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, small_games):
    """A randomly initialised tiny Qwen3 policy + its tokenizer (trained on game and format text)."""
    import json

    from train_helpers import MICRO_ARCH

    from selskill.agent.turn_format import render_action, render_skill_call
    from selskill.benchmarks.alfworld import load_alfworld_skills
    from selskill.benchmarks.alfworld.turn_format import AlfworldTurnFormat
    from selskill.policy.bootstrap import build_model, train_tokenizer
    from selskill.skills import render_listing

    lib = load_alfworld_skills()
    texts = [AlfworldTurnFormat(style="compact").system_text(render_listing(lib))]
    texts += [render_action("go to desk 1"), render_skill_call("heat_object", {"object": "mug 1"})]
    texts += [json.loads(p.read_text())["pddl_problem"] for p in small_games.rglob("game.tw-pddl")]
    tok = train_tokenizer(texts, vocab_size=600)
    model = build_model(tok, MICRO_ARCH, seed=0)
    out = tmp_path_factory.mktemp("tiny_model")
    tok.save_pretrained(out)
    model.save_pretrained(out)
    return out
