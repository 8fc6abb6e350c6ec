"""Executors: every one runs the same stage table and computes the same rows.

The local executor's worker processes, a Slurm array task and a Ray task each rebuild the
recipe from its command line and run one rank; each must give exactly the rows of every
rank run in this process. Slurm is not installed here: the scripts are checked as text,
submission against a stand-in `sbatch`, and one array task by running its script.
"""

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from selskill.config import load_recipe
from selskill.data.layout import StageDir
from selskill.executors import make_executor
from selskill.executors.local import LocalExecutor
from selskill.executors.slurm import SlurmExecutor, SlurmOptions, worker_argv
from selskill.stages.round import run_round
from selskill.stages.table import BY_NAME, STAGES, round_stages

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = BY_NAME["sample"]


@pytest.fixture(scope="module")
def recipe_file(tmp_path_factory, small_games, tiny_model_dir):
    """The sample stage of test_pipeline_stages' tiny recipe: 4 tasks x 2 rollouts, split over 2 ranks."""
    path = tmp_path_factory.mktemp("executors") / "recipe.yaml"
    path.write_text(
        f"exp: t\ngames_dir: {small_games}\nmodel_name_or_path: {tiny_model_dir}\nworld_size: 2\n"
        "sample_k: 2\nsample_max_tasks: 4\nmax_env_steps: 4\nmax_new_tokens: 12\nconcurrent_episodes: 4\n"
        "policy_batch_size: 8\nseed: 3\n"
    )
    return path


def _recipe(path, runs_dir, *args):
    return load_recipe(["--config", str(path), "--runs_dir", str(runs_dir), *args])


def _shards(runs_dir, stage="sample") -> dict:
    sd = StageDir.of(runs_dir, "t", 1, stage)
    return {r: pq.read_table(sd.shard(r)) for r in sd.completed_ranks()}


@pytest.fixture(scope="module")
def in_process(recipe_file, tmp_path_factory):
    """Both ranks one after the other in this process (what `make round` does on one machine)."""
    runs = tmp_path_factory.mktemp("in_process")
    LocalExecutor(workers=1).run(_recipe(recipe_file, runs), [SAMPLE])
    shards = _shards(runs)
    assert sorted(shards) == [0, 1] and sum(t.num_rows for t in shards.values()) == 8
    return runs, shards


def test_the_table_is_the_round_in_order():
    assert [s.name for s in STAGES] == ["init", "sample", "branch", "fork", "label", "train", "eval"]
    assert [s.name for s in STAGES if not s.sharded] == ["init", "train"]
    assert [s.name for s in round_stages(["eval", "sample"])] == ["sample", "eval"]
    with pytest.raises(ValueError, match="unknown stage smple"):
        round_stages(["smple"])


def test_the_executor_keys_are_in_the_recipe_help():
    from selskill.config import make_parser

    text = make_parser().format_help()
    assert all(f"--{key}" in text for key in ("executor", "local_workers", "slurm_partition", "ray_address"))


def test_one_failed_rank_is_raised_as_itself_several_as_one_error():
    from selskill.data.contract import StageRefused
    from selskill.executors.base import StageFailed, raise_failures

    raise_failures(SAMPLE, {}, 4)
    with pytest.raises(StageRefused, match="held"):
        raise_failures(SAMPLE, {2: StageRefused("held")}, 4)
    with pytest.raises(StageFailed, match=r"2 of 4 ranks failed \(the others are complete; a rerun computes"):
        raise_failures(SAMPLE, {3: RuntimeError("worker died"), 1: OSError(5, "I/O error")}, 4)


def test_ranks_refused_in_a_round_are_a_refusal_as_when_each_runs_alone(capsys):
    """A rerun of refused ranks is refused again: the round must not say it computes them, and must end with
    the refusal's status (2) and fix, as the stage alone does."""
    from selskill.data.contract import StageRefused
    from selskill.errors import run_main
    from selskill.executors.base import StageFailed, raise_failures

    redo = "sample: rank {} was computed with other inputs than this run: sample_k: 2 -> 3. Rerun with --redo"
    refusals = {r: StageRefused(redo.format(r)) for r in (1, 0)}
    with pytest.raises(StageRefused, match=r"^sample: ranks 0, 1 of 4 cannot run as given") as err:
        raise_failures(SAMPLE, refusals, 4)
    assert "rank 0: StageRefused: " + redo.format(0) + "\n  rank 1: StageRefused: " in str(err.value)
    assert "a rerun computes" not in str(err.value)

    def alone():
        raise refusals[0]

    def in_a_round():
        raise_failures(SAMPLE, refusals, 4)

    assert run_main(alone) == run_main(in_a_round) == 2
    assert capsys.readouterr().err.count("Rerun with --redo") == 3
    # a refusal beside a crash: still a refusal (the rerun as it is would be refused), naming both
    mixed = {3: RuntimeError("worker died"), 1: FileNotFoundError("no sample shard 1: run sample first")}
    with pytest.raises(StageRefused, match=r"2 of 4 ranks failed and rank 1 cannot run as given") as err:
        raise_failures(SAMPLE, mixed, 4)
    assert not isinstance(err.value, StageFailed) and "rank 3: RuntimeError: worker died" in str(err.value)


def test_slurm_dry_run_prints_one_array_script_per_stage_and_submits_nothing(tmp_path, capsys):
    runs = tmp_path / "runs"
    argv = [
        "--config", "recipes/tiny.yaml", "--runs_dir", str(runs), "--round", "1", "--world_size", "4",
        "--executor", "slurm", "--slurm_partition", "gpu", "--slurm_time", "01:00:00", "--slurm_gpus_per_task",
        "1", "--slurm_train_gpus", "8", "--slurm_mem", "16G", "--slurm_array_parallelism", "2",
        "--slurm_sbatch_args", "--account=a --qos=b", "--dry_run",
    ]  # fmt: skip
    assert run_round(load_recipe(argv)) is None  # queued (here: printed), not finished
    out = capsys.readouterr().out
    scripts = {}
    for block in out.split("# --- ")[1:]:
        head, text = block.split("\n", 1)
        scripts[Path(head).stem] = text
    assert list(scripts) == ["init", "sample", "branch", "fork", "label", "train", "eval"]
    sample = scripts["sample"]
    assert sample.startswith("#!/bin/bash\n#SBATCH --job-name=selskill-tiny-r1-sample\n")
    for line in (
        "--array=0-3%2",
        "--partition=gpu",
        "--time=01:00:00",
        "--gres=gpu:1",
        "--mem=16G",
        "--account=a",
    ):
        assert f"#SBATCH {line}\n" in sample
    assert f"#SBATCH --output={runs.resolve()}/tiny/round_1/slurm/logs/%x-%A_%a.out\n" in sample
    assert f"\ncd {os.getcwd()}\n" in sample
    (command,) = [line for line in sample.splitlines() if line.startswith("exec ")]
    assert command == (
        f"exec {sys.executable} -m selskill.stages sample --config recipes/tiny.yaml --runs_dir {runs} --round 1 "
        "--rank $SLURM_ARRAY_TASK_ID --world_size 4"
    )
    train = scripts["train"]
    assert "--array" not in train and "#SBATCH --gres=gpu:8\n" in train and "%x-%j.out" in train
    assert "--rank" not in train.splitlines()[-2] and "-m selskill.stages train" in train
    # the jobs never see the scheduling keys: a printed script trains for real, it does not dry-run
    for text in scripts.values():
        assert (
            "--dry_run" not in text.split("# submit:")[0]
            and "--executor" not in text
            and "--slurm_" not in text
        )
    assert (
        "# submit: sbatch --parsable " + str(runs.resolve() / "tiny/round_1/slurm/init.sh") in scripts["init"]
    )
    assert (
        "# submit: sbatch --parsable '--dependency=afterok:<job id of label>' --kill-on-invalid-dep=yes "
        in scripts["train"]
    )
    assert not runs.exists(), "a dry run writes nothing"


def test_slurm_submits_each_stage_after_the_previous_one(tmp_path, monkeypatch):
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"  # a stand-in: records its arguments, answers a job id as --parsable does
    sbatch.write_text(f'#!/bin/bash\necho "$@" >> {calls}\necho "$((1000 + $(wc -l < {calls})));cluster"\n')
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    recipe = load_recipe(
        ["--config", "recipes/tiny.yaml", "--runs_dir", str(tmp_path / "runs"), "--world_size", "3"]
    )
    executor = SlurmExecutor(SlurmOptions(partition="cpu"), out=lambda line: None)
    executor.run(recipe, round_stages())
    lines = calls.read_text().splitlines()
    where = tmp_path.resolve() / "runs/tiny/round_1/slurm"
    assert lines[0] == f"--parsable {where}/init.sh"
    assert lines[1] == f"--parsable --dependency=afterok:1001 --kill-on-invalid-dep=yes {where}/sample.sh"
    assert lines[6] == f"--parsable --dependency=afterok:1006 --kill-on-invalid-dep=yes {where}/eval.sh"
    assert executor.jobs == {s.name: str(1001 + i) for i, s in enumerate(STAGES)}
    assert (where / "fork.sh").read_text() == executor.render(recipe, BY_NAME["fork"])
    assert (where / "logs").is_dir()


def _stand_in_slurm(tmp_path, monkeypatch, squeue_body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/bin/bash\necho "77;cluster"\n')
    (bin_dir / "squeue").write_text("#!/bin/bash\n" + squeue_body)
    for tool in ("sbatch", "squeue"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_slurm_wait_returns_once_the_markers_are_complete_and_fails_on_a_job_gone_without_them(
    tmp_path, monkeypatch
):
    from selskill.executors.base import StageFailed, Step

    def polled(name: str, done):
        # a step whose markers are complete when `done()` says so, and whose run does nothing
        members = {
            "name": name,
            "of": classmethod(lambda cls, recipe: cls()),
            "run": lambda self, rank=0, world_size=1: None,
            "complete": lambda self: done(),
        }
        return type(f"Polled{name}", (Step,), members)

    recipe = load_recipe(["--config", "recipes/tiny.yaml", "--runs_dir", str(tmp_path / "runs")])
    looks = tmp_path / "looks"
    # the job is queued for three looks, then gone; its "ranks" finish on the second look
    _stand_in_slurm(
        tmp_path, monkeypatch, f"echo x >> {looks}\n[ $(wc -l < {looks}) -le 3 ] && echo 77\nexit 0\n"
    )
    done = lambda: looks.exists() and len(looks.read_text().splitlines()) >= 2  # noqa: E731
    lines = []
    executor = SlurmExecutor(SlurmOptions(wait=True, poll_seconds=0.01), out=lines.append)
    executor.run(recipe, [polled("sample", done)])
    assert executor.waits and lines[-1].startswith("sample: complete (job 77")
    assert len(looks.read_text().splitlines()) == 2  # it stopped looking once the markers were there

    looks.unlink()
    never = polled("fork", lambda: False)
    with pytest.raises(
        StageFailed, match="fork: job 77 left the queue before every rank.*Rerun the same command"
    ):
        SlurmExecutor(SlurmOptions(wait=True, poll_seconds=0.01), out=lines.append).run(recipe, [never])
    assert len(looks.read_text().splitlines()) == 4  # three looks while queued, one that found it gone


def test_slurm_wait_is_a_recipe_key_and_dry_run_never_waits():
    recipe = load_recipe(["--config", "recipes/tiny.yaml", "--executor", "slurm", "--slurm_wait", "true"])
    executor = make_executor(recipe)
    assert executor.waits and executor.options.poll_seconds == 30.0
    dry = load_recipe(["--config", "recipes/tiny.yaml", "--executor", "slurm", "--slurm_wait", "--dry_run"])
    assert not make_executor(dry).waits


def test_the_table_says_when_a_stage_is_complete(tmp_path):
    recipe = load_recipe(["--config", "recipes/tiny.yaml", "--runs_dir", str(tmp_path), "--world_size", "2"])
    assert BY_NAME["init"].complete_in(recipe) is None  # its job's end says it
    assert not BY_NAME["fork"].complete_in(recipe)
    train = tmp_path / "tiny/round_1/train"
    train.mkdir(parents=True)
    (train / "COMPLETED").write_text("")
    assert BY_NAME["train"].complete_in(recipe)


def test_worker_argv_drops_the_scheduling_keys():
    argv = [
        "--config",
        "r.yaml",
        "--dry_run",
        "--executor=slurm",
        "--slurm_sbatch_args",
        "--qos=x",
        "--seed",
        "4",
    ]
    assert worker_argv(argv) == ["--config", "r.yaml", "--seed", "4"]
    assert worker_argv(["--dry_run", "true", "--rank", "2", "--round", "1"], drop=("rank",)) == [
        "--round",
        "1",
    ]


def test_a_slurm_array_task_computes_its_rank_like_this_process(recipe_file, in_process, tmp_path):
    runs = tmp_path / "runs"
    script = SlurmExecutor().render(_recipe(recipe_file, runs), SAMPLE)
    (tmp_path / "sample.sh").write_text(script)
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        ["bash", str(tmp_path / "sample.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = _shards(runs)
    assert sorted(got) == [1] and got[1].equals(in_process[1][1])


def test_local_worker_processes_give_the_in_process_rows(recipe_file, in_process, tmp_path, capsys):
    runs = tmp_path / "runs"
    recipe = _recipe(recipe_file, runs, "--local_workers", "2")
    make_executor(recipe).run(recipe, [SAMPLE])
    got = _shards(runs)
    assert sorted(got) == [0, 1] and all(got[r].equals(in_process[1][r]) for r in got)
    # the executor starts every rank again; the stage itself skips the complete ones
    capsys.readouterr()
    LocalExecutor(workers=1).run(_recipe(recipe_file, runs), [SAMPLE])
    assert capsys.readouterr().err.count("already complete, skipping") == 2


def test_worker_processes_say_as_much_as_the_recipes_log_level(recipe_file, in_process, tmp_path, capfd):
    """Spawned workers parse the recipe's command line, log_level included: WARNING silences their INFO lines."""
    import shutil

    runs = tmp_path / "runs"
    shutil.copytree(in_process[0], runs)
    for level, lines in (("WARNING", 0), ("info", 2)):
        recipe = _recipe(recipe_file, runs, "--local_workers", "2", "--log_level", level)
        make_executor(recipe).run(recipe, [SAMPLE])
        err = capfd.readouterr().err
        assert err.count("already complete, skipping") == lines, err[-2000:]
        assert ("sample: 2 ranks in 2 worker processes" in err) == bool(lines)


def test_ray_tasks_give_the_in_process_rows(recipe_file, in_process, tmp_path):
    ray = pytest.importorskip("ray")
    from selskill.executors.ray import RayExecutor

    runs = tmp_path / "runs"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        RayExecutor().run(_recipe(recipe_file, runs, "--executor", "ray"), [SAMPLE])
    finally:
        ray.shutdown()
    got = _shards(runs)
    assert sorted(got) == [0, 1] and all(got[r].equals(in_process[1][r]) for r in got)


def test_the_ray_executor_without_ray_says_how_to_install_it(monkeypatch):
    from selskill.executors.ray import RayExecutor

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if it were not installed
    recipe = load_recipe(["--config", "recipes/tiny.yaml", "--executor", "ray"])
    with pytest.raises(ImportError, match=r"pip install ray"):
        RayExecutor().run(recipe, [SAMPLE])


def test_selskill_round_and_init_are_thin_over_the_table(tmp_path, tiny_model_dir, capsys):
    from selskill.cli import main

    runs = str(tmp_path / "runs")
    assert (
        main(
            ["round", "--config", "recipes/tiny.yaml", "--runs_dir", runs, "--executor", "slurm", "--dry_run"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("#SBATCH --array=0-1\n") == 5 and "dry run: nothing was written or submitted" in out
    games = [
        "--games_dir",
        str(tmp_path / "games"),
        "--games_eval_per_type",
        "1",
        "--games_unseen_per_type",
        "0",
    ]
    args = ["--config", "recipes/tiny.yaml", "--runs_dir", runs, "--model_name_or_path", str(tiny_model_dir)]
    assert main(["init", *args, *games, "--games_train_per_type", "0", "--games_size", "tiny"]) == 0
    assert (
        len(list((tmp_path / "games" / "valid_seen").glob("*/*/game.tw-pddl"))) == 6
    )  # the init stage's games
    assert "no init policy to build" in capsys.readouterr().out


def test_selskill_eval_plays_any_model_on_any_games(
    recipe_file, small_games, tiny_model_dir, tmp_path, capsys
):
    import json

    from selskill.cli import main

    out = tmp_path / "out"
    args = [
        "--config",
        str(recipe_file),
        "--eval_splits",
        "train",
        "--eval_max_tasks",
        "2",
        "--eval_bootstrap",
        "10",
    ]
    assert (
        main(["eval", "--model", str(tiny_model_dir), "--games", str(small_games), "--out", str(out), *args])
        == 0
    )
    assert "train (n=2): SR=" in capsys.readouterr().out
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["model"] == str(tiny_model_dir) and saved["splits"]["train"]["overall"]["episodes"] == 2
    assert (out / "shards" / "00000.parquet").is_file()


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def test_local_workers_split_this_process_threads(monkeypatch):
    """Two workers on two cores get one torch thread each, not two each (four threads on two cores)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import torch

    from selskill.executors.local import _use_threads, worker_threads

    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert [worker_threads(w) for w in (1, 2, 3, 8)] == [4, 2, 1, 1]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx, initializer=_use_threads, initargs=(2,)) as pool:
        # the tests' environment says OMP_NUM_THREADS=1: the worker's count comes from the executor
        assert pool.submit(_torch_threads).result(timeout=120) == 2


def test_a_relaunched_train_stage_refused_for_its_input_exits_2_as_selskill_train_does(monkeypatch, capsys):
    """The relaunched trainer prints its own error line; the stage ends with that process's status (2: the
    input is bad, 1: the run failed), not always 1."""
    import selskill.train.run as train_run
    from selskill.errors import run_main
    from selskill.stages.table import TrainStep

    recipe = load_recipe(["--config", "recipes/tiny.yaml"])
    for status in (2, 1):
        monkeypatch.setattr(train_run, "launch_parsed", lambda *args, status=status: status)
        assert run_main(lambda: TrainStep.of(recipe).run()) == status
    assert "error: the train stage exited with status 2 (its error is above)" in capsys.readouterr().err
    with pytest.raises(ValueError, match="the train stage is one job"):
        TrainStep.of(recipe).run(1, 2)


# --- a dead worker and Ctrl-C -----------------------------------------------------------------------------


def _toy_recipe(runs: Path, **modes: str):
    runs.mkdir(parents=True, exist_ok=True)
    for rank, mode in modes.items():
        (runs / f"mode-{rank[1:]}").write_text(mode)
    return ["--config", str(ROOT / "recipes" / "tiny.yaml"), "--runs_dir", str(runs), "--world_size", "2"]


def test_a_killed_worker_fails_its_rank_alone_and_its_sibling_finishes(tmp_path):
    from executor_steps import ToyStep

    from selskill.executors import StageFailed

    runs = tmp_path / "runs"
    recipe = load_recipe(_toy_recipe(runs, r0="die", r1="after-0"))
    with pytest.raises(
        StageFailed, match=r"toy: the worker process of rank 0 was killed by SIGKILL \(out of memory\?\)"
    ):
        LocalExecutor(workers=0).run(recipe, [ToyStep])
    assert (runs / "done-1").exists()  # was: BrokenProcessPool, and rank 1 terminated with it


INTERRUPTED_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from executor_steps import ToyStep
from selskill.config import load_recipe
from selskill.errors import run_main
from selskill.executors.local import LocalExecutor

if __name__ == "__main__":
    sys.exit(run_main(lambda: LocalExecutor(workers=0).run(load_recipe({argv!r}), [ToyStep])))
"""


def test_ctrl_c_ends_on_one_line_and_each_rank_unwinds(tmp_path):
    import signal
    import time

    from selskill.errors import INTERRUPTED_LINE

    runs = tmp_path / "runs"
    script = tmp_path / "toy_round.py"
    argv = _toy_recipe(runs, r0="wait", r1="wait")
    script.write_text(INTERRUPTED_SCRIPT.format(tests=str(ROOT / "tests"), argv=argv))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=env, stderr=subprocess.PIPE, text=True, start_new_session=True,
        # as from a terminal: a suite started in the background (`pytest &`) hands its children SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.time() + 600  # a spawned worker imports torch: slow on a loaded machine
        while not all((runs / f"started-{r}").exists() for r in (0, 1)) and time.time() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        assert all((runs / f"started-{r}").exists() for r in (0, 1)), "the workers did not start"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: every process of the group
        _, err = proc.communicate(timeout=300)  # every worker unwinds its rank: slow on a loaded machine
    finally:
        (runs / "release").write_text("x")
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = err.strip().splitlines()
    assert proc.returncode == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert lines[-1] == INTERRUPTED_LINE and err.count("interrupted") == 1, err
    assert all((runs / f"unwound-{r}").exists() and not (runs / f"done-{r}").exists() for r in (0, 1))


def test_the_slurm_keys_are_slurm_options_fields_with_their_defaults():
    """Each `slurm_*` key configures the `SlurmOptions` field of its name, whose default it takes."""
    from selskill.config.executor import ExecutorConfig

    assert ExecutorConfig().slurm() == SlurmOptions()
    ex = load_recipe(["--config", "recipes/tiny.yaml", "--slurm_partition", "gpu", "--slurm_wait", "true",
                      "--slurm_poll_seconds", "2", "--slurm_train_gpus", "8"]).executor  # fmt: skip
    assert ex.slurm() == SlurmOptions(partition="gpu", wait=True, poll_seconds=2.0, train_gpus=8)
