"""DAgger for the init policy: the roll-in is the policy's own episode message for message, the
expert takes over where it disagrees and wins, and a build with DAgger trains on the aggregate."""

import dataclasses
import json
import random

import pytest
from test_init_sft import MICRO_DEMOS, MICRO_TRAINING
from test_runner import FMT, ScriptedPolicy, _runner

from selskill.agent.episode_host import EpisodeSpec
from selskill.agent.parser import parse_turn
from selskill.agent.turn_format import render_action, render_skill_call
from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.benchmarks.alfworld.dagger import DAGGER_DEMOS, DaggerSettings, disagreements, relabel_rollout
from selskill.benchmarks.alfworld.demos import DemoBudget, DemoEpisode, DemoMix
from selskill.benchmarks.alfworld.env import AlfworldEnv, find_games
from selskill.benchmarks.alfworld.episode import NAVIGATION
from selskill.benchmarks.alfworld.expert import task_spec
from selskill.benchmarks.alfworld.init_policy import build_init_policy
from selskill.data.records import Turn
from selskill.policy.hf import HFPolicy
from selskill.policy.settings import HFSettings
from selskill.sft.build import MANIFEST
from selskill.sft.demos import DemoPrompts, DemoSetup


@pytest.fixture(scope="module")
def index(small_games):
    return find_games(small_games, "train")


@pytest.fixture(scope="module")
def scripted_row(tiny_model_dir, index):
    """A policy episode with every kind of turn: a skill call, a malformed turn, wrong moves."""
    task = next(t for t in AlfworldEnv(index).task_ids() if "pick_and_place_simple" in t)
    texts = [
        render_skill_call("pick_and_place"),
        "go to desk 1",
        render_action("look"),
        render_action("inventory"),
    ]
    policy = ScriptedPolicy(HFPolicy(str(tiny_model_dir), HFSettings(batch_size=4)), texts)
    row = _runner(policy, index, max_env_steps=6).run([EpisodeSpec("s", task, seed=0)])[0]
    return task, row


BARE = DemoMix.none()  # the expert alone: the continuation is deterministic to assert on
PROMPTS = DemoPrompts(FMT, "compact")


def _setup(index):
    return DemoSetup.of(AlfworldEnv(index), PROMPTS, load_alfworld_skills(), NAVIGATION)


def _relabel(index, task, turns, seed=0, points=2, mix=BARE, max_decisions=50):
    budget = DemoBudget(max_decisions=max_decisions, max_env_steps=30)
    return relabel_rollout(
        _setup(index),
        index.by_id()[task],
        turns,
        rng=random.Random(seed),
        mix=mix,
        budget=budget,
        points=points,
    )


def test_relabelled_demos_continue_the_policy_episode_with_the_expert(index, scripted_row):
    task, row = scripted_row
    assert [t.kind for t in row.turns[:3]] == ["skill", "malformed", "action"]
    demos, dropped = _relabel(index, task, row.turns)
    assert len(demos) == 2 and not dropped
    policy_messages = json.loads(row.messages)
    lib = load_alfworld_skills()
    record = index.by_id()[task]
    probe = DemoEpisode(
        _setup(index), record, task_spec(record), random.Random(0), DemoMix(), DemoBudget(max_env_steps=30)
    )
    found = disagreements(probe, row.turns)
    assert found[0] == 1  # the skill call is not a disagreement, the malformed turn is
    for demo in demos:
        assistant = [i for i, m in enumerate(demo.messages) if m["role"] == "assistant"]
        point = min(set(range(len(assistant))) - set(demo.untrained_turns))
        assert point in found and set(range(point)) <= set(demo.untrained_turns)
        # the roll-in is exactly what the runner showed the policy (token-level format included)
        assert demo.messages[: assistant[point]] == policy_messages[: assistant[point]]
        # from there the expert plays: a well-formed action differing from the policy's, to a win
        taken = parse_turn(demo.messages[assistant[point]]["content"], lib.names)
        assert taken.kind == "action" and taken.action != row.turns[point].action
        assert demo.env_steps > 0 and demo.n_turns > point
    # deterministic per rng seed
    again, _ = _relabel(index, task, row.turns)
    assert [d.messages for d in again] == [d.messages for d in demos]


def test_the_expert_continuation_has_a_decision_budget_of_its_own(index, scripted_row):
    """From the relabelled point the expert gets `max_decisions` decisions, as the runner would
    give an episode: a continuation that needs one more is dropped."""
    task, row = scripted_row
    (demo,), _ = _relabel(index, task, row.turns, points=1)
    point = min(set(range(demo.n_turns)) - set(demo.untrained_turns))
    needed = demo.n_turns - point
    kept, _ = _relabel(index, task, row.turns, points=1, max_decisions=needed)
    assert [d.messages for d in kept] == [demo.messages]
    cut, dropped = _relabel(index, task, row.turns, points=1, max_decisions=needed - 1)
    assert cut == [] and dropped == {"step_limit": 1}


def test_a_rollout_that_agrees_with_the_expert_adds_nothing(index):
    task = next(t for t in AlfworldEnv(index).task_ids() if "pick_and_place_simple" in t)
    record = index.by_id()[task]
    ep = DemoEpisode(
        _setup(index),
        record,
        task_spec(record),
        random.Random(0),
        DemoMix.none(),
        DemoBudget(max_env_steps=30),
    )
    turns = []
    while not ep.state.won:  # the bare expert's own play, recorded as runner turns
        command = ep.expert.next_command()
        turns.append(
            Turn(0, 0, 0, 0, render_action(command), "action", None, command, None, None, None, None, 1, [command],
                 False, [])
        )  # fmt: skip
        ep.act(command)
    demos, dropped = _relabel(index, task, turns)
    assert demos == [] and not dropped


def test_build_with_dagger_and_from_a_base(tmp_path):
    games_dir = tmp_path / "games"
    kwargs = dict(games_dir=games_dir, seed=0, demos=MICRO_DEMOS, training=MICRO_TRAINING, progress=False)
    base = tmp_path / "runs" / "base" / "round_0" / "train" / "model"
    build_init_policy(base, **kwargs)
    assert "dagger" not in json.loads((base.parent / MANIFEST).read_text())["settings"]

    out = tmp_path / "runs" / "d" / "round_0" / "train" / "model"
    dagger = DaggerSettings(iterations=1, epochs=1, max_env_steps=8, base=str(base))
    build_init_policy(out, **kwargs, dagger=dagger)
    manifest = json.loads((out.parent / MANIFEST).read_text())
    assert manifest["settings"]["dagger"]["iterations"] == 1
    train = manifest["train"]
    assert train["pretrain"] is None and train["sft"] is None and train["base"] == str(base.resolve())
    (it,) = train["dagger"]
    assert it["rollouts"] == 6 and it["demos"] > 0
    # the SFT ran on the base demonstrations plus the relabelled ones that fit
    assert it["aggregate_demos"] == len(manifest["task_ids"]) + it["demos"] - it["too_long"]
    assert it["sft"]["steps"] > 0 and (out / "config.json").is_file()

    # a DAgger build continues: its relabelled demonstrations stay in the aggregate
    relabelled = (out.parent / DAGGER_DEMOS).read_text().splitlines()
    assert len(relabelled) == it["demos"] - it["too_long"]
    more = tmp_path / "runs" / "d2" / "round_0" / "train" / "model"
    build_init_policy(more, **kwargs, dagger=dataclasses.replace(dagger, base=str(out), fresh_games=True))
    # fresh games: iteration 1 played generated train games 2 (index) of each type, made for it
    assert len(find_games(games_dir, "train").games) == 6 * 3
    manifest2 = json.loads((more.parent / MANIFEST).read_text())
    (it2,) = manifest2["train"]["dagger"]
    assert it2["iteration"] == 1 and manifest2["settings"]["dagger"]["base_dagger"]["iterations"] == 1
    assert it2["aggregate_demos"] == it["aggregate_demos"] + it2["demos"] - it2["too_long"]
    # continuing a continued build numbers on: iteration 2 plays new games, not iteration 1's again
    third = tmp_path / "runs" / "d3" / "round_0" / "train" / "model"
    build_init_policy(third, **kwargs, dagger=dataclasses.replace(dagger, base=str(more), fresh_games=True))
    (it3,) = json.loads((third.parent / MANIFEST).read_text())["train"]["dagger"]
    assert it3["iteration"] == 2 and len(find_games(games_dir, "train").games) == 6 * 4

    other_lr = dataclasses.replace(MICRO_TRAINING, sft=dataclasses.replace(MICRO_TRAINING.sft, lr=1e-3))
    with pytest.raises(ValueError, match=r"lr: 0\.003 -> 0\.001"):
        build_init_policy(tmp_path / "runs" / "e" / "round_0" / "train" / "model", **{**kwargs, "training": other_lr},
                          dagger=dagger)  # fmt: skip
    with pytest.raises(ValueError, match="init_dagger_iters"):
        DaggerSettings(iterations=0, base=str(base))


def test_dagger_rollouts_decode_as_the_recipe_does(tiny_model_dir, monkeypatch):
    """DAgger relabels the states the policy reaches, so its rollouts follow the recipe's
    `action_choice` (a build for `action_choice: admissible` must not relabel free-decoding states)."""
    from selskill.agent import runner as runner_mod
    from selskill.benchmarks.alfworld.dagger import policy_rollouts
    from selskill.config import load_recipe

    seen = []
    original = runner_mod.EpisodeRunner.__init__

    def recording_init(self, policy, env_factory, library, fmt, config, *args, **kwargs):
        seen.append(config.action_choice)
        original(self, policy, env_factory, library, fmt, config, *args, **kwargs)

    monkeypatch.setattr(runner_mod.EpisodeRunner, "__init__", recording_init)
    for choice in ("admissible", "free"):
        assert policy_rollouts(
            tiny_model_dir, [], prompts=PROMPTS, budget=DemoBudget(max_env_steps=2),
            dagger=DaggerSettings(action_choice=choice), seed=0,
        ) == []  # fmt: skip
    assert seen == ["admissible", "free"]
    recipe = load_recipe(["--config", "recipes/tiny.yaml"])
    settings = recipe.settings.dagger(recipe.rollout.action_choice)
    assert recipe.rollout.action_choice == "admissible" and settings.action_choice == "admissible"
    assert recipe.settings.dagger().action_choice == "free"
