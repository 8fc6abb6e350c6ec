"""Demonstrations for the init SFT: winning, real skill records, the runner's message format."""

import dataclasses

import pytest

from selskill.agent.eval_modes import prompt_setup
from selskill.agent.parser import parse_turn
from selskill.agent.transcript import after_action, after_skill, opening_messages
from selskill.agent.turn_format import render_action, render_skill_call
from selskill.benchmarks.alfworld import generate as alfworld_gen
from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.benchmarks.alfworld.demos import (
    DEMO_FORMAT,
    DEMO_LISTING_STYLE,
    TASK_SKILL,
    DemoBudget,
    DemoMix,
    build_demos,
    make_demos,
    tokenizer_corpus,
)
from selskill.benchmarks.alfworld.env import AlfworldEnv, find_games
from selskill.benchmarks.alfworld.episode import NAVIGATION
from selskill.benchmarks.alfworld.expert import search_order
from selskill.envs.base import natural_key
from selskill.skills import SkillExecutor, render_listing

# every decision point fires (a random memory call on every turn would never end: off)
ALL_ON = dataclasses.replace(
    DemoMix(**{f.name: 1.0 for f in dataclasses.fields(DemoMix) if f.name != "search"}),
    random_memory=0.0,
    mistake=0.0,
    no_skills=0.0,  # every game with the skills listed
)


@pytest.fixture(scope="module")
def games(tmp_path_factory):
    """Two small train games per task type."""
    root = tmp_path_factory.mktemp("demo_games")
    alfworld_gen.generate_games(root, per_type=2, seed=3, split="train", size="small")
    return find_games(root, "train")


@pytest.fixture(scope="module")
def report(games):
    return build_demos(games, seed=0)


def _replay(games, demo):
    """Re-run a demo's assistant turns on a fresh env; rebuild the transcript the runner's way."""
    # a game played without skills is written in the prompt the eval's no_skills mode plays
    mode = "skills" if demo.skills_listed else "no_skills"
    setup = prompt_setup(mode, load_alfworld_skills(), DEMO_FORMAT, DEMO_LISTING_STYLE)
    library, fmt = setup.library, setup.fmt
    executor = SkillExecutor(library, NAVIGATION)
    env = AlfworldEnv(games)
    state = env.reset(demo.task_id)
    messages = opening_messages(fmt, setup.skill_text, state)
    records = []
    for message in demo.messages[2:]:
        if message["role"] != "assistant":
            continue
        turn = parse_turn(message["content"], library.names)
        assert turn.kind in ("action", "skill"), message
        if turn.kind == "action":
            messages.append(fmt.assistant_message(render_action(turn.action)))
            state = env.step(turn.action)
            messages.append(after_action(fmt, state))
        else:
            messages.append(fmt.assistant_message(render_skill_call(turn.skill, turn.arguments)))
            record = executor.execute(env, turn.skill, turn.arguments)
            records.append(record)
            state = env.state
            messages.append(after_skill(fmt, record.observation, state))
    return messages, records, state


def test_every_demo_wins_and_replays_to_the_same_messages(games, report):
    assert report.attempted == len(games.games) == 12
    assert len(report.demos) >= 11, report.dropped
    for demo in report.demos:
        messages, records, state = _replay(games, demo)
        assert state.won, demo.task_id
        assert messages == demo.messages  # built with the transcript builders, true skill returns
        assert [r.precise for r in records] == [c["precise"] for c in demo.calls]
        assert [r.error for r in records] == [c["error"] for c in demo.calls]
        assert demo.n_skill_calls == len(records)
        assert demo.n_precise == sum(r.precise for r in records)


def test_messages_alternate(report):
    for demo in report.demos:
        roles = [m["role"] for m in demo.messages]
        assert roles[:2] == ["system", "user"]
        assert "Your task is to:" in demo.messages[1]["content"]
        body = roles[2:]
        assert body[0::2] == ["assistant"] * (len(body) // 2 + len(body) % 2)
        assert all(r in ("user", "tool") for r in body[1::2])
        for i, m in enumerate(demo.messages):
            if m["role"] == "tool":  # a skill return follows a skill call and only a skill call
                assert demo.messages[i - 1]["content"].startswith("<tool_call>")
            if m["role"] == "assistant":
                assert m["content"].startswith(("<action>", "<tool_call>"))


def test_premature_calls_fail_their_precondition_and_useful_calls_execute(small_games):
    report = build_demos(small_games, seed=1, mix=ALL_ON)
    demos = report.demos
    assert len(demos) == 6, report.dropped
    roles = {c["role"] for d in demos for c in d.calls}
    assert {
        "opening",
        "premature",
        "repeat",
        "after_failure",
        "useful",
        "second_memory",
        "wrong_exec",
    } <= roles
    for demo in demos:
        task_skill = TASK_SKILL.get(demo.task_type)
        assert demo.calls[0]["role"] == "opening"
        for call in demo.calls:
            if call["role"] == "premature":
                assert call["skill"] == task_skill
                assert not call["precise"]
                assert call["error"] == "precondition_failed:holding_object"
                assert call["env_steps"] == 0
            if call["role"] == "useful":
                assert call["skill"] == task_skill
                assert call["precise"], call
                assert call["env_steps"] >= 1
        if task_skill:
            assert any(c["role"] == "premature" for c in demo.calls)
            assert any(c["role"] == "useful" for c in demo.calls)
        if demo.task_type == "pick_two_obj_and_place":
            assert any(c["skill"] == "find_second_object" for c in demo.calls)


def test_bare_expert_calls_no_skill_and_still_wins(small_games):
    report = build_demos(small_games, seed=0, mix=DemoMix.none())
    assert len(report.demos) == 6, report.dropped
    assert all(d.n_skill_calls == 0 for d in report.demos)
    assert all(
        m["content"].startswith("<action>")
        for d in report.demos
        for m in d.messages
        if m["role"] == "assistant"
    )


def test_a_demonstration_longer_than_the_decision_budget_is_dropped(small_games):
    """A demonstration is kept only if won within the rounds' step budget counted as the runner
    counts it, in decisions: skill calls that run no command spend it too."""
    free = build_demos(small_games, seed=0, budget=DemoBudget(1000, 1000)).demos
    # the longest demonstration whose calls cost decisions but no commands: one decision over
    longest = max((d for d in free if d.env_steps < d.n_turns), key=lambda d: d.n_turns)
    budget = longest.n_turns - 1
    capped = build_demos(small_games, seed=0, budget=DemoBudget(budget, budget))
    assert longest.env_steps <= budget and longest.task_id not in {d.task_id for d in capped.demos}
    within = [d for d in free if d.n_turns <= budget and d.env_steps <= budget]
    assert [d.messages for d in capped.demos] == [d.messages for d in within]
    assert all(d.n_turns <= budget for d in capped.demos) and capped.dropped["step_limit"] >= 1


def test_injected_mistakes_are_recovered_from(small_games):
    report = build_demos(small_games, seed=2, mix=dataclasses.replace(DemoMix.none(), mistake=0.4))
    assert len(report.demos) == 6, report.dropped
    mistakes = [m for d in report.demos for m in d.mistakes]
    assert len(mistakes) >= 4 and all(m.startswith("go to ") for m in mistakes)
    texts = [m["content"] for d in report.demos for m in d.messages]
    assert any(t.startswith("Nothing happens.") for t in texts)  # some led nowhere...
    assert all(d.n_skill_calls == 0 for d in report.demos)  # ...and the expert carried on to the win


def test_default_mix_is_wasteful_like_rl_init(report):
    from selskill.sft.demos import demo_stats

    listed = [d for d in report.demos if d.skills_listed]  # the others call nothing (no_skills)
    stats = demo_stats(listed)
    # a small set: loose bounds around the documented ~2.5 calls per demo at ~70% precision
    assert 1.5 <= stats["skill_calls_per_demo"] <= 4.0, stats
    assert 0.5 <= stats["exec_precision"] <= 0.9, stats
    roles = stats["calls_by_role"]
    assert roles.get("useful", 0) > 0 and roles.get("premature", 0) > 0 and roles.get("opening", 0) > 0
    redundant = sum(
        roles.get(r, 0) for r in ("opening", "random_memory", "place_memory", "second_memory", "wrong_exec")
    )
    assert redundant >= len(listed) * 0.4
    with_task_skill = [d for d in listed if d.task_type in TASK_SKILL]
    premature = sum(1 for d in with_task_skill for c in d.calls if c["role"] == "premature")
    # premature_start 0.6 + premature_seen 0.3 per demo with a task skill
    assert 0.3 * len(with_task_skill) <= premature <= 1.6 * len(with_task_skill)


def test_same_seed_same_demos_other_seed_other_mix(games, report):
    subset = games.games[::2]
    again = make_demos(subset, seed=0)
    by_id = {d.task_id: d for d in report.demos}
    assert again and [d.to_dict() for d in again] == [by_id[d.task_id].to_dict() for d in again]
    other = make_demos(subset, seed=5)
    assert [d.messages for d in other] != [d.messages for d in again]


def test_expert_explores_in_a_plausible_order():
    receptacles = [
        "cabinet 2",
        "cabinet 1",
        "countertop 1",
        "fridge 1",
        "garbagecan 1",
        "sinkbasin 1",
        "toilet 1",
    ]
    order = search_order(receptacles, "potato", exclude_type="countertop")
    assert "countertop 1" not in order  # the target receptacle type is not searched
    assert order.index("cabinet 1") < order.index("cabinet 2")  # lowest number first
    assert order.index("fridge 1") < order.index("toilet 1")  # where potatoes usually are first
    lamp = search_order(["desk 1", "bed 1", "sidetable 1", "drawer 1"], "desklamp")
    assert lamp[:2] == ["sidetable 1", "desk 1"]  # examine_with_light's order


def test_sweep_search_visits_every_receptacle_in_name_order(small_games):
    receptacles = ["toilet 1", "cabinet 2", "fridge 1", "countertop 1", "cabinet 1"]
    order = search_order(receptacles, "potato", exclude_type="countertop", style="sweep")
    assert order == ["cabinet 1", "cabinet 2", "fridge 1", "toilet 1"]
    report = build_demos(small_games, seed=0, mix=dataclasses.replace(DemoMix.none(), search="sweep"))
    assert len(report.demos) == 6, report.dropped
    for demo in report.demos:
        actions = [parse_turn(m["content"], ()).action for m in demo.messages if m["role"] == "assistant"]
        first_take = next(i for i, a in enumerate(actions) if a.startswith("take "))
        searched = [a[len("go to ") :] for a in actions[:first_take] if a.startswith("go to ")]
        assert searched == sorted(searched, key=natural_key), (demo.task_id, searched)
    with pytest.raises(ValueError, match="DemoMix.search"):
        DemoMix(search="random")


def test_tokenizer_corpus_covers_prompt_skills_and_decisions(report):
    texts = list(tokenizer_corpus(report.demos[:2]))
    joined = "\n".join(texts)
    library = load_alfworld_skills()
    assert texts[0] == DEMO_FORMAT.system_text(render_listing(library, DEMO_LISTING_STYLE))
    for skill in library.values():
        assert skill.body in joined
        assert render_skill_call(skill.name) in joined
    assert "<action>" in joined and "Admissible commands:" in joined


def test_false_takes_are_untrained_wrong_moves_the_expert_recovers_from(games):
    """At a searched receptacle without the task's object the expert first tries to take it from
    there: "Nothing happens.", the turn is context only, and the expert's next (trained) turn moves on."""
    mix = dataclasses.replace(DemoMix(), false_take=1.0, mistake=0.0)
    demos = build_demos(games, mix=mix, seed=0).demos
    found = 0
    for demo in demos:
        turns = [i for i, m in enumerate(demo.messages) if m["role"] == "assistant"]
        for k in demo.untrained_turns:
            i = turns[k]
            action = parse_turn(demo.messages[i]["content"], ()).action
            assert action.startswith("take ") and " from " in action
            assert demo.messages[i + 1]["content"].startswith("Nothing happens.")
            assert k + 1 < len(turns) and k + 1 not in demo.untrained_turns
            nxt = parse_turn(demo.messages[turns[k + 1]]["content"], ()).action
            assert nxt != action  # the recovery is not a repeat
            found += 1
    assert found >= len(games.games) // 4
    # off (the default) draws nothing: the demonstrations are those of the plain mix
    plain = build_demos(games, mix=dataclasses.replace(DemoMix(), mistake=0.0), seed=0).demos
    again = build_demos(games, mix=dataclasses.replace(mix, false_take=0.0), seed=0).demos
    assert [d.messages for d in plain] == [d.messages for d in again]


def test_a_share_of_the_games_is_played_without_skills_in_the_no_skills_prompt(games):
    """`no_skills` plays that share of the games as the expert alone, in the eval's no_skills prompt
    (no skill section: the replay above checks it message for message), and leaves the calls of
    the games played with the skills listed as they were (its own draw)."""
    listed_only = build_demos(games, seed=0, mix=dataclasses.replace(DemoMix(), no_skills=0.0))
    half = build_demos(games, seed=0, mix=dataclasses.replace(DemoMix(), no_skills=0.5))
    every = build_demos(games, seed=0, mix=dataclasses.replace(DemoMix(), no_skills=1.0))
    bare = [d for d in half.demos if not d.skills_listed]
    assert 0 < len(bare) < len(half.demos)
    assert all(not d.calls and "Skills:" not in d.messages[0]["content"] for d in bare)
    assert all(not d.skills_listed and not d.calls for d in every.demos)
    assert all(d.skills_listed for d in listed_only.demos)
    with_skills = {d.task_id: d for d in listed_only.demos}
    for d in half.demos:
        if d.skills_listed:
            assert d.messages == with_skills[d.task_id].messages
    assert half.stats()["demos_without_skills"] == len(bare)
