"""Behaviour of the turn parser: what counts as one decision, and why a turn is malformed."""

import pytest

from selskill.agent.parser import ParsedTurn, parse_turn
from selskill.agent.turn_format import forced_prefix, render_action, render_skill_call

SKILLS = {"heat_object", "common_mistakes"}


@pytest.mark.parametrize(
    "text",
    [
        "<action>go to desk 1</action>",
        "  \n<action>  go to desk 1 \n</action>\n",
        "<think>the desk may hold the mug</think>\n<action>go to desk 1</action>",
        "<think>\nlook at the desk\n</think>\n\n<action>go to desk 1</action><|im_end|>",
        "look at the desk</think>\n<action>go to desk 1</action>",  # template opened <think>
        "<action>go to desk 1</action><|im_end|>\n<|endoftext|>",
    ],
)
def test_action_turns_in_both_styles(text):
    turn = parse_turn(text, SKILLS)
    assert turn.kind == "action" and turn.ok and turn.decision == "skip"
    assert turn.action == "go to desk 1"
    assert turn.skill is None and turn.arguments == {} and turn.reason is None
    assert text[turn.decision_start :].startswith("<action>")


def test_think_text_is_kept_and_action_case_preserved():
    turn = parse_turn("<think> Mug is cold. </think><action>Open Fridge 1</action>", SKILLS)
    assert turn.think == "Mug is cold."
    assert turn.action == "Open Fridge 1"
    assert parse_turn("<action>look</action>", SKILLS).think is None


@pytest.mark.parametrize(
    "text, arguments",
    [
        ('<tool_call>{"name": "heat_object"}</tool_call>', {}),
        (
            '<tool_call>\n{"name": "heat_object", "arguments": {"object": "mug 1"}}\n</tool_call>',
            {"object": "mug 1"},
        ),
        (
            '<think>heat it</think>\n<tool_call>{"arguments": {"object": "mug 1"}, "name": "heat_object"}</tool_call>',
            {"object": "mug 1"},
        ),
        ('<tool_call>{"name": "heat_object", "arguments": null}</tool_call><|im_end|>', {}),
    ],
)
def test_skill_turns(text, arguments):
    turn = parse_turn(text, SKILLS)
    assert turn.kind == "skill" and turn.decision == "invoke"
    assert turn.skill == "heat_object" and turn.arguments == arguments
    assert turn.action is None and turn.reason is None


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "missing_tags"),
        ("go to desk 1", "missing_tags"),
        ("<think>hmm</think>", "missing_tags"),
        ("<action>go to desk 1</action><action>look</action>", "multiple_decisions"),
        (
            '<tool_call>{"name": "heat_object"}</tool_call><tool_call>{"name": "heat_object"}</tool_call>',
            "multiple_decisions",
        ),
        (
            '<think>x</think><action>look</action>\n<tool_call>{"name": "heat_object"}</tool_call>',
            "multiple_decisions",
        ),
        ('<tool_call>{"name": "fly_away"}</tool_call>', "unknown_skill:fly_away"),
        ("<tool_call>{name: heat_object}</tool_call>", "bad_json"),
        ('<tool_call>["heat_object"]</tool_call>', "bad_json"),
        ('<tool_call>{"name": "heat_object"} extra</tool_call>', "bad_json"),
        ('<tool_call>{"arguments": {}}</tool_call>', "missing_name"),
        ('<tool_call>{"name": 3}</tool_call>', "missing_name"),
        ('<tool_call>{"name": " "}</tool_call>', "missing_name"),
        ('<tool_call>{"name": "heat_object", "arguments": "mug 1"}</tool_call>', "bad_arguments"),
        ("<action>  </action>", "empty_action"),
        ("<action>go to desk 1", "unclosed_tag"),
        ('<tool_call>{"name": "heat_object"}', "unclosed_tag"),
        ("<think>never closed <action>look</action>", "unclosed_tag"),
        ("I will look. <action>look</action>", "text_outside_tags"),
        ("<action>look</action> done", "text_outside_tags"),
        ("<action>look</action></tool_call>", "text_outside_tags"),
        ("<think>a</think><think>b</think><action>look</action>", "text_outside_tags"),
        ("<action>look</action></think>", "text_outside_tags"),
    ],
)
def test_malformed_reasons(text, reason):
    turn = parse_turn(text, SKILLS)
    assert turn.kind == "malformed" and not turn.ok and turn.decision is None
    assert turn.reason == reason
    assert turn.action is None


def test_malformed_keeps_think_and_unknown_skill_name():
    turn = parse_turn(
        '<think>maybe</think><tool_call>{"name": "fly_away", "arguments": {"x": 1}}</tool_call>', SKILLS
    )
    assert turn.think == "maybe"
    assert (turn.skill, turn.arguments) == ("fly_away", {"x": 1})


@pytest.mark.parametrize(
    "text", [None, 3, "<" * 5000, "[" * 100000, "<tool_call>" + "[" * 100000 + "</tool_call>"]
)
def test_never_raises(text):
    assert isinstance(parse_turn(text, SKILLS), ParsedTurn)


def test_to_dict_is_plain_data():
    d = parse_turn(
        '<think>t</think><tool_call>{"name": "heat_object", "arguments": {"object": "mug 1"}}</tool_call>',
        SKILLS,
    ).to_dict()
    assert d == {
        "kind": "skill",
        "action": None,
        "skill": "heat_object",
        "arguments": {"object": "mug 1"},
        "think": "t",
        "reason": None,
        "decision_start": 16,
    }


@pytest.mark.parametrize("think", [None, "", "the mug is in the fridge"])
@pytest.mark.parametrize("command", ["go to desk 1", "move mug 1 to coffeemachine 1"])
def test_round_trip_action(command, think):
    turn = parse_turn(render_action(command, think=think), SKILLS)
    assert (turn.kind, turn.action, turn.think) == ("action", command, think)


@pytest.mark.parametrize("think", [None, "heat it first"])
@pytest.mark.parametrize(
    "arguments", [None, {}, {"object": "mug 1"}, {"receptacle": "microwave 1", "object": "mug 1"}]
)
def test_round_trip_skill_call(arguments, think):
    text = render_skill_call("heat_object", arguments, think=think)
    turn = parse_turn(text, SKILLS)
    assert (turn.kind, turn.skill, turn.think) == ("skill", "heat_object", think)
    assert turn.arguments == (arguments or {})


def test_forced_continuations_parse_as_the_forced_decision():
    invoke = forced_prefix("invoke", "common_mistakes") + ', "arguments": {}}</tool_call>'
    skip = forced_prefix("skip", think="go on") + "look</action>"
    assert parse_turn(invoke, SKILLS).decision == "invoke"
    assert parse_turn(skip, SKILLS).decision == "skip"
