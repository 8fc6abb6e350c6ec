"""The label's arm rule as a recorded stage input, and label agreement between two forks of the
same branch points (the pure comparison and `selskill bench label-agreement`'s plumbing)."""

import json

import pytest
from fixtures_run import _finish_stage, _fork_row, write_fixture_run

from selskill.config import LabelConfig, RunConfig
from selskill.data.contract import StageRefused, read_stage
from selskill.data.layout import StageDir, round_dir
from selskill.stages import agreement as agr
from selskill.stages.label import LabelStep


@pytest.fixture
def runs(tmp_path):
    write_fixture_run(tmp_path / "runs", "main")
    return tmp_path / "runs"


def _local(branch_id, arm):
    return {"kind": "local", "branch_id": branch_id, "chosen_arm": arm}


def test_agreement_counts_same_outcomes_kappa_and_the_confusion_table():
    ids = ["b0", "b1", "b2", "b3", "b4"]
    a = [_local("b0", "skip"), _local("b1", "invoke"), _local("b2", "invoke"), _local("b4", "invoke")]
    b = [_local("b0", "invoke"), _local("b1", "invoke"), _local("b2", "skip"), _local("b4", "invoke")]
    a.append({"kind": "episode", "branch_id": "", "chosen_arm": ""})  # episode pairs are no label of a point
    r = agr.label_agreement(a, b, ids)
    # b3 was dropped by both runs: an agreement on "none"
    assert (r["branch_points"], r["same_outcome"], r["agreement"]) == (5, 3, 0.6)
    # chance: (3*3 + 1*1 + 1*1) / 25 = 0.44 -> (0.6 - 0.44) / 0.56
    assert r["kappa"] == pytest.approx(0.2857, abs=1e-4)
    assert r["confusion"]["skip"] == {"invoke": 1, "skip": 0, "none": 0}
    assert r["confusion"]["invoke"] == {"invoke": 2, "skip": 1, "none": 0}
    assert r["confusion"]["none"] == {"invoke": 0, "skip": 0, "none": 1}
    assert (r["labelled_by_both"], r["same_arm_when_labelled_by_both"]) == (4, 2)
    assert r["outcomes"]["first"] == {"skip": 1, "invoke": 3, "none": 1}


def test_agreement_edge_cases():
    same = agr.label_agreement([_local("b0", "skip")], [_local("b0", "skip")], ["b0", "b1"])
    assert same["agreement"] == 1.0 and same["kappa"] == 1.0
    # one outcome everywhere: chance agrees fully, kappa is undefined
    none = agr.label_agreement([], [], ["b0", "b1"])
    assert none["agreement"] == 1.0 and none["kappa"] is None
    assert agr.label_agreement([], [], [])["agreement"] is None
    flipped = agr.label_agreement([_local("b0", "skip")], [_local("b0", "invoke")], ["b0"])
    assert flipped["agreement"] == 0.0 and flipped["same_arm_when_labelled_by_both"] == 0
    with pytest.raises(ValueError, match="'bx' is not among the branch points compared"):
        agr.label_agreement([_local("bx", "skip")], [], ["b0"])


def test_the_arm_rule_is_a_recorded_input_of_the_label_stage(runs):
    import shutil

    shutil.rmtree(StageDir.of(runs, "main", 1, "label").path)  # the fixture's label records no inputs
    run = RunConfig(exp="main", runs_dir=str(runs), round=1)
    assert LabelStep(run, LabelConfig(), 0).run(run.rank, run.world_size) is True
    stage = StageDir.of(runs, "main", 1, "label")
    assert stage.read_marker(0)["inputs"]["label_arm_rule"] == "best"

    def arm(rows, branch):
        return next(p["chosen_arm"] for p in rows if p["branch_id"].endswith(branch))

    # b4: invoke wins 1 of 2 in 2 steps, skip 1 of 1 in 9
    assert arm(read_stage(stage, "pair", 1).to_pylist(), "/b4") == "invoke"
    assert LabelStep(run, LabelConfig(), 0).run(run.rank, run.world_size) is False  # same rule: skipped
    with pytest.raises(StageRefused, match="label_arm_rule: 'best' -> 'success_rate'"):
        LabelStep(run, LabelConfig(label_arm_rule="success_rate"), 0).run(run.rank, run.world_size)
    redo = RunConfig(exp="main", runs_dir=str(runs), round=1, redo=True)
    assert (
        LabelStep(redo, LabelConfig(label_arm_rule="success_rate"), 0).run(redo.rank, redo.world_size) is True
    )
    assert arm(read_stage(stage, "pair", 1).to_pylist(), "/b4") == "skip"
    with pytest.raises(ValueError, match="label_arm_rule must be one of best, success_rate"):
        LabelConfig(label_arm_rule="majority")


# the second fork of the fixture's five branch points: b0 and b2 flip, b1 and b4 keep their arm, b3 fails twice
SECOND_PLAN = {
    "b0": ([(True, 6, 0), (False, 20, 0)], [(False, 25, 0), (False, 22, 0)]),
    "b1": ([(True, 5, 0), (True, 7, 0)], [(False, 25, 0), (False, 22, 1)]),
    "b2": ([(True, 6, 0)], [(True, 4, 0)]),
    "b3": ([(False, 20, 0)], [(False, 20, 0)]),
    "b4": ([(True, 3, 0)], [(True, 9, 0)]),
}


class FakeExecutor:
    """Runs the real label stage; a fork stage writes SECOND_PLAN's rows (the first run's are on disk)."""

    waits = True

    def __init__(self):
        self.calls = []

    def run(self, recipe, stages):
        run = recipe.run
        self.calls.append((run.exp, [s.name for s in stages], recipe.seed, run.redo))
        for stage in stages:
            if stage.name == "fork":
                fork = StageDir.of(run.runs_dir, run.exp, run.round, "fork")
                if fork.completed_ranks():
                    continue
                sd = lambda name: StageDir.of(run.runs_dir, run.exp, run.round, name)  # noqa: E731
                sources = {r["rollout_id"]: r for r in read_stage(sd("sample"), "rollout", 1).to_pylist()}
                rows = []
                for b in read_stage(sd("branch"), "branch", 1).to_pylist():
                    inv, skp = SECOND_PLAN[b["branch_id"].rsplit("/", 1)[1]]
                    for arm, plans in (("invoke", inv), ("skip", skp)):
                        for k, plan in enumerate(plans):
                            src = sources[b["rollout_id"]]
                            rows.append(_fork_row(run.exp, run.round, src, b, arm, k, plan, recipe.seed + k))
                _finish_stage(fork, "fork", rows)
            else:
                stage.of(recipe).run(0, 1)


def _argv(runs, *more):
    return ["--config", "recipes/tiny.yaml", "--runs_dir", str(runs), "--exp", "main", "--round", "1",
            "--world_size", "1", *more]  # fmt: skip


def test_label_agreement_reforks_the_linked_branch_points_with_another_seed(runs, capsys):
    ex = FakeExecutor()
    result = agr.run_label_agreement(_argv(runs, "--redo", "true"), fork_seed=7, executor=ex)
    other = "main-refork-seed7"
    # the first run is checked, never recomputed; the second forks and labels with the other seed
    assert ex.calls == [("main", ["fork", "label"], 0, False), (other, ["fork", "label"], 7, True)]
    for stage in ("sample", "branch"):
        link = round_dir(runs, other, 1) / stage
        assert link.is_symlink() and link.resolve() == (round_dir(runs, "main", 1) / stage).resolve()
    assert (runs / other / "round_0").is_symlink()  # the policy round 1 starts from
    assert not (round_dir(runs, other, 1) / "fork").is_symlink()
    assert (result["branch_points"], result["same_outcome"], result["labelled_by_both"]) == (5, 3, 4)
    assert result["confusion"]["skip"]["invoke"] == 1 and result["confusion"]["invoke"]["skip"] == 1
    assert result["fork_seed"] == {"first": 0, "second": 7} and result["label_arm_rule"] == "best"
    assert (result["fork_k_invoke"], result["fork_k_skip"], result["fork_temperature"]) == (2, 2, 0.8)
    saved = json.loads((round_dir(runs, other, 1) / "label_agreement.json").read_text())
    assert saved == json.loads(json.dumps(result))
    out = capsys.readouterr().out
    assert "same outcome (invoke / skip / none): 3 (60.0%)" in out and "Cohen's kappa: 0.286" in out


def test_label_agreement_refuses_what_cannot_be_compared(runs):
    with pytest.raises(ValueError, match="--fork-seed 0 is the recipe's seed"):
        agr.run_label_agreement(_argv(runs), fork_seed=0, executor=FakeExecutor())
    with pytest.raises(ValueError, match="label_kinds is episode"):
        agr.run_label_agreement(_argv(runs, "--label_kinds", "episode"), executor=FakeExecutor())
    # the first run labelled under `best`: comparing under `success_rate` is refused, naming the key
    import shutil

    shutil.rmtree(StageDir.of(runs, "main", 1, "label").path)
    LabelStep(RunConfig(exp="main", runs_dir=str(runs), round=1), LabelConfig(), 0).run()
    with pytest.raises(StageRefused, match=r"round 1 of main does not match this recipe: .*label_arm_rule"):
        agr.run_label_agreement(_argv(runs, "--label_arm_rule", "success_rate"), executor=FakeExecutor())
    assert not (round_dir(runs, "main-refork-seed1", 1) / "fork").exists()


def test_the_command_line_passes_the_recipe_through(monkeypatch):
    from selskill import cli

    seen = {}
    monkeypatch.setattr(
        agr, "run_label_agreement", lambda argv, fork_seed=None: seen.update(argv=argv, seed=fork_seed)
    )
    argv = ["bench", "label-agreement", "--config", "recipes/tiny.yaml", "--round", "2", "--fork-seed", "3"]
    assert cli.main([*argv, "--seed", "5"]) == 0
    assert seen == {"argv": ["--config", "recipes/tiny.yaml", "--round", "2", "--seed", "5"], "seed": 3}
