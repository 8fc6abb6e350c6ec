"""selskill scores BFCL exactly as BFCL's own pipeline does.

The reference (tests/bfcl_reference.py) is bfcl-eval's decoder run in its own real module
(every name that module defines is there for its arithmetic), its inference loop and scoring
re-created statement for statement, and its own executor and checker. The same scripted model plays each task through the reference and
through `BfclEnv`; the tests pin that both give the same verdict (valid and error type), that
the env hands the checker exactly the execution strings BFCL's scoring decodes, and that
every executed step shows BFCL's own outputs. Scripts: every ground truth as the data writes
it (positional arguments included) and in keyword form, perturbed ground truths (a call
dropped, changed, duplicated, reordered or replaced, turns packed or emptied, the step limit
hit on the last turn and on the first), steps BFCL decodes in unusual ways or not at all
(arithmetic over its module's names, ints near Python's digit limit), a miss_func function
called before its turn (BFCL's rule is the env's default) and calls the env refuses to run
(they reach the checker as BFCL's decoder wrote them). Every input here is harmless: the
reference `eval`s it.
"""

from __future__ import annotations

import ast
import copy

import pytest

pytest.importorskip("bfcl_eval")

import bfcl_reference as bfcl  # noqa: E402

from selskill.benchmarks.bfcl.decoding import NotEvaluated, decode, decoder_scope  # noqa: E402
from selskill.benchmarks.bfcl.env import (  # noqa: E402
    BFCL_VERSION,
    CATEGORIES,
    BfclEnv,
    ground_truth_commands,
    is_positional,
    keyword_ground_truth,
    load_tasks,
)


@pytest.fixture(scope="module")
def env():
    return BfclEnv()  # as shipped: BFCL's own rule for withheld functions is the default


def _turns(commands: list[str]) -> list[list[str]]:
    """ground_truth_commands' flat list ("" ends a turn) as one script per turn."""
    script, turn = [], []
    for command in commands:
        turn.append(command)
        if command == "":
            script.append(turn)
            turn = []
    return script


def play(env: BfclEnv, task_id: str, script: list[list[str]]) -> dict:
    """The env driven by the scripted model: per turn, its responses until one ends the turn."""
    state = env.reset(task_id)
    outputs, refused, step = [], [], 0
    for turn_idx in range(len(env.task(task_id).turns)):
        for text in [*script[turn_idx], ""] if turn_idx < len(script) else [""]:
            state = env.step(text)
            if state.info["call_results"]:
                outputs.append([r["output"] for r in state.info["call_results"]])
                refused += [
                    (step, i) for t, s, i in env.refused if (t, s) == (turn_idx, len(env.calls[t]) - 1)
                ]
                step += 1
            if state.done or env.turn != turn_idx:
                break
        if state.done:
            break
    verdict = state.info["verdict"]
    return {
        "valid": bool(verdict["valid"]),
        "error_type": verdict["error_type"],
        "calls": env.calls,
        "outputs": outputs,
        "refused": refused,  # (executed step, call) of the calls the env did not run
    }


def reference(env: BfclEnv, task_id: str, script: list[list[str]]) -> dict:
    task = env.task(task_id)
    entry = copy.deepcopy(task.entry)
    responses, outputs = bfcl.inference(entry, script)
    verdict = bfcl.score(entry, [list(t) for t in task.ground_truth], responses)
    calls = bfcl.decoded_for_checker(responses)
    return {**verdict, "calls": calls, "outputs": outputs}


def assert_same(env: BfclEnv, task_id: str, script: list[list[str]], refusals: int = 0) -> dict:
    """Same verdict, same calls handed to the checker, same outputs; `refusals` calls the env refused
    to run (BFCL `eval`ed them) are the only outputs allowed to differ."""
    ours, theirs = play(env, task_id, script), reference(env, task_id, script)
    assert (ours["valid"], ours["error_type"]) == (theirs["valid"], theirs["error_type"]), (task_id, script)
    if len(ours["calls"]) == len(theirs["calls"]):  # a forced quit before the last turn leaves fewer
        assert ours["calls"] == theirs["calls"], (task_id, script)
    assert len(ours["refused"]) == refusals, (task_id, script, ours["refused"])
    theirs_outputs = copy.deepcopy(theirs["outputs"])
    for step, i in ours["refused"]:
        theirs_outputs[step][i] = ours["outputs"][step][i]
    assert ours["outputs"] == theirs_outputs, (task_id, script)
    return ours


def test_the_reference_is_the_pinned_bfcl_eval():
    assert bfcl.bfcl_version() == BFCL_VERSION


# --- the ground truth -------------------------------------------------------------------------


POSITIONAL = {c: [t.id for t in load_tasks([c]) if any(is_positional(x) for turn in t.ground_truth for x in turn)]
              for c in CATEGORIES}  # fmt: skip


def test_24_ground_truths_per_category_pass_arguments_by_position():
    assert {c: len(ids) for c, ids in POSITIONAL.items()} == dict.fromkeys(CATEGORIES, 24)


@pytest.mark.parametrize("category", CATEGORIES)
def test_verbatim_ground_truth_scores_as_bfcl_scores_it(env, category):
    """As the data writes it: BFCL's decoder drops positional arguments, so those tasks fail."""
    lost = []
    for task in load_tasks([category]):
        ours = assert_same(env, task.id, _turns(ground_truth_commands(task, verbatim=True)))
        if not ours["valid"]:
            lost.append(task.id)
    assert lost == POSITIONAL[category]


@pytest.mark.parametrize("category", CATEGORIES)
def test_keyword_ground_truth_wins_in_both(env, category):
    for task in load_tasks([category]):
        assert assert_same(env, task.id, _turns(ground_truth_commands(task)))["valid"], task.id


def test_keyword_form_names_every_positional_argument_by_signature():
    task = next(t for t in load_tasks(["base"]) if t.id == "multi_turn_base_52")
    calls = [c for turn in keyword_ground_truth(task) for c in turn]
    assert (
        "post_tweet(content='Tires checked and engine purring smoothly!', tags=['#RoadTrip'], mentions=['@AutoUpdates'])"
        in calls
    )
    for turn in keyword_ground_truth(task):
        assert not any(ast.parse(c, mode="eval").body.args for c in turn)


# --- perturbed ground truths --------------------------------------------------------------------


def _perturbations(task) -> dict[str, list[list[str]]]:
    truth = [list(t) for t in keyword_ground_truth(task)]
    last = max(i for i, t in enumerate(truth) if t)
    first = min(i for i, t in enumerate(truth) if t)
    out: dict[str, list[list[str]]] = {}

    def variant(name, turns):
        out[name] = [[*t, ""] for t in turns]

    dropped = copy.deepcopy(truth)
    dropped[last].pop()
    variant("drop_last", dropped)
    changed = copy.deepcopy(truth)
    call = ast.parse(changed[last][-1], mode="eval").body
    for kw in call.keywords:
        if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, (str, int, float)):
            kw.value = ast.Constant(
                kw.value.value * 2 if not isinstance(kw.value.value, str) else kw.value.value + "x"
            )
            break
    changed[last][-1] = ast.unparse(call)
    variant("changed_argument", changed)
    duplicated = copy.deepcopy(truth)
    duplicated[last].append(duplicated[last][-1])
    variant("duplicated", duplicated)
    reordered = copy.deepcopy(truth)
    reordered[last].reverse()
    variant("reordered", reordered)
    replaced = copy.deepcopy(truth)
    replaced[first] = ["nonexistent_fn()"]
    variant("replaced_by_unknown", replaced)
    emptied = copy.deepcopy(truth)
    emptied[first] = []
    variant("turn_emptied", emptied)
    out["packed"] = [["[" + ", ".join(t) + "]", ""] if t else [""] for t in truth]
    limit = bfcl.MAXIMUM_STEP_LIMIT
    forced_last = [[*t, ""] for t in truth]
    forced_last[-1] = [*truth[-1], *(["nonexistent_fn()"] * (limit + 1))]
    out["step_limit_on_last_turn"] = forced_last
    forced_first = [[*t, ""] for t in truth]
    forced_first[0] = ["nonexistent_fn()"] * (limit + 1)
    out["step_limit_on_first_turn"] = forced_first
    return out


PERTURBED = [f"multi_turn_{c}_{i}" for c in CATEGORIES for i in range(0, 200, 7)]


@pytest.mark.parametrize("task_id", PERTURBED)
def test_perturbed_ground_truths_score_as_bfcl_scores_them(env, task_id):
    verdicts = {
        name: assert_same(env, task_id, script)["valid"]
        for name, script in _perturbations(env.task(task_id)).items()
    }
    assert not verdicts["drop_last"] and not verdicts["turn_emptied"] and verdicts["packed"]


def test_a_forced_quit_on_the_last_turn_is_still_judged(env):
    task = env.task("multi_turn_base_0")
    script = _perturbations(task)["step_limit_on_last_turn"]
    assert assert_same(env, task.id, script)["valid"]  # the calls were all made: BFCL counts the win
    first = _perturbations(task)["step_limit_on_first_turn"]
    assert assert_same(env, task.id, first)["error_type"] == "multi_turn:force_terminated"


def test_an_unknown_call_keeps_a_turn_from_being_empty(env):
    """BFCL passes every decoded call to the checker: a turn of only `nonexistent_fn()` is not empty."""
    task = env.task("multi_turn_base_0")
    truth = [list(t) for t in keyword_ground_truth(task)]
    truth[0] = ["nonexistent_fn()"]
    ours = assert_same(env, task.id, [[*t, ""] for t in truth])
    assert ours["error_type"] != "multi_turn:empty_turn_model_response" and ours["calls"][0] == [
        ["nonexistent_fn()"]
    ]


# --- steps decoded in unusual ways, or not at all ------------------------------------------------

ODD_STEPS = [
    "[ls(), 3]",
    "cd(folder='a'",
    "I think the request is done.",
    "'ls()'",
    "```\nls(a=True)\n```",
    "[]",
    "touch('draft.txt')",
    "ls(a=True, extra=1)",
    "mkdir(dir_name='new_dir')",
    "echo(content='run cd(folder) then ls()', file_name='notes.txt')",
    "[touch(file_name='a.txt'), cat(file_name='a.txt'), nonexistent_fn()]",
    "nonexistent_fn(x=a+b)",
    "nonexistent_fn(x=1+2, y='ab'+'cd', z=7//2, w=2**0.5, v=[1, 2] + [3])",
    "nonexistent_fn(x=1/0)",
    "nonexistent_fn(x=10**4400)",
    "nonexistent_fn(x=+5, y=-5, z=not True, w=~2)",
    "nonexistent_fn(x=-(-1))",
    "nonexistent_fn(x={})",
    "nonexistent_fn(x={'a': {'b': 1}})",
    "nonexistent_fn(x={'a': 1, 2: [3]})",
    "nonexistent_fn(x=nonexistent_g(y=1))",
    "ls(a=pwd(x=1))",
    "nonexistent_fn(x=g(1), y=name, z=a[0], w=a.b)",
    "nonexistent_fn(x=lambda: 1)",
    "nonexistent_fn(**{'a': 1})",
    "nonexistent_fn(x={1, 2})",
    "nonexistent_fn(x=f'{1}')",
    "nonexistent_fn(x=1e999, y=(1, 2), z=b'ab', w=..., u=None, t=1+2j)",
    "nonexistent_fn(x=1, x=2)",
    "a.b.c(x=1)",
    "nonexistent_fn()()",
    "kill(pid=1)",
    "exit()",
    "ls(**{'a': True})",
    # arithmetic over names BFCL's decoder module defines, and over names it does not
    "ls(a=MAXIMUM_STEP_LIMIT - 20 + 1)",
    "nonexistent_fn(x=VERSION_PREFIX + '_x', y=MULTI_TURN_CATEGORY + ['z'], z=-H100_X8_PRICE_PER_HOUR * 2)",
    "nonexistent_fn(x=json + 1)",
    "nonexistent_fn(x=value + 1)",
    "nonexistent_fn(x=MAXIMUM_STEP_LIMIT + undefined_name)",
    # ints near Python's 4,300-digit limit: exact where BFCL computes, failing where its repr fails
    "ls(a=7 ** 5000 - 7 ** 5000 + 1)",
    "nonexistent_fn(lines=7 ** 5000)",
    "nonexistent_fn(x=10 ** 4300 - 1, y=-(10 ** 4300) + 1)",
    "nonexistent_fn(x=10 ** 4300)",
    "nonexistent_fn(x=(1 << 14283) * 2 - 1)",
    "nonexistent_fn(x=" + "0x" + "f" * 3600 + " - 1)",
    "nonexistent_fn(" + "0x" + "f" * 3600 + ", x=1)",
]


@pytest.mark.parametrize("step", ODD_STEPS)
def test_odd_steps_score_as_bfcl_scores_them(env, step):
    for task_id in ("multi_turn_base_0", "multi_turn_base_110"):  # a file system task, one without
        truth = [list(t) for t in keyword_ground_truth(env.task(task_id))]
        assert_same(env, task_id, [[step, *truth[0], ""], *[[*t, ""] for t in truth[1:]]])
        assert_same(env, task_id, [[*truth[0], step, ""], *[[*t, ""] for t in truth[1:]]])


def test_odd_steps_decode_to_bfcl_execution_strings():
    for step in ODD_STEPS:
        try:
            theirs = bfcl.DECODE(step, has_tool_call_tag=False)
        except Exception:
            theirs = None
        decoded = decode(step)
        ours = [c.text for c in decoded.calls] if decoded.calls or not decoded.error else None
        assert ours == theirs, step


def test_the_decoder_scope_is_the_names_of_bfcl_decoder_module():
    """Every name the real module holds is defined in ours, and every value ours evaluates is its value;
    the names ours leaves unevaluated though their value is plain data are exactly these."""
    scope, real = decoder_scope(), vars(bfcl.DECODER)
    assert set(real) <= set(scope) and set(scope) - set(real) == {"value"}  # `value`: the eval's local
    evaluated = {k: v for k, v in scope.items() if not isinstance(v, NotEvaluated)}
    assert evaluated and all(real[k] == v for k, v in evaluated.items())
    assert evaluated["MAXIMUM_STEP_LIMIT"] == bfcl.MAXIMUM_STEP_LIMIT
    plain = (bool, int, float, str, list, dict, type(None))
    unevaluated = {k for k, v in real.items() if isinstance(v, plain) and k not in evaluated}
    # from typing; an f-string of eval_config (never imported: it creates folders); dunders
    assert unevaluated == {"TYPE_CHECKING", "RESULT_FILE_PATTERN", "__name__", "__doc__", "__package__",
                           "__file__", "__cached__", "__builtins__"}  # fmt: skip


def test_a_function_withheld_until_later_is_callable_by_default_as_in_bfcl(env):
    """miss_func_124 withholds cancel_order until turn 1; BFCL's rule runs it at turn 0."""
    task = env.task("multi_turn_miss_func_124")
    assert "cancel_order" in [n for names in task.withheld.values() for n in names]
    truth = [list(t) for t in keyword_ground_truth(task)]
    script = [["cancel_order(order_id=12446)", *truth[0], ""], *[[*t, ""] for t in truth[1:]]]
    ours = assert_same(env, task.id, script)
    assert "not defined" not in ours["outputs"][0][0]
    strict = play(BfclEnv(["miss_func"], scenarios=[124], withheld_callable=False), task.id, script)
    assert strict["outputs"][0][0] == "Error during execution: name 'cancel_order' is not defined"
    assert strict["calls"][0][0] == ["cancel_order(order_id=12446)"]  # the checker gets it, not run
    assert strict["refused"] == [(0, 0)]


REFUSED_STEPS = [
    "ls(a=len(obj='x'))",  # a builtin BFCL's eval would call (it raises: no keyword arguments)
    "[pwd(), ls(a=str(object=1)), pwd()]",  # a builtin that would run, between two calls that do
    "nonexistent_fn(x={\"pwd() or g\": {'b': 1}})",  # a key BFCL writes into its execution string
]


@pytest.mark.parametrize("step", REFUSED_STEPS)
def test_refused_calls_reach_the_checker_as_bfcl_decoded_them(env, step):
    """The env does not run them; the checker still gets every call as BFCL's decoder wrote it, and
    the verdict is BFCL's."""
    for task_id in ("multi_turn_base_0", "multi_turn_base_110"):
        truth = [list(t) for t in keyword_ground_truth(env.task(task_id))]
        assert_same(env, task_id, [[step, *truth[0], ""], *[[*t, ""] for t in truth[1:]]], refusals=1)
