"""BFCL's own multi-turn prompting pipeline, re-created from bfcl-eval's source, as a test reference.

Three pieces of bfcl-eval decide what a model's text scores:

- the decoder, `default_decode_execute_prompting` (bfcl_eval/model_handler/utils.py), run in
  its own real module, so its arithmetic `eval`s with every name that module defines. The
  module imports parsers for other formats (tree-sitter) and a retry helper (tenacity) that
  the project installs without (`--no-deps`) and the decoder never calls: those few absent
  packages are stood in for while the module is imported, and only then. Its
  `bfcl_eval.constants.eval_config` creates result folders when imported: they go to a
  temporary BFCL_PROJECT_ROOT, not into the installed package.
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

import atexit
import importlib
import importlib.metadata
import os
import re
import shutil
import sys
import tempfile
from unittest import mock

from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

DECODER_MODULE = "bfcl_eval.model_handler.utils"
# imported by the decoder's module for other formats and retries, never called by the decoder
ABSENT_SDKS = ("tree_sitter", "tree_sitter_java", "tree_sitter_javascript", "tenacity")
INFERENCE_MODEL = "selskill"  # the env's instance names are BFCL's inference names for this model
CHECKER_MODEL = "bfcl_reference"


def bfcl_version() -> str:
    return importlib.metadata.version("bfcl-eval")


def load_decoder_module():
    """bfcl-eval's real decoder module, imported with stand-ins for the SDKs the project lacks."""
    if DECODER_MODULE in sys.modules:
        return sys.modules[DECODER_MODULE]
    stand_ins = {}
    for name in ABSENT_SDKS:
        try:
            importlib.import_module(name)
        except ImportError:
            stand_ins[name] = sys.modules[name] = mock.MagicMock(name=name)
    project_root = os.environ.get("BFCL_PROJECT_ROOT")
    os.environ["BFCL_PROJECT_ROOT"] = root = tempfile.mkdtemp(prefix="bfcl-project-root-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    try:
        return importlib.import_module(DECODER_MODULE)
    finally:
        for name in stand_ins:
            del sys.modules[name]
        if project_root is None:
            del os.environ["BFCL_PROJECT_ROOT"]
        else:
            os.environ["BFCL_PROJECT_ROOT"] = project_root


DECODER = load_decoder_module()
DECODE = DECODER.default_decode_execute_prompting


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
