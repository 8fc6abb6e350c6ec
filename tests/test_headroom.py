"""The skills' headroom: tasks paired by id and classed, Panel B's BM25 means per class, the
budget curve from one pair of evals, and the eval stage (and `selskill eval`) measuring it."""

import json

import pyarrow.parquet as pq
import pytest
import yaml

from selskill.agent.eval_modes import SELF_REASONING as EXPLICIT_SKIP
from selskill.config.stages import EvalConfig
from selskill.data.layout import StageDir
from selskill.measure.headroom import budget_curve, invoked_skills, skill_headroom, within_budget
from selskill.skills import Skill, SkillLibrary
from selskill.skills.scorers import BM25Scorer, skill_document


def _turn(kind="action", skill=None):
    return {"kind": kind, "skill": skill}


def _row(task_id, won, task_type="heat", calls=(), n_turns=4):
    turns = [_turn("skill", s) for s in calls]
    turns += [_turn() for _ in range(n_turns - len(turns))]
    return {"task_id": task_id, "task_type": task_type, "success": won, "n_turns": n_turns, "turns": turns}


LIB = SkillLibrary(
    {
        s.name: s
        for s in (
            Skill("heat_object", "Heat an object with the microwave.", "memory", "-"),
            Skill("clean_object", "Clean an object in the sinkbasin.", "memory", "-"),
            Skill("search_room", "Look through every receptacle of the room.", "memory", "-"),
        )
    }
)


def test_tasks_are_paired_by_id_and_classed():
    with_skills = [
        _row("s/1", True, calls=["heat_object"]),  # positive
        _row("s/2", False, calls=["clean_object"]),  # negative
        _row("s/3", True),  # both won
        _row("s/4", False, task_type="clean"),  # both lost
        _row("s/5", True, task_type="clean"),  # positive
        _row("s/6", True),  # only with skills: unpaired
    ]
    without = [
        _row("s/5", False, task_type="clean"),  # any order
        _row("s/4", False, task_type="clean"),
        _row("s/3", True),
        _row("s/2", True),
        _row("s/1", False),
    ]
    h = skill_headroom(with_skills, without, n_boot=200)
    assert h["tasks"] == 5 and h["unpaired"] == {"with_skills": 1, "without": 0}
    assert h["counts"] == {"positive": 2, "negative": 1, "both_won": 1, "both_lost": 1}
    assert h["shares"]["positive"] == pytest.approx(0.4)
    assert h["sr_with"] == pytest.approx(0.6) and h["sr_without"] == pytest.approx(0.4)
    assert h["net_gain"] == pytest.approx(0.2)  # positive - negative = SR with - SR without
    assert h["oracle_sr"] == pytest.approx(0.8) and h["oracle_gain"] == pytest.approx(0.2)
    lo, hi = h["net_gain_ci"]
    assert lo <= h["net_gain"] <= hi
    assert h["by_task_type"]["clean"]["counts"] == {
        "positive": 1,
        "negative": 0,
        "both_won": 0,
        "both_lost": 1,
    }
    assert h["by_task_type"]["heat"]["tasks"] == 3 and h["by_task_type"]["heat"]["net_gain"] == 0.0
    assert "similarity" not in h  # no library: no Panel B
    with pytest.raises(ValueError, match="s/3 has more than one row"):
        skill_headroom(with_skills + [_row("s/3", False)], without)


def test_panel_b_is_the_mean_bm25_score_of_the_called_skills_per_class():
    texts = {
        "s/1": "heat some egg and put it in the fridge",
        "s/2": "clean a mug and put it in the coffee machine",
        "s/3": "find two pens",
        "s/4": "put a towel in the sinkbasin",
    }
    with_skills = [
        _row("s/1", True, calls=["heat_object", "search_room", "heat_object"]),  # positive, 2 distinct skills
        _row("s/2", False, calls=["clean_object", "not_a_skill"]),  # negative; an unknown name is not scored
        _row("s/3", True, calls=["search_room"]),  # both won
        _row("s/4", False),  # both lost, called nothing: not in Panel B
    ]
    without = [_row("s/1", False), _row("s/2", True), _row("s/3", True), _row("s/4", False)]
    h = skill_headroom(with_skills, without, LIB, texts, n_boot=0)
    names = list(LIB)
    scorer = BM25Scorer([skill_document(LIB[n]) for n in names])

    def score(task, skill):
        return float(scorer.score(texts[task])[names.index(skill)])

    sim = h["similarity"]
    assert sim["positive"] == {
        "tasks": 1,
        "mean": pytest.approx((score("s/1", "heat_object") + score("s/1", "search_room")) / 2),
    }
    assert sim["negative"]["mean"] == pytest.approx(score("s/2", "clean_object"))
    assert sim["no_effect"] == {"tasks": 1, "mean": pytest.approx(score("s/3", "search_room"))}
    assert score("s/1", "heat_object") > 0 and h["net_gain_ci"] is None
    assert invoked_skills(with_skills[0]) == ["heat_object", "search_room"]
    with pytest.raises(ValueError, match="no task text for s/3"):
        skill_headroom(with_skills, without, LIB, {k: v for k, v in texts.items() if k != "s/3"})


def test_a_smaller_budget_is_read_off_the_played_episodes():
    with_skills = [
        _row("s/1", True, calls=["heat_object"], n_turns=6),
        _row("s/2", True, n_turns=3),
        _row("s/3", False, calls=["clean_object", "search_room"], n_turns=10),
    ]
    without = [_row("s/1", False, n_turns=10), _row("s/2", True, n_turns=5), _row("s/3", True, n_turns=4)]
    cut = within_budget(with_skills, 4, played_budget=10)
    assert [r["success"] for r in cut] == [False, True, False]  # s/1 won on its 6th decision
    assert [r["n_turns"] for r in cut] == [4, 3, 4] and cut[0]["termination"] == "step_limit"
    assert len(cut[2]["turns"]) == 4 and invoked_skills(cut[2]) == ["clean_object", "search_room"]
    assert invoked_skills(within_budget(with_skills, 1)[2]) == ["clean_object"]
    curve = budget_curve(with_skills, without, [10, 4, 5], played_budget=10, n_boot=0)
    assert list(curve) == [4, 5, 10]
    assert curve[10]["counts"] == {"positive": 1, "negative": 1, "both_won": 1, "both_lost": 0}
    # at 5 decisions s/1 is lost either way; at 4 s/2 is won only with the skills
    assert curve[5]["counts"] == {"positive": 0, "negative": 1, "both_won": 1, "both_lost": 1}
    assert curve[4]["counts"] == {"positive": 1, "negative": 1, "both_won": 0, "both_lost": 1}
    with pytest.raises(ValueError, match="above the 10 decisions the rows were played with"):
        within_budget(with_skills, 11, played_budget=10)
    with pytest.raises(ValueError, match="more than the 8 decisions"):
        within_budget(with_skills, 4, played_budget=8)
    with pytest.raises(ValueError, match="at least 1"):
        within_budget(with_skills, 0)


def test_eval_headroom_needs_a_mode_with_skills():
    assert (
        EvalConfig(eval_headroom=True, eval_mode="conservative").headroom_stage
        == "eval-conservative-headroom"
    )
    with pytest.raises(ValueError, match="eval_headroom must be false with eval_mode no_skills"):
        EvalConfig(eval_headroom=True, eval_mode="no_skills")


# --- measured by the eval stage and by `selskill eval` ---------------------------------------------


def test_the_eval_scores_the_task_as_the_env_states_it_against_the_listed_library(small_games):
    from selskill.benchmarks.alfworld.env import AlfworldEnv
    from selskill.config import RolloutConfig, RunConfig
    from selskill.stages.evaluate import headroom_summary
    from selskill.stages.runner_setup import runner_library
    from selskill.stages.task_source import split_index

    run, rollout = RunConfig(exp="t"), RolloutConfig(max_decisions=9)
    cfg = EvalConfig(eval_splits="train", eval_headroom=True, eval_mode="explicit_skip")
    index = split_index(run, "train", str(small_games))
    by_type = {g.task_type: g.task_id for g in index.games}
    ids = [
        by_type[t]
        for t in ("look_at_obj_in_light", "pick_clean_then_place_in_recep", "pick_and_place_simple")
    ]
    with_skills = [
        _row(ids[0], True, calls=["examine_with_light"]),
        _row(ids[1], False, calls=["self_reasoning"]),  # explicit_skip's own skill is in its library
        _row(ids[2], True),
    ]
    without = [_row(ids[0], False), _row(ids[1], True), _row(ids[2], True)]
    got = headroom_summary(with_skills, without, run, rollout, cfg, 0, str(small_games))
    assert list(got) == ["train"] and got["train"]["max_decisions"] == 9
    env = AlfworldEnv(index)
    library = runner_library(rollout, run.benchmark)
    library = SkillLibrary({**library, "self_reasoning": EXPLICIT_SKIP})
    names = list(library)
    scorer = BM25Scorer([skill_document(library[n]) for n in names])

    def score(task, skill):
        return float(scorer.score(env.reset(task).task)[names.index(skill)])

    sim = got["train"]["similarity"]
    assert score(ids[0], "examine_with_light") > 0  # "examine the bowl with the desklamp"
    assert sim["positive"] == {"tasks": 1, "mean": pytest.approx(score(ids[0], "examine_with_light"))}
    assert sim["negative"] == {"tasks": 1, "mean": pytest.approx(score(ids[1], "self_reasoning"))}
    assert sim["no_effect"] == {"tasks": 0, "mean": None}


@pytest.fixture
def recipe(tmp_path, small_games, tiny_model_dir):
    model = tmp_path / "runs" / "t" / "round_1" / "train" / "model"
    model.parent.mkdir(parents=True)
    model.symlink_to(tiny_model_dir)  # round 1's trained model is what the round's eval plays
    path = tmp_path / "recipe.yaml"
    path.write_text(
        f"exp: t\nruns_dir: {tmp_path / 'runs'}\ngames_dir: {small_games}\nmax_env_steps: 4\nmax_decisions: 6\n"
        "max_new_tokens: 12\nconcurrent_episodes: 4\npolicy_batch_size: 8\nseed: 3\neval_splits: train\n"
        "eval_max_tasks: 3\neval_bootstrap: 10\n"
    )
    return path


def _rows(stage: StageDir) -> list[dict]:
    return [r for f in stage.shard_files() for r in pq.read_table(f).to_pylist()]


def _system(row: dict) -> str:
    return json.loads(row["messages"])[0]["content"]


def test_the_eval_stage_records_the_option_and_writes_the_headroom(recipe, tmp_path, capsys):
    from selskill.config import load_recipe
    from selskill.stages.table import BY_NAME, stage_main

    runs = tmp_path / "runs"
    assert stage_main("eval", ["--config", str(recipe), "--eval_headroom", "true"]) == 0
    eval_dir, partner = StageDir.of(runs, "t", 1, "eval"), StageDir.of(runs, "t", 1, "eval-headroom")
    inputs = json.loads(eval_dir.marker(0).read_text())["inputs"]
    assert inputs["eval_headroom"] is True and yaml.safe_load(eval_dir.config.read_text())["eval_headroom"]
    # the no-skills episodes: their own stage, recorded as what they play
    played = json.loads(partner.marker(0).read_text())["inputs"]
    assert played["eval_mode"] == "no_skills" and played["eval_splits"] == "train"
    with_skills, without = _rows(eval_dir), _rows(partner)
    assert sorted(r["task_id"] for r in without) == sorted(r["task_id"] for r in with_skills)
    assert len(with_skills) == 3 and all(
        r["rollout_id"].startswith("eval-headroom/r1/train/") for r in without
    )
    assert "systematic_search" in _system(with_skills[0]) and "systematic_search" not in _system(without[0])
    metrics = json.loads((eval_dir.path / "metrics.json").read_text())
    assert metrics["splits"]["train"]["overall"]["episodes"] == 3  # the skills episodes only
    h = metrics["headroom"]["train"]
    assert h == json.loads(json.dumps(h)) and h["tasks"] == 3 and h["max_decisions"] == 6
    assert sum(h["counts"].values()) == 3 and set(h["similarity"]) == {"positive", "negative", "no_effect"}
    want = skill_headroom(with_skills, without, n_boot=0)
    assert h["counts"] == want["counts"] and h["net_gain"] == want["net_gain"]
    # `selskill bench profile` reads the pair; its default budgets stop at the one played
    from selskill.cli import main

    capsys.readouterr()
    assert main(["bench", "profile", "--exp", str(runs / "t"), "--round", "1", "--played", "6"]) == 0
    table = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and line[2].isdigit()
    ]
    assert [line.split("|")[1].strip() for line in table] == ["6"]
    assert (
        main(
            ["bench", "profile", "--exp", str(runs / "t"), "--round", "1", "--played", "6", "--budgets", "8"]
        )
        == 2
    )
    assert "budget 8 is above the 6 decisions" in capsys.readouterr().err
    # the round counts the eval complete only with its no-skills share; a rerun completes that alone
    with_option = load_recipe(["--config", str(recipe), "--eval_headroom", "true"])
    assert BY_NAME["eval"].complete_in(with_option)
    partner.marker(0).unlink()
    (eval_dir.path / "metrics.json").unlink()
    assert not BY_NAME["eval"].complete_in(with_option) and BY_NAME["eval"].complete_in(
        load_recipe(["--config", str(recipe)])
    )
    capsys.readouterr()
    assert stage_main("eval", ["--config", str(recipe), "--eval_headroom", "true"]) == 0
    assert "eval: rank 0 already complete, skipping" in capsys.readouterr().err
    assert BY_NAME["eval"].complete_in(with_option) and _rows(partner) == without
    assert json.loads((eval_dir.path / "metrics.json").read_text())["headroom"] == metrics["headroom"]
    # a rerun without the option is a changed input: refused, naming it
    assert stage_main("eval", ["--config", str(recipe), "--eval_headroom", "false"]) == 2
    assert "eval_headroom: True -> False" in capsys.readouterr().err


def test_selskill_eval_measures_the_headroom_of_any_model(
    recipe, tmp_path, small_games, tiny_model_dir, capsys
):
    from selskill.cli import main

    out = tmp_path / "out"
    argv = ["eval", "--model", str(tiny_model_dir), "--games", str(small_games), "--out", str(out)]
    assert main([*argv, "--config", str(recipe), "--eval_max_tasks", "2", "--eval_headroom", "true"]) == 0
    assert "train headroom (n=2, with vs without skills): positive " in capsys.readouterr().out
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["headroom"]["train"]["tasks"] == 2 and saved["splits"]["train"]["overall"]["episodes"] == 2
    without = pq.read_table(out / "headroom" / "shards" / "00000.parquet").to_pylist()
    assert len(without) == 2 and "systematic_search" not in _system(without[0])
