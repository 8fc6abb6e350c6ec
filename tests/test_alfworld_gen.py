"""The offline generator: real engine, every task type winnable, deterministic, realistic sizes."""

import filecmp
import json

import pytest

from selskill.benchmarks.alfworld import generate as gen
from selskill.benchmarks.alfworld.env import AlfworldEnv, find_games
from selskill.benchmarks.alfworld.verify import verify_games


def _play(env, task_id, commands):
    state = env.reset(task_id)
    assert not state.won, "a game must not start won"
    for c in commands:
        assert c in state.admissible_commands, (c, state.admissible_commands)
        state = env.step(c)
    return state


def test_every_task_type_is_generated_and_won_by_its_solution(small_games):
    index = find_games(small_games)
    assert sorted(g.task_type for g in index.games) == sorted(gen.TASK_TYPES)
    env = AlfworldEnv(index)
    for record in index.games:
        traj = json.loads((small_games / record.task_id / "traj_data.json").read_text())
        state = _play(env, record.task_id, traj["selskill"]["solution"])
        assert state.won, record.task_id


def test_task_text_comes_from_alfworld_goal_templates(small_games):
    from alfworld.gen import goal_library

    env = AlfworldEnv(find_games(small_games))
    for task_id in env.task_ids():
        record = env.game(task_id)
        traj = json.loads((small_games / task_id / "traj_data.json").read_text())
        p = traj["pddl_params"]
        expected = {
            t.format(
                obj=p["object_target"].lower(),
                recep=p["parent_target"].lower(),
                toggle=p["toggle_target"].lower(),
                mrecep="",
            )
            for t in goal_library.gdict[record.task_type]["templates"]
        }
        state = env.reset(task_id)
        assert state.task in expected
        assert f"Your task is to: {state.task}." in state.observation


def test_real_size_games_are_winnable(tmp_path):
    paths = gen.generate_games(
        tmp_path,
        per_type=1,
        seed=3,
        size="real",
        task_types=("pick_heat_then_place_in_recep", "pick_two_obj_and_place"),
    )
    assert len(paths) == 2
    report = verify_games(find_games(tmp_path))
    assert report.ok, report.failures


def test_same_seed_gives_identical_files_and_another_seed_does_not(tmp_path):
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        gen.generate_games(tmp_path / name, per_type=2, seed=seed)
    cmp = filecmp.dircmp(tmp_path / "a", tmp_path / "b")

    def same(c):
        return (
            not c.diff_files
            and not c.left_only
            and not c.right_only
            and all(same(s) for s in c.subdirs.values())
        )

    assert same(cmp)
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.tw-pddl"))
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    problems_c = {json.loads(p.read_text())["pddl_problem"] for p in (tmp_path / "c").rglob("*.tw-pddl")}
    problems_a = {json.loads(p.read_text())["pddl_problem"] for p in (tmp_path / "a").rglob("*.tw-pddl")}
    assert problems_a.isdisjoint(problems_c)


def test_generation_leaves_global_random_untouched():
    import random

    random.seed(123)
    expected = random.random()
    random.seed(123)
    gen.generate_game("pick_and_place_simple", 0)
    assert random.random() == expected


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_scaled_scene_sizes_and_scene_types(size):
    from alfworld.gen import constants

    prior = gen.load_placement_prior()
    (r_lo, r_hi), (o_lo, o_hi) = gen.SCALE[size]
    for task_type in gen.TASK_TYPES:
        for i in range(5):
            g = gen.generate_game(task_type, i, seed=1, size=size, prior=prior)
            n_obj = len(g.scene.objects)
            assert len(g.scene.receptacles) <= r_hi
            assert o_lo <= n_obj <= o_hi + 3, n_obj
            assert g.scene.scene_type in constants.GOALS_VALID[task_type]
            targets = [o for o in g.scene.objects if o.type == g.object_target]
            assert len(targets) >= (2 if task_type == "pick_two_obj_and_place" else 1)
            if g.parent_target:
                parents = {r.id for r in g.scene.receptacles if r.type == g.parent_target}
                assert not any(o.receptacle in parents for o in targets), "must not start solved"


def test_valid_unseen_never_uses_a_train_floor_plan():
    for task_type in gen.TASK_TYPES:
        train = set(gen.floor_plans_for("train", task_type))
        unseen = set(gen.floor_plans_for("valid_unseen", task_type))
        assert unseen and train and not (train & unseen)
    seen_plans = {
        gen.generate_game(t, i, split="valid_unseen").scene.floor_plan
        for t in gen.TASK_TYPES
        for i in range(3)
    }
    from alfworld.gen import constants

    assert seen_plans <= set(constants.TEST_SCENE_NUMBERS)


def test_bad_arguments_name_the_choice():
    with pytest.raises(ValueError, match="unknown task type 'pick_anything'"):
        gen.generate_game("pick_anything", 0)
    with pytest.raises(ValueError, match="unknown split"):
        gen.generate_game("pick_and_place_simple", 0, split="test")


def test_alfworld_handcoded_expert_reads_the_generated_trial(small_games):
    """traj_data.json carries what alfworld's expert needs; it plays a simple game to a win."""
    from alfworld.agents.expert import HandCodedTWAgent

    index = find_games(small_games)
    record = next(g for g in index.games if g.task_type == "pick_and_place_simple")
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs.pddl import PddlEnv

    engine = AlfredDemangler(PddlEnv(textworld.EnvInfos(admissible_commands=True, won=True, facts=True)))
    engine.load(record.path)
    state = engine.reset()
    expert = HandCodedTWAgent(max_steps=150)
    expert.reset(record.path)
    expert.observe(state.feedback)
    command = None
    steps = 0
    for steps in range(1, 151):  # noqa: B007 (the count is reported below)
        command = expert.act(state, 0, state["won"], command or "")
        state, _, done = engine.step(command)
        if state["won"]:
            break
    assert state["won"], f"expert did not win in {steps} steps"


def test_receptacles_keep_shared_floor_plan_locations_and_solutions_skip_the_go_to(tmp_path):
    # train game 26 of pick_heat (seed 0, real): the microwave and the dining table share a location
    game = gen.generate_game("pick_heat_then_place_in_recep", 26, seed=0, split="train", size="real")
    by_name = {name: rid for rid, name in gen.entity_names(game).items()}
    loc = {r.id: r.location for r in game.scene.receptacles}
    assert loc[by_name["microwave 1"]] == loc[by_name["diningtable 1"]]
    assert "go to diningtable 1" not in game.solution
    gen.write_game(game, tmp_path)
    env = AlfworldEnv(find_games(tmp_path, "train"))
    (task_id,) = env.task_ids()
    state = env.reset(task_id)
    for command in game.solution:
        if command.startswith("move bread"):  # at the microwave: the co-located table needs no `go to`
            assert "go to diningtable 1" not in state.admissible_commands
            assert command in state.admissible_commands
        state = env.step(command)
    assert state.won


def test_a_folder_of_another_generator_version_is_refused(tmp_path):
    gen.generate_games(tmp_path, per_type=1, seed=0, size="tiny", task_types=("pick_and_place_simple",))
    assert gen.games_generator_version(tmp_path) == gen.GENERATOR_VERSION
    (tmp_path / gen.GENERATOR_FILE).unlink()  # a folder written before the version file existed
    traj = next(tmp_path.glob("train/*/*/traj_data.json"))
    meta = json.loads(traj.read_text())
    meta["selskill"]["generator_version"] = 1
    traj.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="generator version 1.*new folder"):
        gen.generate_games(tmp_path, per_type=1, seed=0, size="tiny", task_types=("pick_and_place_simple",))


def test_scene_stats_count_colocated_receptacles():
    from selskill.benchmarks.alfworld.scene_stats import scene_stats

    problem = """(:init (receptacleAtLocation Drawer_a loc_1) (receptacleAtLocation Drawer_b loc_1)
    (receptacleAtLocation Sink_c loc_2) (objectAtLocation Mug_d loc_1) (objectAtLocation Pen_e loc_2))"""
    s = scene_stats(problem)
    assert (s.receptacles, s.objects, s.colocated_receptacles) == (3, 2, 2)
