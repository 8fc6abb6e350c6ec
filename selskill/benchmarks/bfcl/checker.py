"""BFCL's checker (`multi_turn_checker`) run on the calls an episode recorded, its code unchanged.

The checker caches its backend instances in its module's globals under a model name and the
task id; `check_calls` frees exactly the entries of its (model, task) after each check, so a
long run does not grow and two envs in one process never share state.
"""

from __future__ import annotations

import copy
import re
import types
from collections.abc import Sequence

from selskill.benchmarks.bfcl.tasks import BfclTask, bfcl_constants
from selskill.envs.base import EnvError


def _checker_modules():
    bfcl_constants()
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils

    return multi_turn_checker, multi_turn_utils


def _instance_key(name: str) -> str:
    return re.sub(r"[-./:]", "_", name)  # BFCL's sanitising of its instance names


def free_checker_cache(model_name: str, task_id: str) -> int:
    """Drop the backend instances BFCL's checker cached for (model, task); returns how many.

    `execute_multi_turn_func_call` keeps every instance it builds in its module's globals
    under `{model}[_ground_truth]_eval_{task}_{class}_instance`, forever.
    """
    utils = _checker_modules()[1]
    prefixes = tuple(_instance_key(f"{model_name}{kind}_eval_{task_id}_") for kind in ("", "_ground_truth"))
    stale = [k for k in list(vars(utils)) if k.startswith(prefixes) and k.endswith("_instance")]
    for key in stale:
        del vars(utils)[key]
    return len(stale)


def _answering_checker(answers: dict[int, dict[int, str]]):
    """BFCL's `multi_turn_checker`, its code unchanged, run with an executor that answers the calls in
    `answers` ({id of a step's call list: {index in it: output}}) with their output instead of
    `eval`ing them; every other call runs through BFCL's own `execute_multi_turn_func_call`."""
    checker, utils = _checker_modules()
    function = checker.multi_turn_checker
    if not answers:
        return function
    execute = utils.execute_multi_turn_func_call

    def execute_answering(func_call_list, **kwargs):
        answered = answers.get(id(func_call_list))
        if not answered:
            return execute(func_call_list, **kwargs)
        results, instances = execute([], **kwargs)  # builds (or finds) the checker's instances
        for index, call in enumerate(func_call_list):
            if index in answered:
                results.append(answered[index])
            else:
                outputs, instances = execute([call], **kwargs)
                results.extend(outputs)
        return results, instances

    scope = {**vars(checker), "execute_multi_turn_func_call": execute_answering}
    return types.FunctionType(function.__code__, scope, function.__name__, function.__defaults__)


def check_calls(
    task: BfclTask,
    calls: Sequence[Sequence[Sequence[str]]],
    model_name: str,
    answered: dict[tuple[int, int, int], str] | None = None,
) -> dict:
    """BFCL's verdict on recorded calls (turn -> step -> call strings); frees the checker's cache.

    `answered`: {(turn, step, call): output} of the calls the env refused to run; the checker gets
    them as they are, and that output instead of running them."""
    if len(calls) != len(task.ground_truth):
        return {
            "valid": False,
            "error_type": "multi_turn:force_terminated",
            "error_message": f"{len(calls)} turns played of {len(task.ground_truth)}",
        }
    decoded = [[list(step) for step in turn] for turn in calls]
    answers: dict[int, dict[int, str]] = {}
    for (turn, step, index), output in (answered or {}).items():
        answers.setdefault(id(decoded[turn][step]), {})[index] = output
    try:
        result = _answering_checker(answers)(
            decoded,
            [list(t) for t in task.ground_truth],
            copy.deepcopy(task.entry),
            f"multi_turn_{task.category}",
            model_name,
        )
    except Exception as exc:
        raise EnvError(f"{task.id}: BFCL's checker failed: {exc!r}") from exc
    finally:
        free_checker_cache(model_name, task.id)
    return result
