"""A whole SelSkill round on BFCL on the CPU, with real parts: bfcl-eval's data, backends and checker,
the BFCL init builder (a micro Qwen3 SFT'd on one train scenario's ground truth until it plays
it back), every stage, DPO, the report."""

from __future__ import annotations

import importlib.util
import json

import pyarrow.parquet as pq
import pytest

pytest.importorskip("bfcl_eval")

from selskill.data.layout import StageDir  # noqa: E402
from selskill.data.schema import validate_table  # noqa: E402
from selskill.policy.bootstrap import TinyArch  # noqa: E402

SCENARIO = 139  # base: add_to_watchlist(stock='ZETA') | get_watchlist(): two turns, one call each
ARCH = TinyArch(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=8192,
)
RECIPE = f"""
exp: bfcl
benchmark: bfcl
bfcl_categories: base
bfcl_scenarios: "{SCENARIO}"
turn_doc_style: brief
turn_examples: false
turn_show_admissible: false
max_env_steps: 20
max_decisions: 16
max_context_tokens: 6144
max_new_tokens: 24
concurrent_episodes: 4
policy_batch_size: 8
sample_k: 4
sample_split: train
branch_top_post_skill: 1
branch_top_ordinary: 1
fork_k_invoke: 1
fork_k_skip: 1
eval_splits: train
eval_bootstrap: 50
max_length: 6144
num_train_epochs: 1
per_device_train_batch_size: 1
gradient_accumulation_steps: 1
learning_rate: 1.0e-4
save_strategy: "no"
seed: 0
"""


@pytest.fixture(scope="module")
def round_dir(tmp_path_factory):
    from selskill.benchmarks.bfcl.init_config import BfclDemoMix
    from selskill.benchmarks.bfcl.init_policy import BfclTrainTasks, build_bfcl_init_policy
    from selskill.config import load_recipe
    from selskill.config.init import InitTraining, SftSchedule
    from selskill.sft.demos import DemoPrompts
    from selskill.stages.round import run_round
    from selskill.stages.runner_setup import turn_format

    root = tmp_path_factory.mktemp("bfcl_round")
    recipe_path = root / "recipe.yaml"
    # every stage logs to its offline wandb run where wandb is installed (an optional dependency)
    report_to = "wandb" if importlib.util.find_spec("wandb") else "none"
    recipe_path.write_text(
        RECIPE
        + f"runs_dir: {root / 'runs'}\nmodel_name_or_path: {root / 'init' / 'model'}\nreport_to: {report_to}\n"
    )
    argv = ["--config", str(recipe_path)]
    recipe = load_recipe(argv)
    build_bfcl_init_policy(
        root / "init" / "model",
        tasks=BfclTrainTasks(categories=("base",), scenarios=recipe.settings.split("train")),
        seed=0,
        mix=BfclDemoMix(opening_memory=1.0, useful=0.0, reference_memory=0.0, wrong_executable=0.0),
        training=InitTraining(
            vocab_size=1024,
            arch=ARCH,
            sft=SftSchedule(pretrain_epochs=0, epochs=100, lr=1e-2, batch_size=1, max_length=6144),
        ),
        prompts=DemoPrompts(turn_format(recipe.rollout, "bfcl"), recipe.rollout.listing_style),
        progress=False,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        summary = run_round(recipe)
    return root / "runs" / "bfcl", summary


def _rows(exp_dir, round_, stage, kind):
    files = StageDir.of(exp_dir.parent, exp_dir.name, round_, stage).shard_files()
    assert files, (round_, stage)
    tables = [pq.read_table(f) for f in files]
    for t in tables:
        validate_table(t, kind)
    return [r for t in tables for r in t.to_pylist()]


def test_a_bfcl_round_writes_schema_valid_shards_and_trains(round_dir):
    exp_dir, summary = round_dir
    sample = _rows(exp_dir, 1, "sample", "rollout")
    assert len(sample) == 4 and {r["task_id"] for r in sample} == {f"train/multi_turn_base_{SCENARIO}"}
    assert {r["task_type"] for r in sample} == {"base"}
    assert all(r["termination"] in ("won", "failed", "step_limit", "context_limit") for r in sample)
    branches = _rows(exp_dir, 1, "branch", "branch")
    forks = _rows(exp_dir, 1, "fork", "fork")
    assert branches and len(forks) == 2 * len(branches)
    by_id = {r["rollout_id"]: r for r in sample}
    for f in forks:  # every fork continues its source's exact prefix
        assert f["token_ids"][: f["prefix_len"]] == by_id[f["rollout_id"]]["token_ids"][: f["prefix_len"]]
    pairs = _rows(exp_dir, 1, "label", "pair")
    assert pairs and summary["pairs_by_kind"]
    local = [p for p in pairs if p["kind"] == "local"]
    for p in local:  # efficiency and outcome as BFCL counts steps: the fork's env_steps_after_branch
        fork = next(f for f in forks if f["fork_id"] == p["chosen_source"])
        assert p["chosen_steps"] == fork["env_steps_after_branch"]
    assert (exp_dir / "round_1" / "train" / "COMPLETED").is_file()
    for r in (0, 1):
        rows = _rows(exp_dir, r, "eval", "rollout")
        assert [x["task_id"] for x in rows] == [f"train/multi_turn_base_{SCENARIO}"]
        metrics = json.loads((exp_dir / f"round_{r}" / "eval" / "metrics.json").read_text())
        assert metrics["benchmark"] == "bfcl" and metrics["steps"].startswith("function-call steps")
        overall = metrics["splits"]["train"]["overall"]
        assert overall["avg_steps"] == rows[0]["env_steps"]  # Avg. Steps = function-call steps
        assert set(metrics["splits"]["train"]["by_task_type"]) == {"base"}
    assert summary["benchmark"] == "bfcl" and "metrics_round_1" in summary


def test_every_stage_of_the_round_logged_its_figures_to_an_offline_wandb_run(round_dir):
    pytest.importorskip("wandb")
    from test_tracking import read_run

    exp_dir, summary = round_dir
    for round_, stage in [(0, "eval"), *((1, s) for s in ("sample", "branch", "fork", "label", "eval"))]:
        run, logged = read_run(exp_dir / f"round_{round_}" / stage)
        assert (run["run_group"], run["job_type"], run["display_name"]) == (
            "bfcl",
            stage,
            f"bfcl-round{round_}-{stage}",
        )
        assert logged["round"] == round_ and f"{stage}/seconds" in logged
    _, sample = read_run(exp_dir / "round_1" / "sample")
    rows = _rows(exp_dir, 1, "sample", "rollout")
    assert sample["sample/success_rate"] == sum(r["success"] for r in rows) / len(rows)
    _, label = read_run(exp_dir / "round_1" / "label")
    assert {k: label[f"label/pairs_by_kind/{k}"] for k in summary["pairs_by_kind"]} == summary[
        "pairs_by_kind"
    ]
    _, evaluation = read_run(exp_dir / "round_1" / "eval")
    overall = summary["metrics_round_1"]["splits"]["train"]["overall"]
    assert evaluation["eval/train/sr"] == overall["sr"] and "eval/train/delta_sr" in evaluation
    # the train stage's run (TRL's report_to) is in the same group
    run, _ = read_run(exp_dir / "round_1" / "train")
    assert (run["run_group"], run["job_type"]) == ("bfcl", "train")


def test_the_report_shows_the_bfcl_round(round_dir):
    from selskill.report import build_report

    exp_dir, _ = round_dir
    rep = build_report(exp_dir, n_boot=50)
    text = rep.markdown.read_text()
    assert "Benchmark: BFCL multi-turn" in text and "function-call steps" in text
    assert "SR (%) by BFCL category on train:" in text and "| base |" in text
    assert "| init |" in text and "| R1 |" in text and "Pairs per task by kind" in text
    assert rep.html.is_file() and rep.plots
