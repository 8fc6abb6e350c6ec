"""Every recipe parses and dry-runs; the accelerate configs are what the recipes and README say."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from selskill.config import load_recipe
from selskill.train.dry_run import count_steps, dry_run
from selskill.train.run import launch, parse

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
ACCELERATE = sorted((ROOT / "recipes" / "accelerate").glob("*.yaml"))


def test_the_recipes_are_there():
    names = {p.name for p in RECIPES}
    assert {"tiny.yaml", "dpo_8b.yaml", "dpo_8b_lora.yaml", "gpu_quickstart.yaml"} <= names
    assert {p.name for p in ACCELERATE} == {"ddp.yaml", "zero2.yaml", "zero3.yaml"}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_parses_and_dry_runs(recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # recipes name files relative to the repository root
    run, policy, cfg = parse(["--config", str(recipe), "--runs_dir", str(tmp_path), "--dry_run"])
    lines = []
    info = dry_run(run, policy, cfg, out=lines.append)
    text = "\n".join(lines)
    assert (
        info["effective_batch_size"]
        == cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * info["world_size"]
    )
    assert f"effective batch size: {info['effective_batch_size']}" in text
    assert "steps:" in text and "500 pairs -> " in text  # no shards yet: steps per pair count
    assert not list(tmp_path.rglob("*"))  # a dry run writes nothing
    if cfg.train_accelerate_config:
        assert (ROOT / cfg.train_accelerate_config).is_file()


def test_dpo_8b_is_the_paper_setting(monkeypatch):
    monkeypatch.chdir(ROOT)
    run, policy, cfg = parse(["--config", "recipes/dpo_8b.yaml", "--dry_run"])
    assert policy.model_name_or_path == "Qwen/Qwen3-8B"
    assert load_recipe(["--config", "recipes/dpo_8b.yaml", "--dry_run"]).settings.use_alfworld_data
    assert (cfg.beta, cfg.learning_rate, cfg.num_train_epochs, cfg.warmup_steps) == (0.1, 1e-6, 3, 0.1)
    assert cfg.lr_scheduler_type.value == "cosine" and cfg.max_length == 4096 and cfg.window_turns == 3
    assert cfg.kinds == ("episode", "local") and cfg.bf16 and cfg.gradient_checkpointing
    info = dry_run(run, policy, cfg, out=lambda s: None)
    assert info["world_size"] == 8 and info["effective_batch_size"] == 32
    assert info["accelerate"]["zero_stage"] == 3 and info["accelerate"]["distributed_type"] == "DEEPSPEED"
    assert "hub id" in info["policy"]


def test_tiny_is_cpu_safe(monkeypatch):
    monkeypatch.chdir(ROOT)
    text = (ROOT / "recipes" / "tiny.yaml").read_text()
    assert "# --- train ---" in text
    _, _, cfg = parse(["--config", "recipes/tiny.yaml"])
    assert cfg.bf16 is False and cfg.gradient_checkpointing is False and not cfg.train_accelerate_config


@pytest.mark.parametrize("path", ACCELERATE, ids=lambda p: p.name)
def test_accelerate_configs_load(path):
    from accelerate.commands.config.config_args import load_config_from_file

    conf = load_config_from_file(str(path))
    raw = yaml.safe_load(path.read_text())
    expected = {
        "ddp.yaml": ("MULTI_GPU", None),
        "zero2.yaml": ("DEEPSPEED", 2),
        "zero3.yaml": ("DEEPSPEED", 3),
    }
    dist, stage = expected[path.name]
    assert conf.distributed_type.value == dist and conf.num_processes == 8
    assert (raw.get("deepspeed_config") or {}).get("zero_stage") == stage
    if stage == 3:
        assert raw["deepspeed_config"]["zero3_save_16bit_model"] is True  # model/ gets the gathered weights


def test_dry_run_counts_pairs_and_steps_like_the_trainer(tmp_path):
    from train_helpers import fixture_rows, micro_model, micro_tokenizer, write_label_stage

    tok = micro_tokenizer()
    init = tmp_path / "t" / "round_0" / "train" / "model"
    tok.save_pretrained(init)
    micro_model(tok).save_pretrained(init)
    write_label_stage(tmp_path, "t", 1, [fixture_rows(tok, 10)])
    argv = [
        "--config",
        str(ROOT / "recipes" / "tiny.yaml"),
        "--runs_dir",
        str(tmp_path),
        "--exp",
        "t",
        "--dry_run",
    ]
    run, policy, cfg = parse(argv)
    info = dry_run(run, policy, cfg, out=lambda s: None)
    # 10 pairs, 4 per batch -> 3 batches per epoch, the recipe's 2 epochs
    assert cfg.num_train_epochs == 2
    assert info["pairs"] == 10 and info["steps"] == 6 == count_steps(10, cfg, 1)
    assert info["warmup_steps"] == 1 and "round 0 model" in info["policy"]
    assert not (tmp_path / "t" / "round_1" / "train").exists()


def test_unknown_recipe_key_fails_loudly(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train_window: 3\n")
    with pytest.raises(ValueError, match="train_window"):
        parse(["--config", str(bad)])
    with pytest.raises(ValueError, match="train_window"):
        parse(["--config", "recipes/tiny.yaml", "--train_window", "3"])


def test_a_removed_key_names_the_key_that_replaces_it(tmp_path):
    from selskill.config import load_recipe

    old = tmp_path / "old.yaml"
    old.write_text(Path("recipes/tiny.yaml").read_text() + "label_episode_fraction: 0.5\n")
    match = "label_episode_fraction was removed: .*train_local_fraction"
    for argv in (
        ["--config", str(old)],
        ["--config", "recipes/tiny.yaml", "--label_episode_fraction", "0.5"],
    ):
        with pytest.raises(ValueError, match=match):
            load_recipe(argv)
        with pytest.raises(ValueError, match=match):
            parse(argv)  # the train stage parses only its sections: still refused


def test_max_turns_names_max_decisions_the_budget_that_replaces_it(tmp_path):
    """The step budget counts decisions under its own key: an old recipe or command line that
    still bounds turns must say which key to write instead, not just "unknown argument"."""
    from selskill.config import load_recipe

    old = tmp_path / "old.yaml"
    old.write_text(Path("recipes/tiny.yaml").read_text() + "max_turns: 80\n")
    one_line = "^recipe key max_turns was removed: rename it max_decisions, [^\n]*$"
    for argv in (["--config", str(old)], ["--config", "recipes/tiny.yaml", "--max_turns", "15"]):
        with pytest.raises(ValueError, match=one_line):
            load_recipe(argv)
    recipe = load_recipe(["--config", "recipes/tiny.yaml", "--max_decisions", "9"])
    assert (recipe.rollout.max_decisions, recipe.rollout.max_env_steps) == (9, 50)
    assert recipe.settings.init_max_decisions == 15


def test_training_parses_only_its_sections():
    """The train stage builds run, policy and train: other sections' keys pass unchecked, and
    parsing loads no stage, environment or init code (it once loaded 43 selskill modules)."""
    code = (
        "import sys; from selskill.train.run import parse; "
        "run, policy, cfg = parse(['--config', 'recipes/tiny.yaml', '--sample_k', '-5', '--seed', '3']); "
        "assert (run.seed, cfg.seed) == (3, 3), (run.seed, cfg.seed); "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('selskill'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = out.stdout.split()
    assert {m.split(".")[1] for m in loaded if "." in m} == {
        "benchmarks",
        "config",
        "data",
        "errors",
        "monitor",
        "registry",
        "train",
    }, loaded
    assert "selskill.monitor.tracking" not in loaded, loaded
    # of a benchmark plugin only what declares its recipe section: no environment, turn format or init
    plugins = [m for m in loaded if m.startswith("selskill.benchmarks.")]
    assert plugins and all(m.count(".") == 2 or m.endswith("config") for m in plugins), plugins


def test_selskill_train_relaunches_under_the_recipes_accelerate_config(monkeypatch):
    import subprocess as sp

    monkeypatch.chdir(ROOT)
    calls = []
    monkeypatch.setattr(sp, "call", lambda cmd: calls.append(cmd) or 0)
    argv = [
        "--config",
        "recipes/tiny.yaml",
        "--round",
        "2",
        "--train_accelerate_config",
        "recipes/accelerate/zero3.yaml",
    ]
    assert launch(argv) == 0
    (cmd,) = calls
    assert cmd[1:] == [
        "-m", "accelerate.commands.launch", "--config_file", "recipes/accelerate/zero3.yaml",
        "-m", "selskill.train.run", *argv,
    ]  # fmt: skip
    with pytest.raises(FileNotFoundError, match="train_accelerate_config recipes/nope.yaml does not exist"):
        launch(["--config", "recipes/tiny.yaml", "--train_accelerate_config", "recipes/nope.yaml"])


def test_dpo_8b_lora_is_dpo_8b_on_one_gpu(monkeypatch):
    """Same rollouts and pairs as the paper's recipe; LoRA in one process with the same pairs per step."""
    from selskill.config import load_recipe

    monkeypatch.chdir(ROOT)
    full, lora = (
        load_recipe(["--config", f"recipes/{n}.yaml", "--dry_run"]) for n in ("dpo_8b", "dpo_8b_lora")
    )
    for section in ("policy", "settings", "rollout", "sample", "branch", "fork", "label", "eval"):
        assert getattr(full, section) == getattr(lora, section), section
    cfg = lora.train
    assert cfg.use_peft and not full.train.use_peft and not cfg.train_accelerate_config
    assert (cfg.lora_r, cfg.lora_alpha, cfg.lora_target_modules) == (16, 32, "all-linear")
    assert cfg.model_init_kwargs == {"dtype": "bfloat16"} and cfg.gradient_checkpointing
    assert cfg.learning_rate == pytest.approx(10 * full.train.learning_rate)
    full_info = dry_run(full.run, full.policy, full.train, out=lambda s: None)
    info = dry_run(lora.run, lora.policy, cfg, out=lambda s: None)
    assert info["world_size"] == 1 and info["effective_batch_size"] == full_info["effective_batch_size"] == 32
    assert "accelerate" not in info and info["peft"].r == 16


@pytest.mark.parametrize("recipe", ["dpo_8b_lora.yaml", "gpu_quickstart.yaml"])
def test_the_one_gpu_recipes_dry_run_a_round_loading_and_downloading_nothing(
    recipe, tmp_path, monkeypatch, capsys
):
    """`selskill round --dry_run` runs no stage and writes no file, and a hub model is named, not fetched (the suite runs with HF_HUB_OFFLINE=1, where a fetch would fail)."""
    from selskill.cli import main

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["round", "--config", f"recipes/{recipe}", "--round", "1", "--runs_dir", str(tmp_path / "runs"),
            "--games_dir", str(tmp_path / "games"), "--dry_run"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "dry run: nothing was written or submitted, and nothing computed" in out
    for stage in ("sample", "fork", "label", "train", "eval"):
        assert any(
            line.startswith(f"{stage}: ") and "not complete: would compute" in line
            for line in out.splitlines()
        )
    assert "peft: LoRA r=16 alpha=32 dropout=0.05 targets=all-linear" in out
    assert "x 1 processes" in out and "launch:" not in out  # one process, no accelerate relaunch
    assert "is a hub id, HF_HUB_OFFLINE=1 forbids downloading it" in out  # named, not fetched
    assert not (tmp_path / "runs").exists() and not (tmp_path / "games").exists()


def test_the_quickstart_takes_a_local_model_directory(tmp_path, monkeypatch, capsys):
    from train_helpers import micro_model, micro_tokenizer

    from selskill.cli import main

    monkeypatch.chdir(ROOT)
    model = tmp_path / "my-model"
    tok = micro_tokenizer()
    tok.save_pretrained(model)
    micro_model(tok).save_pretrained(model)
    argv = ["round", "--config", "recipes/gpu_quickstart.yaml", "--runs_dir", str(tmp_path / "runs"),
            "--model_name_or_path", str(model), "--dry_run"]  # fmt: skip
    assert main(argv) == 0
    assert f"policy: {model} (model_name_or_path (local))" in capsys.readouterr().out
    assert not (tmp_path / "runs").exists()


def test_cli_train_dry_run(capsys, monkeypatch):
    from selskill.cli import main

    monkeypatch.chdir(ROOT)
    assert main(["train", "--config", "recipes/dpo_8b.yaml", "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "effective batch size: 32 = 1 per device x 4 accumulation x 8 processes" in out


def test_entry_point_dry_run_as_a_user_types_it():
    out = subprocess.run(
        [
            sys.executable,
            "pipelines/train_dpo.py",
            "--config",
            "recipes/dpo_8b.yaml",
            "--round",
            "1",
            "--dry_run",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "effective batch size: 32" in out.stdout and "zero stage 3" in out.stdout
    assert "bf16 True (not supported on this machine" in out.stdout or "bf16 True," in out.stdout
    json.dumps(out.stdout)  # printable


def test_an_empty_alfworld_data_is_named_with_the_fix(monkeypatch):
    """alfworld itself stops on it with "No such file or directory: ''"."""
    from selskill.config import load_recipe

    monkeypatch.setenv("ALFWORLD_DATA", "")
    with pytest.raises(ValueError, match="ALFWORLD_DATA is set but empty: unset it"):
        load_recipe(["--config", "recipes/tiny.yaml"])
    monkeypatch.delenv("ALFWORLD_DATA")
    load_recipe(["--config", "recipes/tiny.yaml"])


BROKEN = {  # file text, the line the error names, a word of its problem
    "indentation": ("seed: 1\n  learning_rate: 2\n", 2, "indentation"),
    "tab": ("seed: 1\n\tlearning_rate: 2\n", 2, "tabs"),
    "unclosed_bracket": ("seed: 1\neval_splits: [a, b\nlearning_rate: 2\n", 3, "line 2"),
    "top_level_list": ("- seed: 1\n- learning_rate: 2\n", None, "mapping"),
    "duplicate_key": ("seed: 1\nlearning_rate: 2\nseed: 3\n", 3, "seed is given twice (lines 1 and 3)"),
}


def _entry_points():
    """Every way a recipe is parsed: the `selskill` command, a stage's pipeline, the trainer's."""
    from selskill.cli import main as cli_main
    from selskill.stages.table import stage_main
    from selskill.train.run import cli_main as train_main

    return {
        "selskill train": lambda argv: cli_main(["train", *argv]),
        "pipelines/label.py": lambda argv: stage_main("label", argv),
        "pipelines/train_dpo.py": train_main,
    }


@pytest.mark.parametrize("case", BROKEN, ids=str)
def test_a_broken_recipe_file_is_a_short_error_naming_file_and_line(case, tmp_path, capsys):
    text, line, problem = BROKEN[case]
    recipe = tmp_path / "broken.yaml"
    recipe.write_text(text)
    for name, entry in _entry_points().items():
        assert entry(["--config", str(recipe)]) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) <= 3 and "Traceback" not in err, (name, err)
        assert (f"{recipe}:{line}:" if line else str(recipe)) in err and problem in err, (name, err)


def test_an_unknown_key_names_the_closest_valid_keys(tmp_path, capsys):
    typo = tmp_path / "typo.yaml"
    typo.write_text(Path("recipes/tiny.yaml").read_text() + "learnign_rate: 0.1\n")
    for name, entry in _entry_points().items():
        for argv, where in (
            (["--config", "recipes/tiny.yaml", "--learnign_rate", "1e-4"], "on the command line"),
            (["--config", str(typo)], f"in {typo}"),
        ):
            assert entry(argv) == 2, name
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and len(err) < 300, (name, err)
            assert where in err and "learnign_rate (did you mean learning_rate" in err, (name, err)
            assert "`--help` lists every key" in err


# A YAML value argparse never converts (a list, a bool, 2.7, .nan), or a nan from the command line: the key,
# the value and what the key takes, in one line, before any stage runs (entry point, recipe key, value, rule)
WRONG_VALUES = {
    "list_for_an_int": ("pipelines/label.py", "sample_k", [1, 2], "an integer"),
    "fraction_for_an_int": ("pipelines/label.py", "sample_k", 2.7, "an integer"),
    "whole_float_for_an_int": ("pipelines/label.py", "sample_k", 2.0, "an integer; got 2.0 (write 2"),
    "bool_for_an_int": ("pipelines/label.py", "sample_k", True, "an integer"),
    "list_for_a_string": ("pipelines/label.py", "exp", ["a"], "a string"),
    "null_for_a_float": ("pipelines/label.py", "eval_temperature", None, "a finite number"),
    "nan_temperature": ("pipelines/label.py", "sample_temperature", float("nan"), "a finite number"),
    "inf_plugin_share": ("pipelines/label.py", "init_demo_useful", float("inf"), "a finite number"),
    "nan_beta": ("selskill train", "beta", float("nan"), "a finite number"),
    "bool_for_a_float": ("selskill train", "learning_rate", True, "a finite number"),
    "string_for_a_list_item": ("selskill train", "loss_type", ["sigmoid", [1]], "a list of strings"),
}


@pytest.mark.parametrize("case", WRONG_VALUES, ids=str)
def test_a_recipe_value_of_the_wrong_type_is_one_line_naming_key_value_and_type(case, tmp_path, capsys):
    where, key, value, rule = WRONG_VALUES[case]
    text = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    recipe = tmp_path / "wrong.yaml"
    recipe.write_text(yaml.safe_dump({**text, key: value, "runs_dir": str(tmp_path / "runs")}))
    assert _entry_points()[where](["--config", str(recipe)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{key} must be {rule}" in err and f"got {value!r}" in err and f"--{key} VALUE" in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "where, key, value, rule",
    [
        ("pipelines/label.py", "sample_temperature", "nan", "a finite number"),
        ("pipelines/label.py", "fork_temperature", "inf", "a finite number"),
        ("pipelines/label.py", "slurm_poll_seconds", "-inf", "a finite number"),
        ("selskill train", "learning_rate", "nan", "a finite number"),
        ("selskill train", "num_train_epochs", "nan", "a finite number"),
        ("selskill train", "max_grad_norm", "inf", "a finite number"),
        ("selskill train", "warmup_steps", "nan", "a finite number"),
        ("selskill train", "beta", "-1", "> 0"),
        ("selskill train", "beta", "0", "> 0"),
        ("selskill train", "learning_rate", "0", "> 0"),
        ("selskill train", "num_train_epochs", "0", "> 0"),
        ("selskill train", "warmup_steps", "-1", ">= 0"),
        ("selskill train", "max_grad_norm", "-1", ">= 0"),
    ],
)
def test_a_command_line_value_out_of_range_is_refused_at_parse(where, key, value, rule, tmp_path, capsys):
    argv = ["--config", "recipes/tiny.yaml", "--runs_dir", str(tmp_path / "runs"), f"--{key}={value}"]
    assert _entry_points()[where](argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{key} must be {rule}; got {float(value)!r}" in err, err
    assert not (tmp_path / "runs").exists()


def test_the_values_a_recipe_may_spell_loosely_still_parse(tmp_path):
    """An int for a float key, a number for a string key, one item for a list key, null where the default
    is null: what the recipes write, and what the command line would give."""
    text = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    loose = {
        "num_train_epochs": 2,
        "sample_temperature": 1,
        "exp": 7,
        "loss_type": "sigmoid",
        "max_length": None,
    }
    recipe = tmp_path / "loose.yaml"
    recipe.write_text(yaml.safe_dump({**text, **loose}))
    parsed = load_recipe(["--config", str(recipe)])
    assert parsed.run.exp == "7" and parsed.sample.sample_temperature == 1
    assert parsed.train.num_train_epochs == 2 and parsed.train.loss_type == ["sigmoid"]
    assert parsed.train.max_length is None


def test_a_recipe_that_is_not_utf8_names_the_file_and_the_fix(tmp_path, capsys):
    recipe = tmp_path / "latin1.yaml"
    recipe.write_bytes("exp: caf\u00e9\n".encode("latin-1"))
    for name, entry in _entry_points().items():
        assert entry(["--config", str(recipe)]) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, (name, err)
        assert f"recipe {recipe} is not UTF-8" in err and "0xe9" in err and "save it as UTF-8" in err, err


def test_every_recipe_key_is_one_field_of_one_section():
    """One home per setting: each key is one dataclass field across every section a recipe is parsed into
    (the benchmarks' own included, TRL's fields counted where they are train keys), and the parser's
    options are exactly those keys. A TRL field that is no train key is declared as such, naming where
    its setting lives, and stays a field, where TRL reads it."""
    from collections import Counter
    from dataclasses import fields

    from trl import DPOConfig, ModelConfig

    from selskill.config import make_parser, recipe_dataclasses
    from selskill.config.keys import recipe_fields, recipe_keys
    from selskill.config.train import NOT_RECIPE_KEYS, OWNED_ELSEWHERE, TrainConfig

    sections = recipe_dataclasses()
    homes = Counter(f.name for t in sections for f in recipe_fields(t))
    assert [key for key, n in homes.items() if n > 1] == []
    options = {a.dest for a in make_parser()._actions if a.dest != "help"}
    assert options == set(homes)
    by_name = {t.__name__: t for t in sections}
    for key, owner in OWNED_ELSEWHERE.items():  # each owned key is its owner's recipe key
        assert key in recipe_keys(by_name[owner]) and key not in recipe_keys(TrainConfig)
    trl = {f.name for t in (DPOConfig, ModelConfig) for f in fields(t)}
    assert trl <= {f.name for f in fields(TrainConfig)}  # no TRL field removed from the class
    assert set(NOT_RECIPE_KEYS) <= trl and set(TrainConfig._not_recipe_keys) == set(NOT_RECIPE_KEYS) | set(
        OWNED_ELSEWHERE
    )


def test_a_settings_class_is_the_one_place_its_keys_type_and_default_are_written():
    """Keys declared with `KeysOf` take the type and default of the settings field each sets, and
    `settings_of` builds the settings object from the keys' values (a key set to another value reaches it)."""
    import dataclasses
    import typing

    from selskill.config import recipe_dataclasses
    from selskill.config.keys import settings_of

    groups = 0
    for section in recipe_dataclasses():
        hints, fields = typing.get_type_hints(section), {f.name: f for f in dataclasses.fields(section)}
        for group in getattr(section, "_keys_of", ()):
            groups += 1
            own = {f.name: f.default for f in dataclasses.fields(group.settings)}
            for key, name in group.fields().items():
                assert hints[key] == typing.get_type_hints(group.settings)[name], key
                assert fields[key].default == own[name] and fields[key].metadata["help"], key
    assert groups >= 8  # init: tokenizer, model, SFT; slurm; ALFWorld: demos, budget, mix, DAgger; BFCL: mix
    from selskill.config.init import InitConfig, SftSchedule

    assert settings_of(InitConfig(init_lr=0.5), SftSchedule) == SftSchedule(lr=0.5)


def test_run_wide_keys_are_the_run_sections_and_reach_trl_through_the_train_stage():
    """`dry_run`, `report_to` and `log_level` are run keys, spelt as TRL spells them; the DPOConfig the train
    stage builds takes them, and the seed, from the run section."""
    from selskill.config.keys import recipe_keys
    from selskill.config.train import TrainConfig
    from selskill.train.args import training_args

    recipe = load_recipe(
        ["--config", "recipes/tiny.yaml", "--dry_run", "--log_level", "WARNING", "--seed", "7"]
    )
    assert "report_to: wandb" in (ROOT / "recipes" / "tiny.yaml").read_text()
    assert recipe.run.report_to == ["wandb"] and recipe.run.dry_run and recipe.run.log_level == "warning"
    assert {"dry_run", "report_to", "log_level", "seed"}.isdisjoint(recipe_keys(TrainConfig))
    args = training_args(recipe.run, recipe.policy, recipe.train)
    assert (args.report_to, args.log_level, args.seed) == (["wandb"], "warning", 7)
    none = load_recipe(["--config", "recipes/tiny.yaml", "--report_to", "none"])
    assert none.run.report_to == [] and training_args(none.run, none.policy, none.train).report_to == []


def test_the_machine_is_the_train_stages_question(monkeypatch, tmp_path):
    """Building the train section asks nothing of the machine; the train stage's DPOConfig decides bf16 where
    the recipe leaves it unset and makes a launch without accelerators one CPU group."""
    from selskill.config.run import PolicyConfig, RunConfig
    from selskill.config.train import TrainConfig
    from selskill.train import args as train_args

    asked = []
    monkeypatch.setattr(train_args, "bf16_available", lambda: asked.append("bf16") or False)
    monkeypatch.setattr(train_args, "cpu_only_launch", lambda: asked.append("launch") or True)
    section = TrainConfig(output_dir=str(tmp_path))
    assert asked == [] and section.bf16 is None and not section.use_cpu
    args = train_args.training_args(RunConfig(), PolicyConfig(), section)
    assert "bf16" in asked and "launch" in asked
    assert args.bf16 is False and args.use_cpu and section.bf16 is None and not section.use_cpu
