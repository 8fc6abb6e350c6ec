"""BFCL multi-turn behind the Env protocol, on bfcl-eval's shipped data, backends and checker.

Offline and deterministic: every task comes from the installed package. The full 800-task
ground-truth sweep is a benchmark (pipelines/bench_bfcl_gt.py, docs/benchmarks.md); here a
fixed sample of scenarios is played from each category.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources

import pytest

pytest.importorskip("bfcl_eval")

from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils  # noqa: E402

from selskill.benchmarks.bfcl import load_bfcl_skills
from selskill.benchmarks.bfcl.calls import decode_step  # noqa: E402
from selskill.benchmarks.bfcl.env import (  # noqa: E402
    CATEGORIES,
    BfclEnv,
    build_backends,
    function_docs,
    ground_truth_commands,
    keyword_ground_truth,
    load_tasks,
    public_state,
    render_function_docs,
    split_scenarios,
    split_tasks,
    task_function_docs,
)
from selskill.benchmarks.bfcl.execution import unknown_function_text  # noqa: E402
from selskill.envs.base import Env  # noqa: E402
from selskill.skills import SkillError, SkillExecutor, parse_skill  # noqa: E402
from selskill.skills.call_templates import Call, parse_one_call  # noqa: E402
from selskill.skills.executor import CALL_RESULTS  # noqa: E402

SAMPLE = range(0, 200, 9)  # 23 scenarios, every class and category
# its ground truth calls `tail` at turn 1, two turns before miss_func reveals it
WITHHELD_TOO_EARLY = "multi_turn_miss_func_49"


@pytest.fixture(scope="module")
def env():
    return BfclEnv()


def _sample_ids(env: BfclEnv) -> list[str]:
    ids = [f"multi_turn_{c}_{i}" for c in CATEGORIES for i in SAMPLE]
    return [i for i in ids if i != WITHHELD_TOO_EARLY]


# --- what the package ships -----------------------------------------------------------


def test_package_ships_four_index_aligned_categories_of_200():
    tasks = {c: load_tasks([c]) for c in CATEGORIES}
    assert {c: len(t) for c, t in tasks.items()} == dict.fromkeys(CATEGORIES, 200)
    for ts in tasks.values():
        assert [t.scenario for t in ts] == list(range(200))
        assert all(len(t.turns) == len(t.ground_truth) for t in ts)
    for i in range(200):  # one scenario: same classes in every category
        assert len({tasks[c][i].involved_classes for c in CATEGORIES}) == 1
    assert all(t.withheld for t in tasks["miss_func"]) and not any(t.withheld for t in tasks["base"])
    data = resources.files("bfcl_eval") / "data"
    assert (data / "possible_answer" / "BFCL_v4_multi_turn_base.json").is_file()
    assert (data / "multi_turn_func_doc" / "gorilla_file_system.json").is_file()


def test_only_the_backends_and_the_checker_are_imported():
    """In a process of its own: the equivalence test's reference imports BFCL's decoder module here."""
    script = (
        "import sys\n"
        "from selskill.benchmarks.bfcl.env import BfclEnv, ground_truth_commands\n"
        "env = BfclEnv(['base'], scenarios=[0])\n"
        "assert env.replay('multi_turn_base_0', ground_truth_commands(env.task('multi_turn_base_0'))).won\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('bfcl_eval')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker" in loaded
    assert not [m for m in loaded if m == "bfcl_eval.utils" or ".model_handler" in m or "eval_config" in m]
    assert not [m for m in loaded if m.rsplit(".", 1)[-1].startswith(("memory", "web_search"))]


def test_env_implements_the_protocol(env):
    assert env.reset("multi_turn_base_0").env_steps == 0 and env.inventory() == []
    assert isinstance(env, Env)  # (its `state` is readable only after a reset)
    assert env.task_ids()[:2] == ["multi_turn_base_0", "multi_turn_base_1"] and len(env.task_ids()) == 800


# --- ground truth through the env -------------------------------------------------------


def test_ground_truth_call_by_call_wins_a_sample_of_every_category(env):
    ids = _sample_ids(env)
    lost = [i for i in ids if not env.replay(i, ground_truth_commands(env.task(i))).won]
    assert not lost, lost
    assert {env.task(i).category for i in ids} == set(CATEGORIES)


def test_dropping_the_last_call_loses(env):
    ids = _sample_ids(env)
    won = [i for i in ids if env.replay(i, ground_truth_commands(env.task(i), drop_last_call=True)).won]
    assert not won, won


def test_a_turn_longer_than_the_step_limit_is_batched_and_wins(env):
    task = env.task("multi_turn_long_context_46")  # 34 ground-truth calls in one turn
    commands = ground_truth_commands(task)
    assert len(task.ground_truth[0]) == 34 and 1 < commands.index("") <= env.max_steps_per_turn
    assert env.replay(task.id, commands).won


def test_the_checker_cache_is_freed_after_each_task(env):
    for task_id in ("multi_turn_base_3", "multi_turn_miss_func_3"):
        assert env.replay(task_id, ground_truth_commands(env.task(task_id))).won
        assert not [k for k in vars(multi_turn_utils) if k.startswith(env.model_name)]


# --- observations, replay, refused calls ---------------------------------------------------


def test_replay_reproduces_every_observation(env):
    task = env.task("multi_turn_miss_func_110")
    commands = ground_truth_commands(task)
    state = env.reset(task.id)
    seen = [(state.observation, state.admissible_commands, state.info)]
    for command in commands:
        state = env.step(command)
        seen.append((state.observation, state.admissible_commands, state.info))
    assert state.won
    other = BfclEnv(["miss_func"])
    for n in (0, 3, len(commands) // 2, len(commands)):
        again = other.replay(task.id, commands[:n])
        assert (again.observation, again.admissible_commands, again.info) == seen[n]
    assert again.env_steps == sum(1 for c in commands if c)


def test_unknown_and_refused_calls_change_nothing(env):
    task = env.task("multi_turn_base_110")  # TradingBot + TicketAPI
    env.reset(task.id)
    env.step(task.ground_truth[0][0])
    before = public_state(env.instances)
    calls, turn, steps = json.loads(json.dumps(env.calls)), env.turn, env.turn_steps
    cases = {  # text -> (BFCL's execution string, output, whether the walk refused to run it)
        "no_such_function(x=1)": ("no_such_function(x=1)", unknown_function_text("no_such_function"), False),
        # a class this task does not involve
        "cd(folder='documents')": ("cd(folder='documents')", unknown_function_text("cd"), False),
        # BFCL's decoder keeps a bare name as a string, and drops positional arguments
        "get_stock_info(symbol=AAPL)": ("get_stock_info(symbol='AAPL')", '{"price":', False),
        "get_stock_info('AAPL')": (
            "get_stock_info()",
            "Error during execution: TradingBot.get_stock_info() missing",
            False,
        ),
        "os.system(command='ls')": ("os.system(command='ls')", unknown_function_text("os"), False),
        # names BFCL's eval would find (its module's `json`, a builtin) are never run
        "json.dumps(obj=1)": ("json.dumps(obj=1)", "Error during execution: not run here", True),
        "get_stock_info(symbol=open(file='x'))": (
            "get_stock_info(symbol=open(file='x'))",
            "Error during execution: not run here",
            True,
        ),
        # BFCL never evals these either: its refused names, and text that does not compile
        "exit()": ("exit()", "Error during execution: Function call exit is not allowed.", False),
        "get_stock_info(**{'symbol': 'AAPL'})": (
            "get_stock_info(None={'symbol': 'AAPL'})",
            "Error during execution: cannot assign to None",
            False,
        ),
    }
    refused = {}
    for command, (text, output, was_refused) in cases.items():
        state = env.step(command)
        (report,) = state.info[CALL_RESULTS]
        assert report["call"] == text and report["output"].startswith(output) and state.env_steps == 1, (
            command
        )
        assert state.observation == f"{report['call']} -> {report['output']}"
        if was_refused:
            refused[(0, len(calls[0]), 0)] = report["output"]
        calls[0].append([text])  # the checker gets every call as BFCL's decoder wrote it
    assert public_state(env.instances) == before
    assert env.calls == calls and env.turn == turn and env.refused == refused
    assert env.turn_steps == steps + len(cases)


def test_unknown_function_text_is_bfcl_own():
    task = load_tasks(["base"])[0]
    theirs, _ = multi_turn_utils.execute_multi_turn_func_call(
        ["no_such_function(x=1)"],
        task.entry["initial_config"],
        list(task.involved_classes),
        "selskill_unk",
        task.id,
    )
    for key in [k for k in vars(multi_turn_utils) if k.startswith("selskill_unk_")]:
        del vars(multi_turn_utils)[key]
    assert theirs == [unknown_function_text("no_such_function")]


def test_a_step_with_no_call_ends_the_turn(env):
    task = env.task("multi_turn_base_0")
    for no_call, problem in (
        ("", ""),
        ("[]", ""),
        ("```\n```", ""),
        ("I need more information.", "not a list of Python calls"),
    ):
        env.reset(task.id)
        state = env.step(no_call)
        assert env.turn == 1 and state.env_steps == 0 and state.observation.endswith(task.turns[1])
        assert state.task == task.turns[1] and not state.done
        assert (problem in state.observation) if problem else state.observation == task.turns[1]


def test_a_step_runs_every_call_of_its_list(env):
    env.reset("multi_turn_base_0")
    state = env.step("[pwd(), ls(a=True), nope()]")
    outputs = [r["output"] for r in state.info[CALL_RESULTS]]
    assert json.loads(outputs[0]) == {"current_working_directory": "/workspace"}
    assert "document" in json.loads(outputs[1])["current_directory_content"]
    assert outputs[2] == unknown_function_text("nope") and env.calls[-1] == [
        ["pwd()", "ls(a=True)", "nope()"]
    ]


def test_more_than_20_steps_in_a_turn_quits_and_fails_before_the_last_turn(env):
    env.reset("multi_turn_base_0")
    for _ in range(env.max_steps_per_turn):
        assert not env.step("pwd()").done
    state = env.step("pwd()")
    assert state.done and not state.won and "forced to quit" in state.observation
    assert state.info["verdict"]["error_type"] == "multi_turn:force_terminated"
    assert env.step("pwd()").env_steps == 0  # nothing runs after the end


def test_a_forced_quit_on_the_last_turn_is_judged_by_the_checker(env):
    task = env.task("multi_turn_base_0")
    commands = ground_truth_commands(task)[:-1]  # all but the last end of turn
    env.replay(task.id, commands)
    assert env.turn == len(task.turns) - 1
    while not env.state.done:
        state = env.step("pwd()")
    assert state.won and env.turn_steps == env.max_steps_per_turn + 1


@pytest.mark.parametrize("withheld_callable", [True, False])
def test_withheld_functions_appear_at_their_turn(withheld_callable):
    env = BfclEnv(["miss_func"], scenarios=[0], withheld_callable=withheld_callable)
    task = env.task("multi_turn_miss_func_0")  # `sort` withheld until turn 3
    assert task.withheld == {3: ("sort",)}
    state = env.reset(task.id)
    call = "sort(file_name='final_report.pdf')"
    for _ in range(3):
        assert "sort" not in state.admissible_commands  # shown only at its turn, whatever the rule
        state = env.step(call)
        output = state.info[CALL_RESULTS][0]["output"]
        # BFCL's rule (the default) runs it; the strict option answers it as an unknown name
        assert (output == unknown_function_text("sort")) != withheld_callable, output
        state = env.step("")
    assert "sort" in state.admissible_commands and state.admissible_commands[-1] == "sort"
    assert "I have updated some more functions you can choose from" in state.observation
    assert "- sort(file_name: str)" in state.observation
    assert state.task == task.turns[2]  # the reveal turn keeps the request it answers
    assert env.calls == [[[call]], [[call]], [[call]], []]  # the checker gets the call either way
    assert env.refused == (
        {} if withheld_callable else {(t, 0, 0): unknown_function_text("sort") for t in range(3)}
    )


def test_withheld_rule_is_bfcl_by_default_strict_on_request():
    task_id = WITHHELD_TOO_EARLY
    bfcl_rule = BfclEnv(["miss_func"], scenarios=[49])
    commands = ground_truth_commands(bfcl_rule.task(task_id))
    assert bfcl_rule.withheld_callable and bfcl_rule.replay(task_id, commands).won
    strict = BfclEnv(["miss_func"], scenarios=[49], withheld_callable=False)
    assert not strict.replay(task_id, commands).won


# --- the scenario split -------------------------------------------------------------------


def test_split_is_by_scenario_and_reproducible():
    train, test = split_scenarios(test_fraction=0.5, seed=0)
    assert not set(train) & set(test) and sorted(train + test) == list(range(200)) and len(test) == 100
    assert split_scenarios(0.5, 0) == (train, test) and split_scenarios(0.5, 1) != (train, test)
    train_tasks, test_tasks = split_tasks("train"), split_tasks("test")
    assert len(train_tasks) == len(test_tasks) == 400
    assert not {t.scenario for t in train_tasks} & {t.scenario for t in test_tasks}
    env = BfclEnv(scenarios=test)
    assert {env.task(i).scenario for i in env.task_ids()} == set(test)


# --- calls and docs ----------------------------------------------------------------------


def test_templates_parse_keyword_literals_only_and_render_back():
    call = parse_one_call("place_order(order_type='Buy', symbol='AAPL', price=-1.5e2, amount=10)")
    assert call == Call("place_order", {"order_type": "Buy", "symbol": "AAPL", "price": -150.0, "amount": 10})
    assert parse_one_call(call.render()) == call
    for bad in ("sort('a.txt')", "f(x=y)", "os.system(command='ls')", "f(**{'a': 1})", "[f(), g()]"):
        with pytest.raises(ValueError):
            parse_one_call(bad)


def test_steps_decode_as_bfcl_decodes_them():
    assert [c.text for c in decode_step("sort('a.txt')").calls] == ["sort()"]
    assert [c.text for c in decode_step("[ls(), f(x=y)]").calls] == ["ls()", "f(x='y')"]
    assert decode_step("Done.").error and decode_step("[ls(), 3]").error and not decode_step("[]").error


def test_compact_docs_are_a_fraction_of_bfcl_json_and_lose_no_name():
    docs = function_docs(["TravelAPI", "VehicleControlAPI"])
    full, compact = render_function_docs(docs, "json"), render_function_docs(docs, "compact")
    assert full == json.dumps(docs, indent=4)
    assert len(compact) * 4 < len(full)
    for doc in docs:
        assert f"- {doc['name']}(" in compact
        assert all(f"{p}" in compact for p in doc["parameters"]["properties"])
    assert "mode: 'engage'|'release'" in compact  # enums move into the signature
    assert len(render_function_docs(docs, "brief")) < len(compact)


def test_task_docs_hide_withheld_functions_until_their_turn():
    task = load_tasks(["miss_func"], scenarios=[2])[0]  # cp and cat withheld until turn 4
    names = [[d["name"] for d in task_function_docs(task, t)] for t in range(len(task.turns))]
    assert all("cp" not in n and "cat" not in n for n in names[:4])
    assert names[4][-2:] == ["cp", "cat"]


# --- skills -----------------------------------------------------------------------------

# skill -> (task, turn, ground-truth calls of that turn played before it, arguments); on each
# the skill's calls reproduce the rest of the turn's ground truth
SKILL_CASES = {
    "place_stock_order": ("multi_turn_base_106", 0, 0, {"symbol": "AAPL", "amount": 100}),
    "book_flight": (
        "multi_turn_base_152",
        0,
        0,
        dict(
            access_token="secureAccessToken12345",
            card_id="144756014165",
            travel_date="2026-11-15",
            travel_from="SFO",
            travel_to="ORD",
            travel_class="first",
        ),
    ),
    "post_tweet": (
        "multi_turn_base_5",
        2,
        0,
        dict(
            username="dr_smith",
            password="securePass123",
            content="Managed to archive important data files!",
            tags=["#DataManagement", "#Efficiency"],
        ),
    ),
    "send_message": (
        "multi_turn_base_41",
        0,
        2,
        dict(sender_id="USR001", receiver="Bob", message="Meeting notes and project details."),
    ),
    "create_ticket": (
        "multi_turn_base_27",
        1,
        0,
        dict(
            username="tech_guru",
            password="securePass123",
            title="emergency",
            description="Initial project plan details.",
            priority=3,
        ),
    ),
    "start_engine": ("multi_turn_base_53", 1, 0, {}),
    "check_tires": ("multi_turn_base_52", 1, 0, {}),
    "set_budget": (
        "multi_turn_base_150",
        1,
        0,
        dict(access_token="abc123token", amount=15400.0, currency="GBP"),
    ),
}


def test_shipped_bfcl_library_has_the_paper_mix():
    library = load_bfcl_skills()
    kinds = [s.kind for s in library.values()]
    assert len(library) == 18 and kinds.count("memory") == 10 and kinds.count("executable") == 8
    assert {n for n, s in library.items() if s.is_executable} == set(SKILL_CASES)


@pytest.mark.parametrize("name", sorted(SKILL_CASES))
def test_executable_skill_runs_precisely_where_it_applies(env, name):
    task_id, skill_turn, before, arguments = SKILL_CASES[name]
    task, executor = env.task(task_id), SkillExecutor(load_bfcl_skills())
    env.reset(task_id)
    for turn, calls in enumerate(keyword_ground_truth(task)):
        if turn == skill_turn:
            for call in calls[:before]:
                env.step(call)
            record = executor.execute(env, name, arguments)
        else:
            for call in calls:
                env.step(call)
        state = env.step("")
    assert record.precise and record.error is None, record.observation
    assert record.env_steps == len(record.actions) == len(load_bfcl_skills()[name].steps)
    assert state.won, state.info["verdict"]  # the skill did exactly the turn's work


@pytest.mark.parametrize("name", sorted(SKILL_CASES))
def test_executable_skill_fails_with_a_reason_where_its_functions_are_missing(env, name):
    skill = load_bfcl_skills()[name]
    needed = [p.split(":", 1)[1] for p in skill.preconditions]
    task_id = next(  # the first real scenario that lacks one of the skill's functions
        i for i in env.task_ids() if not set(needed) <= {d["name"] for d in task_function_docs(env.task(i))}
    )
    env.reset(task_id)
    before = public_state(env.instances)
    record = SkillExecutor(load_bfcl_skills()).execute(env, name, SKILL_CASES[name][3])
    missing = next(f for f in needed if f not in env.state.admissible_commands)
    assert not record.precise and record.error == f"precondition_failed:available:{missing}"
    assert f"{missing} is not available" in record.observation
    assert record.env_steps == 0 and public_state(env.instances) == before and env.turn_steps == 0


def test_executable_skill_waits_for_a_withheld_function(env):
    task = env.task("multi_turn_miss_func_136")  # place_order withheld until turn 1
    assert task.withheld == {1: ("place_order",)} and task.ground_truth[0] == ()
    executor = SkillExecutor(load_bfcl_skills())
    env.reset(task.id)
    early = executor.execute(env, "place_stock_order", {"symbol": "ZETA", "amount": 50})
    assert early.error == "precondition_failed:available:place_order" and early.env_steps == 0
    env.step("")
    late = executor.execute(env, "place_stock_order", {"symbol": "ZETA", "amount": 50})
    assert late.precise and late.resolved["price"] == 150.75
    state = env.step("")
    for calls in keyword_ground_truth(task)[2:]:
        for call in calls:
            env.step(call)
        state = env.step("")
    assert state.won


def test_a_step_whose_result_is_an_error_fails_the_skill(env):
    executor = SkillExecutor(load_bfcl_skills())
    env.reset("multi_turn_base_106")
    record = executor.execute(env, "place_stock_order", {"symbol": "NOPE", "amount": 1})
    assert record.error == "call_error:get_stock_info" and record.env_steps == 1
    assert "Stock with symbol 'NOPE' not found" in record.observation
    bad = executor.execute(env, "place_stock_order", {"symbol": "AAPL", "amount": "100"})
    assert bad.error == "bad_argument:amount" and bad.env_steps == 0


def test_call_templates_are_validated_at_load():
    head = "---\nname: s\ndescription: d\nkind: executable\nparameters:\n  - name: x\n    description: x\n    type: string\nsteps:\n"
    good = parse_skill(
        head + '  - call: "f(a={x})"\n    bind: {y: out}\n  - call: "g(b={y})"\n---\nbody', "s"
    )
    assert good.steps[1].call == "g(b={y})" and good.steps[0].bind == (("y", "out"),)
    for steps, problem in {
        "  - call: \"f(a='{x}')\"": "must be a whole argument value",
        '  - call: "f(a={z})"': "placeholder {z} is neither a parameter nor bound earlier",
        '  - call: "f(a={x}) + 1"': "not one function call",
        '  - call: "f(a={x})"\n    bind: {x: out}': "must bind new snake_case names",
    }.items():
        with pytest.raises(SkillError, match=problem):
            parse_skill(head + steps + "\n---\nbody", "s")


def test_backends_are_built_from_initial_config_not_shared(env):
    task = env.task("multi_turn_base_0")
    first, second = build_backends(task), build_backends(task)
    assert public_state(first) == public_state(second)
    assert first["GorillaFileSystem"] is not second["GorillaFileSystem"]
    assert (
        public_state(first)["TwitterAPI"]["username"]
        == task.entry["initial_config"]["TwitterAPI"]["username"]
    )
