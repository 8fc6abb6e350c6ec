"""Behaviour of the chat format and the decision renderers."""

import json

import pytest

from selskill.agent.turn_format import (
    ACTION_OPEN,
    TOOL_CALL_OPEN,
    forced_prefix,
    render_action,
    render_skill_call,
)
from selskill.benchmarks.alfworld.turn_format import AlfworldTurnFormat

LISTING = "- heat_object: Heat an object with a microwave.\n- common_mistakes: Mistakes to avoid."


def test_render_action_exact_text():
    assert render_action("go to desk 1") == "<action>go to desk 1</action>"
    assert render_action(" look \n", think=" t ") == "<think>t</think>\n<action>look</action>"
    with pytest.raises(ValueError):
        render_action("  ")


def test_render_skill_call_exact_text():
    assert render_skill_call("heat_object") == '<tool_call>{"name": "heat_object"}</tool_call>'
    assert render_skill_call("heat_object", {}) == '<tool_call>{"name": "heat_object"}</tool_call>'
    assert (
        render_skill_call("heat_object", {"object": "mug 1"})
        == '<tool_call>{"name": "heat_object", "arguments": {"object": "mug 1"}}</tool_call>'
    )
    a = render_skill_call("x", {"b": 1, "a": [1, 2]}, think="why")
    assert a == render_skill_call("x", {"a": [1, 2], "b": 1}, think="why")
    assert a == '<think>why</think>\n<tool_call>{"name": "x", "arguments": {"a": [1, 2], "b": 1}}</tool_call>'
    with pytest.raises(ValueError):
        render_skill_call("")


def test_rendered_call_is_the_json_separator_style():
    inner = render_skill_call("heat_object", {"object": "mug 1"})[len(TOOL_CALL_OPEN) : -len("</tool_call>")]
    assert inner == json.dumps(
        {"name": "heat_object", "arguments": {"object": "mug 1"}}, separators=(", ", ": ")
    )


@pytest.mark.parametrize("think", [None, "reasoning"])
@pytest.mark.parametrize("arguments", [None, {"object": "mug 1"}])
def test_forced_prefix_is_a_prefix_of_the_rendered_turn(arguments, think):
    assert forced_prefix("invoke", "heat_object") == '<tool_call>{"name": "heat_object"'
    assert forced_prefix("skip") == ACTION_OPEN
    call = render_skill_call("heat_object", arguments, think=think)
    assert call.startswith(forced_prefix("invoke", "heat_object", think=think))
    assert render_action("go to desk 1", think=think).startswith(forced_prefix("skip", think=think))
    # A prefix for one skill is not a prefix of a call to a longer-named skill.
    assert not render_skill_call("heat_object_twice").startswith(forced_prefix("invoke", "heat_object") + "}")


def test_forced_prefix_rejects_misuse():
    with pytest.raises(ValueError):
        forced_prefix("invoke")
    with pytest.raises(ValueError):
        forced_prefix("skip", "heat_object")
    with pytest.raises(ValueError):
        forced_prefix("act")


@pytest.mark.parametrize("style", ["thinking", "compact"])
def test_system_message_is_deterministic_and_explains_the_protocol(style):
    fmt = AlfworldTurnFormat(style=style)
    msg = fmt.system_message(LISTING)
    assert msg["role"] == "system"
    assert LISTING in msg["content"]
    assert msg == fmt.system_message(LISTING) == AlfworldTurnFormat(style=style).system_message(LISTING)
    text = msg["content"].lower()
    for needle in ("<action>", "<tool_call>", "one decision", "admissible", "description only", "invoke"):
        assert needle in text
    assert ("<think>" in text) == (style == "thinking")


def test_compact_system_text_is_shorter():
    assert len(AlfworldTurnFormat(style="compact").system_text(LISTING)) < len(
        AlfworldTurnFormat().system_text(LISTING)
    )


def test_empty_listing_is_explicit():
    assert "(none)" in AlfworldTurnFormat().system_text("")


def test_invalid_style_fails_loudly():
    with pytest.raises(ValueError):
        AlfworldTurnFormat(style="verbose")


def test_turn_format_is_frozen():
    with pytest.raises(AttributeError):
        AlfworldTurnFormat().style = "compact"


def test_observation_message_task_and_admissible_commands():
    fmt = AlfworldTurnFormat(show_admissible_commands=True)
    msg = fmt.observation_message("You are in a room.", ["go to desk 1", "look"], task="put a mug in desk 1.")
    assert msg == {
        "role": "user",
        "content": "You are in a room.\nYour task is to: put a mug in desk 1.\nAdmissible commands: go to desk 1; look",
    }
    hidden = AlfworldTurnFormat(show_admissible_commands=False).observation_message(
        "Nothing happens.", ["look"]
    )
    assert hidden == {"role": "user", "content": "Nothing happens."}
    assert fmt.observation_message("Nothing happens.")["content"] == "Nothing happens."


def test_task_already_in_observation_is_not_repeated():
    obs = "You are in a room.\n\nYour task is to: put a mug in desk 1."
    content = AlfworldTurnFormat(show_admissible_commands=False).observation_message(
        obs, task="put a mug in desk 1."
    )["content"]
    assert content.count("put a mug in desk 1") == 1


def test_role_messages():
    fmt = AlfworldTurnFormat(style="compact")
    assert fmt.skill_return_message("Heat with microwave.") == {
        "role": "tool",
        "content": "Heat with microwave.",
    }
    turn = render_action("look")
    assert fmt.assistant_message(turn) == {"role": "assistant", "content": turn}
    assert AlfworldTurnFormat().thinks and not fmt.thinks


def test_task_reminder_repeats_the_task_after_every_observation():
    from selskill.agent.transcript import after_action, after_malformed, after_skill
    from selskill.envs.base import EnvState

    state = EnvState("You arrive at desk 1.", ["go to bed 1", "look"], "put a mug in desk 1.")
    plain = AlfworldTurnFormat(style="compact")
    reminded = AlfworldTurnFormat(style="compact", task_reminder=True)
    assert "Your task is to" not in after_action(plain, state)["content"]
    for message in (
        after_action(reminded, state),
        after_malformed(reminded, state),
        after_skill(reminded, "ok", state),
    ):
        lines = message["content"].split("\n")
        assert lines[-2:] == [
            "Your task is to: put a mug in desk 1.",
            "Admissible commands: go to bed 1; look",
        ]
