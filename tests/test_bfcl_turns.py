"""The BFCL turn format and episode host (selskill/benchmarks/bfcl/episode.py), the recipe rules of `benchmark: bfcl`,
and the one rule of what a step is per benchmark (label efficiency, Avg. Steps)."""

from __future__ import annotations

import functools
import json
from collections import Counter

import pytest

pytest.importorskip("bfcl_eval")

from fixtures_run import chat_fields  # noqa: E402

from selskill.benchmarks.bfcl.episode import (  # noqa: E402
    MALFORMED_FEEDBACK,
    BfclHooks,
    BfclTurnFormat,
    after_step,
    broken_call_list,
    opening_messages,
    render_calls,
    render_end_turn,
)


def bfcl_runner(*args, **kwargs):
    """An EpisodeRunner playing BFCL episodes with BFCL's hooks, as the registry's spec gives them."""
    from selskill.agent.runner import EpisodeRunner

    return EpisodeRunner(*args, hooks=BfclHooks(), **kwargs)


from selskill.agent.episode_host import EpisodeSpec  # noqa: E402
from selskill.agent.parser import parse_turn  # noqa: E402
from selskill.agent.runner import RunnerConfig  # noqa: E402
from selskill.agent.turn_format import render_skill_call  # noqa: E402
from selskill.benchmarks.bfcl import load_bfcl_skills  # noqa: E402
from selskill.benchmarks.bfcl.env import (  # noqa: E402
    BfclEnv,
    function_docs,
    ground_truth_commands,
    render_function_docs,
    task_function_docs,
)
from selskill.data.schema import ROLE_OBSERVATION, ROLE_SKILL_RETURN  # noqa: E402
from selskill.measure.metrics import compute_metrics  # noqa: E402
from selskill.policy.base import Generation  # noqa: E402
from selskill.policy.bootstrap import train_tokenizer  # noqa: E402
from selskill.registry import step_measure  # noqa: E402
from selskill.skills import render_listing  # noqa: E402
from selskill.skills.call_templates import parse_one_call  # noqa: E402
from selskill.stages.label import episode_pairs, local_pair  # noqa: E402

FMT = BfclTurnFormat(doc_style="brief")
LISTING = render_listing(load_bfcl_skills())
TASK = "multi_turn_base_106"  # TradingBot + ...: place_stock_order applies at turn 0


@pytest.fixture(scope="module")
def env():
    return BfclEnv(["base", "miss_func"], scenarios=[0, 106, 139], id_prefix="train/")


@pytest.fixture(scope="module")
def tokenizer(env):
    texts = [
        FMT.system_text(LISTING, FMT.docs_text(function_docs(env.task(t).involved_classes)))
        for t in env.task_ids()
    ]
    texts += [turn for t in env.task_ids() for turn in env.task(t).turns]
    texts += [render_calls(list(c)) for t in env.task_ids() for c in env.task(t).ground_truth if c]
    return train_tokenizer(texts * 2, vocab_size=800)


class Scripted:
    """Replies with the scripted assistant texts, one per turn (logprobs are placeholders)."""

    policy_id = "scripted"

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts = tokenizer, list(texts)

    def generate(self, requests, params):
        out = []
        for _ in requests:
            text = self.texts.pop(0) if self.texts else render_end_turn()
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [params.stop_token_ids[0]]
            out.append([Generation(ids, [-1.0] * len(ids), [0.5] * len(ids), "stop")])
        return out


def _play(env, tokenizer, texts, task=f"train/{TASK}", overlap=False):
    config = RunnerConfig(
        max_env_steps=60, max_decisions=40, max_new_tokens=64, env_overlap=overlap, concurrent_episodes=2
    )
    if overlap:  # a picklable factory: the episodes' host runs in a child process
        factory = functools.partial(BfclEnv, ["base"], scenarios=[106], id_prefix="train/")
    else:
        factory = lambda: env  # noqa: E731
    runner = bfcl_runner(Scripted(tokenizer, texts), factory, load_bfcl_skills(), FMT, config)
    try:
        return runner.run([EpisodeSpec("e", task, seed=0)])[0]
    finally:
        runner.close()


def _gt_texts(task) -> list[str]:
    return [render_calls([c]) if c else render_end_turn() for c in ground_truth_commands(task)]


# --- the format -----------------------------------------------------------------------------------


def test_system_prompt_holds_skills_examples_and_this_tasks_docs_but_not_its_state(env):
    task = env.task(f"train/{TASK}")
    state = env.reset(f"train/{TASK}")
    system, first = opening_messages(FMT, LISTING, env.functions, state)
    text = system["content"]
    assert text.startswith("You are an expert in composing functions.")
    assert "- place_stock_order(symbol, amount, order_type?):" in text  # the skill metadata
    assert "Examples:" in text and render_end_turn() in text and "<tool_call>" in text
    assert text.endswith(render_function_docs(task_function_docs(task, 0), "brief"))
    assert first == {"role": "user", "content": task.turns[0]}

    # BFCL never shows initial_config: none of its longer string values reaches the prompt
    def strings(v):
        if isinstance(v, dict):
            return [s for x in v.values() for s in strings(x)]
        if isinstance(v, list):
            return [s for x in v for s in strings(x)]
        return [v] if isinstance(v, str) and len(v) > 12 else []

    hidden = [s for s in strings(task.entry["initial_config"]) if s not in task.turns[0]]
    assert hidden and not [s for s in hidden if s in text]
    other = BfclEnv(["base"], scenarios=[0])
    other.reset("multi_turn_base_0")
    assert FMT.system_text(LISTING, FMT.docs_text(other.functions)) != text  # built per task


def test_withheld_functions_are_not_in_the_opening_docs():
    env = BfclEnv(["miss_func"], scenarios=[0])
    state = env.reset("multi_turn_miss_func_0")  # `sort` withheld until turn 3
    text = opening_messages(FMT, LISTING, env.functions, state)[0]["content"]
    assert "- sort(" not in text and "- ls(" in text


def test_calls_end_of_turn_and_names_only_listing():
    assert render_calls(["cd(folder='a')", "ls()"]) == "<action>[cd(folder='a'), ls()]</action>"
    assert render_end_turn() == "<action>[]</action>"
    parsed = parse_turn(render_calls(["cd(folder='a')"]), load_bfcl_skills().names)
    assert parsed.kind == "action" and parse_one_call(parsed.action.strip("[]")).name == "cd"
    with pytest.raises(ValueError, match="non-thinking"):
        BfclTurnFormat(style="thinking")
    shown = BfclTurnFormat(show_admissible_commands=True).observation_text(
        "obs", ["cd", "ls"], task="ignored"
    )
    assert shown == "obs\nAvailable functions: cd, ls"
    assert FMT.observation_text("obs", ["cd"], task="t") == "obs"
    for broken, expected in (("[cd(folder='a']", True), ("f(x=1", True), ("[]", False), ("Done.", False)):
        assert broken_call_list(broken) is expected, broken


def test_call_results_come_back_as_tool_messages_new_requests_as_user(env):
    env.reset(f"train/{TASK}")
    state = env.step("get_stock_info(symbol='AAPL')")
    assert after_step(FMT, state)["role"] == "tool"
    assert after_step(FMT, env.step(""))["role"] == "user"


# --- the episode host ---------------------------------------------------------------------------


def test_ground_truth_played_through_the_host_wins_with_function_call_steps(env, tokenizer):
    task = env.task(f"train/{TASK}")
    row = _play(env, tokenizer, _gt_texts(task))
    assert row.success and row.termination == "won" and row.error is None
    n_calls = sum(len(t) for t in task.ground_truth)
    assert row.env_steps == n_calls and row.n_turns == n_calls + len(task.turns)
    ends = [t for t in row.turns if t.text == render_end_turn()]
    assert len(ends) == len(task.turns) and all(t.commands == [""] and t.env_steps == 0 for t in ends)
    messages = json.loads(row.messages)
    assert [m["role"] for m in messages[:4]] == ["system", "user", "assistant", "tool"]


def test_skill_calls_malformed_turns_and_a_lost_task(env, tokenizer):
    texts = [
        render_skill_call("trading_reference"),  # memory: returns its body, no env step
        render_skill_call("place_stock_order", {"symbol": "AAPL", "amount": 100}),  # two call steps
        "<action>[get_stock_info(symbol='AAPL']</action>",  # a broken call list: malformed, ends turn 0
        "no decision at all",  # malformed: ends turn 1
    ]
    row = _play(env, tokenizer, texts)
    memory, skill, broken, bare = row.turns[:4]
    assert memory.kind == "skill" and memory.exec_precise and memory.env_steps == 0
    assert skill.exec_precise and skill.env_steps == 2 and len(skill.commands) == 2
    assert broken.kind == "malformed" and broken.reason == "bad_call_list"
    assert bare.kind == "malformed" and bare.reason == "missing_tags"
    assert broken.commands == bare.commands == [""] and broken.env_steps == bare.env_steps == 0
    messages = json.loads(row.messages)
    assert messages[7]["content"].startswith(MALFORMED_FEEDBACK)
    assert ROLE_SKILL_RETURN in row.role[memory.end : skill.start]
    assert ROLE_OBSERVATION in row.role[broken.end :]
    assert not row.success and row.termination == "failed" and row.error.startswith("multi_turn:")
    assert row.n_malformed == 2 and row.env_steps == 2
    # the BFCL host records the decision token and the message as the ALFWorld one does
    assert [t.decision for t in (memory, skill, broken, bare)] == [0, 0, 0, 0]
    for t in row.turns:
        assert messages[t.message_index] == {"role": "assistant", "content": t.text}
    assert [t.message_index for t in row.turns] == [2 + 2 * i for i in range(len(row.turns))]


def test_recorded_commands_replay_every_turn_boundary(env, tokenizer):
    """A fork replays a prefix's commands: "" for every ended turn keeps the env on the same user turn."""
    task = env.task(f"train/{TASK}")
    skill = render_skill_call("place_stock_order", {"symbol": "AAPL", "amount": 1})
    row = _play(env, tokenizer, _gt_texts(task)[:3] + ["garbage", skill, "<action>ls(</action>"])
    other = BfclEnv(["base"], scenarios=[106], id_prefix="train/")
    for k in range(len(row.turns) + 1):
        prefix = row.turns[:k]
        state = other.replay(f"train/{TASK}", [c for t in prefix for c in t.commands])
        assert other.turn == sum(1 for t in prefix if t.commands == [""]), k
        assert state.env_steps == sum(t.env_steps for t in prefix), k


def test_episodes_play_in_a_child_process_with_the_bfcl_host(env, tokenizer):
    task = env.task(f"train/{TASK}")
    here = _play(env, tokenizer, _gt_texts(task))
    there = _play(env, tokenizer, _gt_texts(task), overlap=True)
    assert there.success and there.token_ids == here.token_ids and there.turns == here.turns


# --- recipe rules ----------------------------------------------------------------------------


def test_recipe_rules_of_benchmark_bfcl(tmp_path):
    from selskill.config import load_recipe

    def recipe(**keys):
        path = tmp_path / "r.yaml"
        path.write_text(
            "".join(f"{k}: {v}\n" for k, v in {"benchmark": "bfcl", "eval_splits": "test", **keys}.items())
        )
        return load_recipe(["--config", str(path)])

    r = recipe(bfcl_categories="base,miss_func", bfcl_scenarios="3,5")
    assert r.settings.categories == ("base", "miss_func") and r.settings.kept_scenarios == (3, 5)
    assert set(r.settings.split("train")) | set(r.settings.split("test")) == {3, 5}
    with pytest.raises(ValueError, match="action_choice must be free with benchmark: bfcl"):
        recipe(action_choice="admissible")
    with pytest.raises(ValueError, match="turn_style must be compact"):
        recipe(turn_style="thinking")
    with pytest.raises(ValueError, match="eval_splits must be"):
        recipe(eval_splits="valid_seen")
    with pytest.raises(ValueError, match="sample_split"):
        recipe(sample_split="valid_seen")
    with pytest.raises(ValueError, match="bfcl_categories"):
        recipe(bfcl_categories="base,web_search")
    with pytest.raises(ValueError, match="init_bfcl_useful must be in"):
        recipe(init_bfcl_useful=2.0)
    with pytest.raises(ValueError, match="eval_splits must be"):
        recipe(benchmark="alfworld")  # eval_splits: test is not an ALFWorld split


# --- what a step is, per benchmark --------------------------------------------------------------


def _fork(fid, arm, turns, env_steps):
    return {
        "fork_id": fid,
        "arm": arm,
        "success": True,
        "steps_after_branch": turns,
        "env_steps_after_branch": env_steps,
        "malformed_after_branch": 0,
        "termination": "won",
        "token_ids": [1, 2, 3, 10, 11],
        "role": [0, 1, 2, 1, 2],
        "turn": [-1, 0, 0, 1, 1],
        **chat_fields(2),
    }


BRANCH = {"branch_id": "b", "task_id": "t", "task_type": "base", "round": 1, "token_offset": 3, "turn_index": 1,
          "pool": "ordinary", "score": 1.0, "strategy": "entropy", "candidate_skill": "place_stock_order"}  # fmt: skip


def test_label_efficiency_counts_the_benchmarks_steps():
    # invoke: a memory call then the same two calls (1 more decision, same call steps);
    # skip: the two calls batched into one step (same decisions, one call step fewer)
    inv, skp = _fork("i", "invoke", 4, 2), _fork("s", "skip", 4, 1)
    assert local_pair(BRANCH, [inv, skp], Counter(), step_measure("alfworld")) is None  # a tie in decisions
    p = local_pair(BRANCH, [inv, skp], Counter(), step_measure("bfcl"))
    assert p["chosen_arm"] == "skip" and (p["chosen_steps"], p["rejected_steps"]) == (1, 2)
    # an executable skill: one decision for its calls wins on ALFWorld, costs its calls on BFCL
    inv, skp = _fork("i", "invoke", 2, 3), _fork("s", "skip", 4, 3)
    assert local_pair(BRANCH, [inv, skp], Counter(), step_measure("alfworld"))["chosen_arm"] == "invoke"
    assert local_pair(BRANCH, [inv, skp], Counter(), step_measure("bfcl")) is None


def _rollout(rid, success, turns, env_steps):
    return {"rollout_id": rid, "task_id": "t", "task_type": "base", "round": 1, "success": success,
            "termination": "won" if success else "failed", "n_turns": turns, "env_steps": env_steps,
            "n_malformed": 0, "n_prompt_tokens": 2, "token_ids": [1, 2, 3], "role": [0, 0, 1], "turn": [-1, -1, 0],
            **chat_fields(1)}  # fmt: skip


def test_episode_pairs_and_avg_steps_follow_the_benchmark():
    rows = [
        _rollout("a", True, 9, 3),
        _rollout("b", True, 5, 6),
        _rollout("c", False, 20, 2),
        _rollout("d", False, 8, 12),
    ]
    alf = episode_pairs(rows, 1, Counter(), step_measure("alfworld"))
    bfcl = episode_pairs(rows, 1, Counter(), step_measure("bfcl"))
    assert (alf[0]["chosen_source"], alf[0]["rejected_source"]) == ("b", "c")
    assert (bfcl[0]["chosen_source"], bfcl[0]["rejected_source"]) == ("a", "d")
    rows = [r | {"n_skill_calls": 0, "n_precise_calls": 0} for r in rows]
    assert compute_metrics(rows, n_boot=0)["avg_steps"] == 10.5  # decisions
    assert compute_metrics(rows, n_boot=0, steps=step_measure("bfcl").episode)["avg_steps"] == 5.75
    with pytest.raises(ValueError, match="unknown benchmark"):
        step_measure("webshop")


def test_the_appendix_d_eval_modes_apply_to_the_bfcl_format():
    from selskill.agent.eval_modes import MODES, prompt_setup

    texts = {}
    for mode in MODES:
        setup = prompt_setup(mode, load_bfcl_skills(), FMT, "compact")
        assert isinstance(setup.fmt, BfclTurnFormat)
        texts[mode] = setup.fmt.system_text(setup.skill_text, "- ls(): list")
    assert "- place_stock_order(" in texts["skills"] and "<tool_call>" in texts["skills"]
    assert "place_stock_order" not in texts["no_skills"] and "<tool_call>" not in texts["no_skills"]
    assert (
        "### place_stock_order" in texts["skills_as_context"]
        and "<tool_call>" not in texts["skills_as_context"]
    )
    assert "Prefer direct environment actions" in texts["conservative"]
    assert "- self_reasoning:" in texts["explicit_skip"]
    assert all(t.endswith("- ls(): list") for t in texts.values())


# --- the init's demonstrations are the runner's transcripts ------------------------------------


@pytest.mark.parametrize("mode", [None, "task", "progress"])
def test_bfcl_demonstrations_are_the_transcripts_the_runner_writes_for_their_turns(env, tokenizer, mode):
    """Each demo's assistant turns, played by the runner with the same listing, give the demo back."""
    from selskill.agent.listings import STEP_SKILLS_HEADING
    from selskill.benchmarks.bfcl.demos import DEMO_FORMAT, DEMO_LISTING_STYLE, build_bfcl_demos
    from selskill.sft.demos import DemoPrompts
    from selskill.skills.distractors import library_of_size
    from selskill.skills.retrieval import RetrievalConfig, SkillRetriever

    library = load_bfcl_skills() if mode is None else library_of_size(load_bfcl_skills(), 68, 0)
    ret = None if mode is None else SkillRetriever(library, RetrievalConfig(mode=mode))
    report = build_bfcl_demos(env, prompts=DemoPrompts(DEMO_FORMAT, DEMO_LISTING_STYLE, library, ret), seed=0)
    assert len(report.demos) >= 4, report.dropped
    config = RunnerConfig(max_env_steps=60, max_decisions=60, max_new_tokens=400, max_context_tokens=1 << 16)
    calls = 0
    for demo in report.demos:
        texts = [m["content"] for m in demo.messages if m["role"] == "assistant"]
        runner = bfcl_runner(
            Scripted(tokenizer, texts), lambda: env, library, DEMO_FORMAT, config, retriever=ret
        )
        row = runner.run([EpisodeSpec("e", demo.task_id, seed=0)])[0]
        played = json.loads(row.messages)
        # the demo ends at its last assistant turn; the row also keeps the host's closing reply
        assert played[: len(demo.messages)] == demo.messages, demo.task_id
        assert [m["role"] for m in played[len(demo.messages) :]] in ([], ["user"])
        assert row.success
        assert [t.skill for t in row.turns if t.kind == "skill"] == [c["skill"] for c in demo.calls]
        calls += len(demo.calls)
    assert calls, "the mix called skills"
    steps = sum(STEP_SKILLS_HEADING in m["content"] for d in report.demos for m in d.messages)
    assert (steps > 0) == (mode == "progress")


def test_demonstrations_write_keyword_arguments_only(env):
    """The ground truth of scenario 0 calls `sort('final_report.pdf')`; BFCL would read `sort()`."""
    import ast

    from selskill.agent.turn_format import ACTION_CLOSE, ACTION_OPEN
    from selskill.benchmarks.bfcl.demos import build_bfcl_demos

    ids = ["train/multi_turn_base_0", "train/multi_turn_miss_func_0"]
    report = build_bfcl_demos(env, seed=0, task_ids=ids)
    assert sorted(d.task_id for d in report.demos) == ids, report.dropped
    for demo in report.demos:
        actions = [
            m["content"] for m in demo.messages if m["role"] == "assistant" and ACTION_OPEN in m["content"]
        ]
        bodies = [a.split(ACTION_OPEN, 1)[1].rsplit(ACTION_CLOSE, 1)[0] for a in actions]
        calls = [n for b in bodies for n in ast.walk(ast.parse(b, mode="eval")) if isinstance(n, ast.Call)]
        assert calls and not [ast.unparse(c) for c in calls if c.args], demo.task_id
        assert "[sort(file_name='final_report.pdf')]" in bodies, demo.task_id
