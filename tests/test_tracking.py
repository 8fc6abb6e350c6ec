"""Each stage logs its yield and metrics to its own offline wandb run (group = the experiment), once per
content; the report logs its plots as images; `report_to: none` and WANDB_MODE=disabled log nothing.

The run directory is the fixture run (tests/fixtures_run.py: a whole round written through the real
writers, labels from the real labeler); what wandb wrote is read back with wandb's own reader of its
offline files (`wandb leet inspect --json`)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_run import FORK_PLAN, SAMPLE_PLAN, write_fixture_run

from selskill.config import load_recipe
from selskill.data.layout import StageDir
from selskill.measure.metrics import sum_yields

pytest.importorskip("wandb")

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("sample", "branch", "fork", "label", "eval")


def _inspect(run_file: Path, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", *args, str(run_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout


def read_run(directory: Path, assembled: bool = False) -> tuple[dict, dict]:
    """(the run record: name, group, job type, config; its summary) of the one offline run under
    directory/wandb; the summary from the records' updates (scalars), or as wandb assembles it (`assembled`:
    images as one object each)."""
    files = list((directory / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    records = [json.loads(line) for line in _inspect(files[0]).splitlines() if line.startswith("{")]
    run = next(r["run"] for r in records if r["type"] == "run")
    if assembled:
        return run, json.loads(_inspect(files[0], "--summary"))["summary"]
    summary = {}
    for r in records:
        if r["type"] == "summary":
            summary.update(r["summary"].get("update", {}))
    return run, summary


@pytest.fixture
def exp(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    return write_fixture_run(tmp_path / "runs", "fx")


def _recipe(exp: Path, *args: str):
    argv = ["--config", str(ROOT / "recipes" / "tiny.yaml"), "--runs_dir", str(exp.parent), "--exp", exp.name]
    return load_recipe([*argv, "--world_size", "1", "--eval_headroom", "false", *args])


def test_each_stage_logs_its_figures_once_to_an_offline_run_of_the_experiments_group(exp):
    from selskill.stages.round import paired_sr_vs_previous
    from selskill.stages.wandb_log import log_stage

    recipe = _recipe(exp, "--report_to", "wandb")
    assert all(log_stage(recipe.run, name) for name in STAGES)
    assert not any(log_stage(recipe.run, name) for name in STAGES)  # the same content is logged once
    runs = {}
    for name in STAGES:
        stage = StageDir.of(exp.parent, "fx", 1, name)
        run, summary = read_run(stage.path)
        assert (run["run_group"], run["job_type"], run["display_name"]) == ("fx", name, f"fx-round1-{name}")
        assert run["project"] == "selskill" and summary["round"] == 1
        assert summary[f"{name}/rows"] == json.loads(stage.stats_file(0).read_text())["rows"]
        assert f"{name}/seconds" in summary
        runs[name] = summary

    outcomes = [plan[0] for plans in SAMPLE_PLAN.values() for plan in plans]
    assert runs["sample"]["sample/success_rate"] == sum(outcomes) / len(outcomes)
    assert runs["sample"]["sample/tasks"] == len(SAMPLE_PLAN) and runs["sample"]["sample/rollouts"] == 6
    pools = [b[3] for b in FORK_PLAN]
    assert runs["branch"]["branch/points_by_pool/ordinary"] == pools.count("ordinary")
    assert runs["branch"]["branch/points_by_pool/post_skill"] == pools.count("post_skill")
    invoke = [p[0] for b in FORK_PLAN for p in b[4]]
    assert runs["fork"]["fork/forks_by_arm/invoke"] == len(invoke)
    assert runs["fork"]["fork/success_rate_by_arm/invoke"] == pytest.approx(sum(invoke) / len(invoke))

    label = StageDir.of(exp.parent, "fx", 1, "label")
    yields = sum_yields([json.loads(label.stats_file(0).read_text())])
    for kind, n in yields["pairs_by_kind"].items():
        assert runs["label"][f"label/pairs_by_kind/{kind}"] == n
    for reason, n in yields["pairs_by_reason"].items():
        assert runs["label"][f"label/pairs_by_reason/{reason}"] == n
    assert runs["label"]["label/pairs"] == yields["pairs"]

    metrics = json.loads((exp / "round_1" / "eval" / "metrics.json").read_text())
    delta = paired_sr_vs_previous(recipe.run)
    for split, m in metrics["splits"].items():
        overall = m["overall"]
        assert runs["eval"][f"eval/{split}/sr"] == overall["sr"]
        low, high = overall["ci"]["sr"]
        assert (runs["eval"][f"eval/{split}/sr_ci_low"], runs["eval"][f"eval/{split}/sr_ci_high"]) == (
            low,
            high,
        )
        assert runs["eval"][f"eval/{split}/delta_sr"] == delta[split]["diff"]

    # round 0 (the starting policy) is a run of its own in the same group
    assert log_stage(recipe.run.replace(round=0), "eval")
    run, summary = read_run(exp / "round_0" / "eval")
    assert (
        run["display_name"] == "fx-round0-eval" and summary["round"] == 0 and "eval/valid_seen/sr" in summary
    )


def test_a_stage_with_a_rank_missing_logs_nothing_yet(exp):
    from selskill.stages.wandb_log import log_stage

    recipe = _recipe(exp, "--report_to", "wandb", "--world_size", "2")
    assert not log_stage(recipe.run, "sample")
    assert not (exp / "round_1" / "sample" / "wandb").exists()


def test_report_to_none_or_wandb_disabled_logs_nothing(exp, monkeypatch):
    from selskill.report import build_report
    from selskill.stages.wandb_log import log_stage

    assert not log_stage(_recipe(exp, "--report_to", "none").run, "sample")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert not log_stage(_recipe(exp, "--report_to", "wandb").run, "sample")
    build_report(exp, n_boot=20)
    assert not list(exp.glob("**/wandb"))


def test_the_report_logs_its_plots_as_images_where_the_stages_logged(exp):
    from selskill.report import build_report
    from selskill.stages.wandb_log import log_stage

    assert log_stage(_recipe(exp, "--report_to", "wandb").run, "sample")
    rep = build_report(exp, n_boot=20)
    run, summary = read_run(exp, assembled=True)
    assert (run["run_group"], run["job_type"], run["display_name"]) == ("fx", "report", "fx-report")
    assert rep.plots and {f"report/{p.stem}" for p in rep.plots} == {
        k for k in summary if k.startswith("report/")
    }
    for p in rep.plots:
        image = summary[f"report/{p.stem}"]
        assert (
            image["_type"] == "image-file" and image["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
        )
    build_report(exp, n_boot=20)  # the same plots again: not logged twice
    assert len(list((exp / "wandb").glob("offline-run-*"))) == 1


def test_without_wandb_installed_one_line_says_so_and_the_stages_run_on(exp, monkeypatch, capsys):
    import selskill.monitor.tracking as tracking
    from selskill.stages.wandb_log import log_stage

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails as if it were not installed
    monkeypatch.setattr(tracking, "_missing_said", False)
    recipe = _recipe(exp, "--report_to", "wandb")
    assert not log_stage(recipe.run, "sample") and not log_stage(recipe.run, "branch")
    err = capsys.readouterr().err
    assert err.count("wandb is not installed: pip install 'selskill[wandb]'") == 1


def test_wandb_is_online_where_a_key_is_set_and_offline_where_none_is(tmp_path, monkeypatch):
    """A key (WANDB_API_KEY, or the netrc entry `wandb login` writes) means the user has an account: log online.
    None: offline, never a login prompt. WANDB_MODE, when set, decides."""
    from selskill.monitor.tracking import wandb_mode

    home = tmp_path / "home"
    home.mkdir()
    for name in ("WANDB_API_KEY", "NETRC", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))

    def mode(**env) -> str:
        monkeypatch.delenv("WANDB_MODE", raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        got = wandb_mode()
        assert __import__("os").environ["WANDB_MODE"] == got  # the processes it starts agree
        for name in env:
            monkeypatch.delenv(name)
        return got

    assert mode() == "offline"
    assert mode(WANDB_API_KEY="k" * 40) == "online"
    assert mode(WANDB_API_KEY="k" * 40, WANDB_MODE="offline") == "offline"
    (home / ".netrc").write_text("machine example.com login me password x\n")
    assert mode() == "offline"  # an entry for another host is no wandb key
    (home / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert mode() == "online"
    assert mode(WANDB_MODE="disabled") == "disabled"
    assert mode(WANDB_BASE_URL="https://wandb.example.com") == "offline"  # a server the key is not for
    other = tmp_path / "netrc"
    other.write_text("machine wandb.example.com login user password " + "k" * 40 + "\n")
    assert mode(WANDB_BASE_URL="https://wandb.example.com", NETRC=str(other)) == "online"
