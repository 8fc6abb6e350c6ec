"""BFCL's own multi-turn prompting pipeline, re-created from bfcl-eval's source, as a test reference.

Three pieces of bfcl-eval decide what a model's text scores:

- the decoder, `default_decode_execute_prompting` and the functions it calls
  (bfcl_eval/model_handler/utils.py). That module cannot be imported here: it pulls provider
  SDKs and tree-sitter parsers that the project installs without (`--no-deps`). So the
  decoder's functions are compiled from the installed file's own source text, unchanged, and
  run: they are bfcl-eval's code, not a copy.
- the inference loop, `BaseHandler.inference_multi_turn_prompting` (model_handler/base_handler.py):
  per turn, decode each response; a failed or empty decode ends the turn; otherwise execute
  the calls and count a step; past MAXIMUM_STEP_LIMIT steps the turn is kept and the task
  stops. Re-created below statement for statement, with a scripted model.
- the scoring, `_evaluate_single_multi_turn_entry` (eval_checker/eval_runner.py): fewer turns
  than the ground truth is `force_terminated`; otherwise every response is decoded again,
  failures and empty ones skipped, and `multi_turn_checker` (imported, bfcl-eval's own)
  judges the rest.

BFCL's decoder `eval`s arithmetic and its executor `eval`s every call: only the tests' own
fixed, harmless inputs ever go through this module.
"""

from __future__ import annotations

import ast
import builtins
import importlib.metadata
import re
from importlib import resources

from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT
from bfcl_eval.constants.enums import ReturnFormat
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

DECODER_FUNCTIONS = (
    "ast_parse",
    "resolve_ast_call",
    "resolve_ast_by_type",
    "default_decode_execute_prompting",
    "parse_nested_value",
    "decoded_output_to_execution_list",
)
INFERENCE_MODEL = "selskill"  # the env's instance names are BFCL's inference names for this model
CHECKER_MODEL = "bfcl_reference"


def bfcl_version() -> str:
    return importlib.metadata.version("bfcl-eval")


def load_decoder():
    """bfcl-eval's `default_decode_execute_prompting`, compiled from its installed source."""
    path = resources.files("bfcl_eval") / "model_handler" / "utils.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in DECODER_FUNCTIONS]
    assert sorted(n.name for n in wanted) == sorted(DECODER_FUNCTIONS), "bfcl-eval's decoder moved"
    namespace = {"ast": ast, "re": re, "builtins": builtins, "ReturnFormat": ReturnFormat}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace["default_decode_execute_prompting"]


DECODE = load_decoder()


def _free(prefix: str) -> None:
    for key in [k for k in vars(multi_turn_utils) if k.startswith(prefix)]:
        del vars(multi_turn_utils)[key]


def _instance_prefix(model: str, task_id: str) -> str:
    return re.sub(r"[-./:]", "_", f"{model}_{task_id}_")


def inference(entry: dict, script: list[list[str]]) -> tuple[list[list[str]], list[list[list[str]]]]:
    """BFCL's inference loop with a scripted model: `script[turn]` are the responses it gives in
    turn order (a turn that outruns its script answers ""). Returns (the responses recorded per
    turn, the execution results of each executed step)."""
    test_category = entry["id"].rsplit("_", 1)[0]
    long_context = "long_context" in test_category or "composite" in test_category
    all_model_response: list[list[str]] = []
    outputs: list[list[list[str]]] = []
    force_quit = False
    try:
        for turn_idx in range(len(entry["question"])):
            responses = iter(script[turn_idx] if turn_idx < len(script) else [])
            current_turn_response = []
            count = 0
            while True:
                model_responses = next(responses, "")
                current_turn_response.append(model_responses)
                try:
                    decoded = DECODE(model_responses, has_tool_call_tag=False)
                    if multi_turn_utils.is_empty_execute_response(decoded):
                        break
                except Exception:
                    break
                results, _ = multi_turn_utils.execute_multi_turn_func_call(
                    decoded,
                    entry["initial_config"],
                    entry["involved_classes"],
                    INFERENCE_MODEL,
                    entry["id"],
                    long_context=long_context,
                    is_evaL_run=False,
                )
                outputs.append(results)
                count += 1
                if count > MAXIMUM_STEP_LIMIT:
                    force_quit = True
                    break
            all_model_response.append(current_turn_response)
            if force_quit:
                break
    finally:
        _free(_instance_prefix(INFERENCE_MODEL, entry["id"]))
    return all_model_response, outputs


def decoded_for_checker(model_result_list: list[list[str]]) -> list[list[list[str]]]:
    """What `eval_runner` hands the checker: each turn's responses decoded, failures and empties skipped."""
    out = []
    for single_turn in model_result_list:
        turn = []
        for item in single_turn:
            try:
                decoded = DECODE(item, has_tool_call_tag=False)
                if multi_turn_utils.is_empty_execute_response(decoded):
                    continue
                turn.append(decoded)
            except Exception:
                continue
        out.append(turn)
    return out


def score(entry: dict, ground_truth: list[list[str]], model_result_list: list[list[str]]) -> dict:
    """`eval_runner`'s verdict: {"valid": ..., "error_type": ...}."""
    if len(model_result_list) != len(ground_truth):
        return {"valid": False, "error_type": "multi_turn:force_terminated"}
    decoded = decoded_for_checker(model_result_list)
    test_category = entry["id"].rsplit("_", 1)[0]
    try:
        result = multi_turn_checker(decoded, ground_truth, entry, test_category, CHECKER_MODEL)
    finally:
        _free(_instance_prefix(CHECKER_MODEL, entry["id"]))
        _free(_instance_prefix(f"{CHECKER_MODEL}_eval", entry["id"]))
        _free(_instance_prefix(f"{CHECKER_MODEL}_ground_truth_eval", entry["id"]))
    return {"valid": bool(result["valid"]), "error_type": result.get("error_type")}
