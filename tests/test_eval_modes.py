"""The paper's Appendix D baselines as eval modes: what each mode puts in the prompt, which
skills it lets the policy call, and how calls are recorded in an episode."""

import json
import shutil

import pytest
from fixtures_run import write_fixture_run
from test_runner import ScriptedPolicy

from selskill import report as rp
from selskill.agent.episode_host import EpisodeSpec
from selskill.agent.eval_modes import (
    CONSERVATIVE_INSTRUCTION,
    CSI_PLACEMENT,
    MODES,
    SKIP_SKILL,
    capability_check_stats,
    prompt_setup,
)
from selskill.agent.runner import EpisodeRunner, RunnerConfig
from selskill.agent.turn_format import (
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_OPEN,
    render_action,
    render_skill_call,
)
from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.benchmarks.alfworld.env import AlfworldEnv, find_games
from selskill.benchmarks.alfworld.turn_format import AlfworldTurnFormat
from selskill.policy.hf import HFPolicy
from selskill.policy.settings import HFSettings
from selskill.skills import render_listing
from selskill.skills.pseudo_skills import CAPABILITY_CHECK_INSTRUCTION
from selskill.stages.evaluate import EvalConfig

FMT = AlfworldTurnFormat(style="compact", admissible_style="local")
LIB = load_alfworld_skills()


def _system(mode):
    setup = prompt_setup(mode, LIB, FMT, "compact")
    return setup, setup.fmt.system_text(setup.skill_text)


def test_skills_mode_is_the_training_prompt():
    setup, text = _system("skills")
    assert text == FMT.system_text(render_listing(LIB, style="compact"))
    assert setup.library.names == LIB.names


def test_no_skills_has_neither_listing_nor_tool():
    setup, text = _system("no_skills")
    assert len(setup.library) == 0
    assert TOOL_CALL_OPEN not in text and "Skills" not in text
    assert not any(name in text for name in LIB.names)


def test_skills_as_context_shows_every_body_and_no_tool():
    setup, text = _system("skills_as_context")
    assert len(setup.library) == 0 and TOOL_CALL_OPEN not in text
    for skill in LIB.values():
        assert skill.body.strip() in text, skill.name


def test_conservative_adds_the_instruction_to_the_usual_prompt():
    setup, text = _system("conservative")
    usual = FMT.system_text(render_listing(LIB, style="compact"))
    assert CONSERVATIVE_INSTRUCTION in text and text != usual
    assert text.replace(CONSERVATIVE_INSTRUCTION + "\n\n", "") == usual
    assert setup.library.names == LIB.names


def test_explicit_skip_lists_self_reasoning():
    setup, text = _system("explicit_skip")
    assert set(setup.library.names) == set(LIB.names) | {SKIP_SKILL}
    assert f"- {SKIP_SKILL}: " in text and "no other skill is applicable" in text


def test_unknown_mode_fails_naming_the_choices():
    with pytest.raises(ValueError, match="no_skills"):
        prompt_setup("nope", LIB, FMT, "compact")
    with pytest.raises(ValueError, match="eval_mode 'nope'"):
        EvalConfig(eval_mode="nope")
    assert EvalConfig().stage == "eval" and EvalConfig(eval_mode="conservative").stage == "eval-conservative"
    assert set(MODES) == {
        "skills",
        "no_skills",
        "skills_as_context",
        "conservative",
        "explicit_skip",
        "listing_noise",
        "capability_check",
    }
    assert EvalConfig(eval_mode="capability_check").stage == "eval-capability_check"


def test_capability_check_adds_the_papers_instruction_and_where_the_lines_go():
    setup, text = _system("capability_check")
    usual = FMT.system_text(render_listing(LIB, style="compact"))
    assert CAPABILITY_CHECK_INSTRUCTION in text and CSI_PLACEMENT in text and THINK_OPEN in CSI_PLACEMENT
    assert text.replace(f"{CAPABILITY_CHECK_INSTRUCTION} {CSI_PLACEMENT}\n\n", "") == usual
    assert setup.library.names == LIB.names


def _check(decision: str) -> str:
    return (
        f"{THINK_OPEN}SUBGOAL: find the mug\nEVIDENCE: not on the table\nCAPABILITY: searching\n"
        f"DECISION: {decision}\nNEXT: open the cabinet; success: I see a mug{THINK_CLOSE}\n"
    )


def _turn(text: str, kind: str, skill: str | None = None, forced: bool = False) -> dict:
    return {"text": text, "kind": kind, "skill": skill, "forced": forced}


def test_capability_check_stats_count_checks_agreement_and_named_skills():
    rows = [
        {
            "turns": [
                # checked, agrees, names the skill it calls
                _turn(
                    _check("MATCH systematic_search") + render_skill_call("systematic_search"),
                    "skill",
                    "systematic_search",
                ),
                # checked, agrees (an action after NO_CAPABILITY_GAP)
                _turn(_check("NO_CAPABILITY_GAP") + render_action("open cabinet 1"), "action"),
            ]
        },
        {
            "turns": [
                # checked, disagrees (announces a call, acts), and a call that names another skill
                _turn(_check("MATCH heat_object") + render_action("look"), "action"),
                _turn(_check("MATCH heat_object") + render_skill_call("cool_object"), "skill", "cool_object"),
                _turn(render_action("look"), "action"),  # no check
                _turn(
                    render_skill_call("heat_object"), "skill", "heat_object", forced=True
                ),  # a fork's, not the policy's
                _turn("<action>look", "malformed"),  # no decision
            ]
        },
    ]
    got = capability_check_stats(rows)
    assert got["decisions"] == 5 and got["calls"] == 2
    assert got["checked_share"] == pytest.approx(4 / 5)
    assert got["calls_checked_share"] == 1.0
    assert got["decision_agrees_share"] == pytest.approx(3 / 4)
    assert got["match_names_called_skill_share"] == pytest.approx(1 / 2)
    assert capability_check_stats([])["checked_share"] is None


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return HFPolicy(str(tiny_model_dir), HFSettings(batch_size=4))


def _play(policy, small_games, mode, texts):
    index = find_games(small_games)
    setup = prompt_setup(mode, LIB, FMT, "compact")
    runner = EpisodeRunner(
        ScriptedPolicy(policy, texts),
        lambda: AlfworldEnv(index),
        setup.library,
        setup.fmt,
        RunnerConfig(max_env_steps=3, max_new_tokens=16),
        skill_text=setup.skill_text,
    )
    task = AlfworldEnv(index).task_ids()[0]
    return runner.run([EpisodeSpec("e", task, seed=0)])[0]


def test_episode_under_explicit_skip_and_no_skills(policy, small_games):
    texts = [render_skill_call(SKIP_SKILL), render_skill_call("systematic_search"), render_action("look")]
    skip = _play(policy, small_games, "explicit_skip", texts)
    system = json.loads(skip.messages)[0]["content"]
    assert SKIP_SKILL in system
    first, second = skip.turns[:2]
    assert first.skill == SKIP_SKILL and first.exec_precise is True and first.env_steps == 0
    assert second.exec_precise is True  # the usual skills stay callable

    bare = _play(policy, small_games, "no_skills", texts)
    system = json.loads(bare.messages)[0]["content"]
    assert "systematic_search" not in system
    # a call the mode does not offer is a failed call, like any unknown skill
    calls = [t for t in bare.turns if TOOL_CALL_OPEN in t.text]
    assert calls and all(t.exec_precise is False for t in calls)
    assert bare.n_skill_calls == len(calls) and bare.n_precise_calls == 0


def test_report_shows_the_baselines(tmp_path):
    exp = write_fixture_run(tmp_path / "runs", "fixture")
    r0 = json.loads((exp / "round_0" / "eval" / "metrics.json").read_text())
    (exp / "round_0" / "eval-conservative").mkdir()
    cons = json.loads(json.dumps(r0))
    cons["mode"] = "conservative"
    split = next(iter(cons["splits"]))
    cons["splits"][split]["overall"]["skill_per_ep"] = 0.25
    (exp / "round_0" / "eval-conservative" / "metrics.json").write_text(json.dumps(cons))
    md = rp.build_report(exp).markdown.read_text()
    assert "## Engineering baselines (the paper's Appendix D)" in md
    section = md.split("## Engineering baselines")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| init")]
    assert [r.split("|")[2].strip() for r in rows][:2] == ["skills", "conservative"]
    assert any("0.25" in r for r in rows if "conservative" in r)
    shutil.rmtree(exp / "round_0" / "eval-conservative")
    assert "Engineering baselines" not in rp.build_report(exp).markdown.read_text()
