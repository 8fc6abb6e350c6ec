"""SKILL.md loading, validation errors, the shipped ALFWorld library and the listing."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import time
from pathlib import Path

import pytest

from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.skills import FindStep, SkillError, SkillLibrary, load_skills, render_listing
from selskill.skills.loader import MAX_FILE_BYTES

EXECUTABLE = """\
---
name: warm_cup
description: Warm the held cup. Use it when the task wants a warm cup.
kind: executable
parameters:
  - name: object
    description: the cup
    required: true
    default_from: held_object
  - name: oven
    description: the oven
    default_from: receptacle:oven
preconditions:
  - holding_object
  - receptacle_exists:oven
steps:
  - "go to {oven}"
  - "heat {object} with {oven}"
---
Go to the oven, then heat the cup with it.
"""

MEMORY = """\
---
name: tips
description: General tips. Use it when unsure.
kind: memory
---
Always read the observation SECRET-BODY-LINE.
"""


def write(root: Path, name: str, text: str) -> Path:
    path = root / name / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_loads_a_valid_directory_in_name_order(tmp_path):
    write(tmp_path, "warm_cup", EXECUTABLE)
    write(tmp_path, "tips", MEMORY)
    library = load_skills(tmp_path)
    assert isinstance(library, SkillLibrary)
    assert library.names == ("tips", "warm_cup") == tuple(library)
    warm = library.get("warm_cup")
    assert warm.kind == "executable" and warm.is_executable
    assert warm.parameter_names == ("object", "oven")
    assert warm.parameters[1].required is True  # required defaults to true
    assert warm.steps == ("go to {oven}", "heat {object} with {oven}")
    assert warm.body == "Go to the oven, then heat the cup with it."
    assert library["tips"].body.startswith("Always read") and library["tips"].steps == ()
    assert library.get("nope") is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        warm.name = "other"


def _replace(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


BROKEN = {
    "missing_description": (
        lambda: _replace(MEMORY, "description: General tips. Use it when unsure.\n", ""),
        "'description': missing",
    ),
    "unknown_kind": (lambda: _replace(MEMORY, "kind: memory", "kind: magic"), "'kind': unknown kind 'magic'"),
    "bad_name": (lambda: _replace(MEMORY, "name: tips", "name: Tips"), "'name': must be snake_case"),
    "name_not_dir": (lambda: _replace(MEMORY, "name: tips", "name: hints"), "must equal its directory name"),
    "unknown_field": (
        lambda: _replace(MEMORY, "kind: memory", "kind: memory\nwhen: always"),
        "'when': unknown field",
    ),
    "unknown_precondition": (
        lambda: _replace(EXECUTABLE, "  - holding_object\n", "  - holding_something\n"),
        "unknown precondition 'holding_something'",
    ),
    "precondition_without_type": (
        lambda: _replace(EXECUTABLE, "receptacle_exists:oven", "receptacle_exists"),
        "needs a type",
    ),
    "placeholder_not_parameter": (
        lambda: _replace(EXECUTABLE, '"go to {oven}"', '"go to {stove}"'),
        "'steps[0]': placeholder {stove} is not a parameter",
    ),
    "bad_default_from": (
        lambda: _replace(EXECUTABLE, "default_from: held_object", "default_from: pocket"),
        "'parameters[0].default_from': unknown default_from 'pocket'",
    ),
    "no_steps": (lambda: EXECUTABLE.split("steps:")[0] + "---\nbody\n", "'steps': an executable skill needs"),
    "memory_with_steps": (
        lambda: _replace(MEMORY, "kind: memory", 'kind: memory\nsteps: ["look"]'),
        "'steps': only executable skills",
    ),
    "no_front_matter": (lambda: "just text\n", "missing front matter"),
    "unsafe_yaml": (
        lambda: _replace(MEMORY, "name: tips", "name: !!python/object/apply:os.getcwd []"),
        "not valid YAML",
    ),
    "empty_body": (lambda: MEMORY.split("Always")[0], "'body': empty"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_invalid_skill_files_name_the_file_and_field(tmp_path, case):
    make, expected = BROKEN[case]
    name = "warm_cup" if "warm_cup" in make() else "tips"
    path = write(tmp_path, name, make())
    with pytest.raises(SkillError) as info:
        load_skills(tmp_path)
    message = str(info.value)
    assert str(path) in message
    assert expected in message


def test_duplicate_names_name_both_files(tmp_path):
    first = write(tmp_path / "a", "tips", MEMORY)
    second = write(tmp_path / "b", "tips", MEMORY)
    with pytest.raises(SkillError, match="duplicate skill name 'tips'") as info:
        load_skills(tmp_path / "a", tmp_path / "b")
    assert str(first) in str(info.value) and str(second) in str(info.value)
    # Nested folders of one directory are searched too, and collide the same way.
    with pytest.raises(SkillError, match="duplicate"):
        load_skills(tmp_path)


def test_missing_directory_is_an_error(tmp_path):
    with pytest.raises(SkillError, match="not found"):
        load_skills(tmp_path / "absent")


# --- the shipped ALFWorld library ----------------------------------------------------------

EXECUTABLES = {"heat_object", "cool_object", "clean_object", "examine_with_light"}
MEMORIES = {
    "common_mistakes",
    "find_second_object",
    "pick_and_place",
    "place_held_object",
    "recovery_strategy",
    "systematic_search",
}
# alfworld 0.4.2's command grammar (alfred.twl2); `put X in/on Y` is not part of it.
VERBS = re.compile(
    r"^(go to|open|close|take \S.* from|move \S.* to|heat|cool|clean|use|examine|inventory$|look$)"
)
COMMAND_WORDS = re.compile(r"^(go to|open|close|take|move|heat|cool|clean|use|examine|inventory|look)\b")


def test_shipped_library_has_the_expected_skills():
    library = load_alfworld_skills()
    assert set(library.names) == EXECUTABLES | MEMORIES
    assert {n for n, s in library.items() if s.kind == "executable"} == EXECUTABLES
    for skill in library.values():
        assert skill.description and skill.body
        assert skill.path and skill.path.endswith(f"{skill.name}/SKILL.md")


def test_shipped_steps_use_the_current_grammar():
    library = load_alfworld_skills()
    for name in EXECUTABLES:
        commands = [s for s in library[name].steps if isinstance(s, str)]
        assert commands, name
        for command in commands:
            assert VERBS.match(command), (name, command)
            assert not command.startswith("put "), (name, command)


def test_bodies_are_short_and_only_suggest_commands_of_the_grammar():
    library = load_alfworld_skills()
    for name in MEMORIES:
        assert 5 <= len(library[name].body.splitlines()) <= 12, name
    for skill in library.values():
        for line in skill.body.splitlines():
            if "do nothing" in line:
                continue  # common_mistakes names the old `put` grammar as what not to use
            for command in re.findall(r"`([^`]+)`", line):
                assert COMMAND_WORDS.match(command), (skill.name, command)


def test_examine_with_light_states_its_search_order():
    skill = load_alfworld_skills()["examine_with_light"]
    find = skill.steps[0]
    assert isinstance(find, FindStep) and find.target == "desklamp" and find.bind == "lamp"
    assert find.visit[:3] == ("sidetable", "desk", "dresser")
    assert skill.steps[1] == "use {lamp}"
    assert "sidetable" in skill.body  # the body documents the same order


# --- the listing ------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["compact", "full"])
def test_listing_has_every_name_and_no_body(style):
    library = load_alfworld_skills()
    listing = render_listing(library, style=style)
    positions = [listing.index(f"- {name}") for name in library.names]
    assert positions == sorted(positions)
    for skill in library.values():
        assert skill.description in listing
        for line in skill.body.splitlines():
            if len(line.strip()) > 25:
                assert line.strip() not in listing, (skill.name, line)
    assert render_listing(library, style=style) == listing


def test_compact_listing_shows_parameter_names(tmp_path):
    write(tmp_path, "warm_cup", EXECUTABLE)
    write(tmp_path, "tips", MEMORY)
    listing = render_listing(load_skills(tmp_path))
    assert listing.splitlines() == [
        "- tips: General tips. Use it when unsure.",
        "- warm_cup(object?, oven?): Warm the held cup. Use it when the task wants a warm cup.",
    ]
    assert "SECRET-BODY-LINE" not in render_listing(load_skills(tmp_path), style="full")
    with pytest.raises(ValueError, match="unknown listing style"):
        render_listing(load_skills(tmp_path), style="verbose")


# --- hostile files: bounded as import-skills bounds them ----------------------------------------


def _alias_bomb(levels: int) -> str:
    """Front matter whose `name` expands to 10**levels strings through nested aliases (a "billion laughs")."""
    levels_ = ['&a0 "lol"'] + [f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return f"---\nname: [{', '.join(levels_)}]\ndescription: d\nkind: memory\n---\nbody\n"


@contextlib.contextmanager
def _deadline(seconds: int):
    """Fail (instead of hanging the suite) when the block runs past `seconds`."""

    def expired(*_):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_yaml_alias_bomb_is_refused_in_a_short_error(tmp_path):
    path = write(tmp_path, "tips", _alias_bomb(7))  # 10 million strings once expanded
    started = time.monotonic()
    with _deadline(20), pytest.raises(SkillError) as info:
        load_skills(tmp_path)
    message = str(info.value)
    assert time.monotonic() - started < 2
    assert message.startswith(f"{path}: ") and "YAML aliases" in message and len(message) < 400
    # aliases that expand a little stay allowed
    small = MEMORY.replace("kind: memory", "kind: &k memory\nx: [*k, *k]")
    write(tmp_path, "tips", small)
    with pytest.raises(SkillError, match="'x': unknown field"):  # read, then judged on its fields
        load_skills(tmp_path)


def test_hostile_files_are_refused_naming_the_file_and_the_reason(tmp_path):
    """A link loop, a FIFO and an oversized file named SKILL.md: a one-line SkillError each, never a hang."""
    loop = tmp_path / "loop" / "loop"
    loop.parent.mkdir(parents=True)
    (loop.parent / "SKILL.md").symlink_to("SKILL.md")
    fifo = tmp_path / "fifo" / "fifo" / "SKILL.md"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    big = write(tmp_path / "big", "tips", MEMORY + "x" * MAX_FILE_BYTES)
    cases = {
        tmp_path / "loop": ("link_loop", loop.parent / "SKILL.md"),
        tmp_path / "fifo": ("not_a_file", fifo),
        tmp_path / "big": ("too_large", big),
    }
    for root, (reason, path) in cases.items():
        with _deadline(10), pytest.raises(SkillError) as info:
            load_skills(root)
        assert str(info.value).startswith(f"{path}: {reason}: "), str(info.value)
        assert "\n" not in str(info.value)
    assert list(load_skills(tmp_path / "big", max_file_bytes=None)) == ["tips"]
