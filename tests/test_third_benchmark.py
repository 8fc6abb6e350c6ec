"""A new benchmark is one folder: a third one, defined here in a few lines, plays a whole round.

`Counter` is a deterministic text task (reach a number with `inc` / `dec`) with one
executable skill and one memory skill. It registers through `selskill.registry` only, with
no section, hooks or init builder of its own (the defaults serve a text benchmark), and the
round runs every stage on it unchanged: sample, branch, fork, label, train and eval, with
rows, pairs and metrics in the benchmark's own terms.
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter as Tally
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from selskill.envs.base import EnvState, replay_commands
from selskill.registry import Benchmark, StepMeasure, Wording, register

GOALS = {"train/reach_2": 2, "train/reach_3": 3, "train/reach_4": 4, "test/reach_3": 3, "test/reach_5": 5}
SKILLS = {
    "count_up": "---\nname: count_up\ndescription: Add two to the counter.\nkind: executable\n"
    "steps:\n  - inc\n  - inc\n---\nAdds two.\n",
    "counting_tips": "---\nname: counting_tips\ndescription: How to reach a number.\nkind: memory\n---\n"
    "Say inc until the counter shows the goal.\n",
}


class CounterEnv:
    """Reach the goal number from 0; `inc` and `dec` are the only commands."""

    def __init__(self, index=None):
        self.value, self.goal, self._state = 0, 0, None

    def task_ids(self) -> list[str]:
        return list(GOALS)

    def _observe(self, text: str, steps: int) -> EnvState:
        won = self.value == self.goal
        self._state = EnvState(text, ["inc", "dec"], f"reach {self.goal}", won=won, done=won, env_steps=steps)
        return self._state

    def reset(self, task_id: str) -> EnvState:
        self.value, self.goal = 0, GOALS[task_id]
        return self._observe(f"The counter shows 0. Your task is to: reach {self.goal}", 0)

    def step(self, command: str) -> EnvState:
        self.value += {"inc": 1, "dec": -1}.get(command, 0)
        said = f"The counter shows {self.value}." if command in ("inc", "dec") else "Nothing happens."
        return self._observe(said, 1)

    def replay(self, task_id, commands) -> EnvState:
        return replay_commands(self, task_id, commands)

    def inventory(self) -> list[str]:
        return []

    @property
    def state(self) -> EnvState:
        return self._state


@dataclass
class Task:
    task_id: str
    task_type: str = "reach"


@dataclass
class CounterIndex:
    split: str
    games: list = field(default_factory=list)
    skipped: Tally = field(default_factory=Tally)
    benchmark = "counter"

    def by_id(self) -> dict:
        return {g.task_id: g for g in self.games}

    def stats(self) -> dict:
        return {}

    def summary(self) -> str:
        return f"{len(self.games)} counter tasks"


def _skills(root: Path):
    from selskill.skills import load_skills

    for name, text in SKILLS.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "SKILL.md").write_text(text)
    return load_skills(root)


def _turn_format(rollout, settings):
    from selskill.agent.turn_format import TurnFormat

    return TurnFormat(style="compact", intro="You operate a counter.", example_command="inc")


@pytest.fixture(scope="module")
def counter(tmp_path_factory):
    root = tmp_path_factory.mktemp("counter-skills")
    return register(
        Benchmark(
            name="counter",
            steps=StepMeasure("n_turns", "steps_after_branch", "decisions"),
            splits=lambda settings: ("train", "test"),
            held_out=("test",),
            task_index=lambda run, split: CounterIndex(
                split, [Task(t) for t in GOALS if t.startswith(split)]
            ),
            identity=lambda run, split: {"goals": {t: g for t, g in GOALS.items() if t.startswith(split)}},
            env_factory=lambda index: functools.partial(CounterEnv, index),
            skills=functools.partial(_skills, root),
            turn_format=_turn_format,
            wording=Wording(tasks="counters", task_type="goal kind"),
        )
    )


def _overfit(model_dir: Path, out: Path, fmt, library) -> Path:
    """The tiny model after a few steps on one winning episode that calls the skill, then acts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selskill.agent.turn_format import render_action, render_skill_call
    from selskill.skills import render_listing

    messages = [
        fmt.system_message(render_listing(library)),
        fmt.observation_message("The counter shows 0. Your task is to: reach 3", ["inc", "dec"]),
        fmt.assistant_message(render_skill_call("count_up", {})),
        fmt.skill_return_message("The counter shows 2."),
        fmt.assistant_message(render_action("inc")),
    ]
    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = tok.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids = torch.tensor([list(enc["input_ids"])])
    labels = torch.tensor(
        [[i if m else -100 for i, m in zip(enc["input_ids"], enc["assistant_masks"], strict=True)]]
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    steps = 60
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    model.train()
    for _ in range(steps):
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    model.eval().save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_a_third_benchmark_plays_a_round(counter, tiny_model_dir, tmp_path):
    from selskill.config import load_recipe
    from selskill.data.layout import round_dir
    from selskill.stages.round import run_round

    policy = _overfit(tiny_model_dir, tmp_path / "policy", _turn_format(None, None), counter.skills())
    recipe = tmp_path / "counter.yaml"
    recipe.write_text(
        f"benchmark: counter\nexp: c\nruns_dir: {tmp_path / 'runs'}\nmodel_name_or_path: {policy}\nseed: 0\n"
        "sample_k: 4\nsample_temperature: 1.0\nmax_decisions: 6\nmax_env_steps: 12\nmax_new_tokens: 24\n"
        "env_overlap: false\nturn_show_admissible: true\nbranch_top_post_skill: 1\nbranch_top_ordinary: 1\n"
        "fork_k_invoke: 1\nfork_k_skip: 1\nmax_steps: 2\nper_device_train_batch_size: 1\nreport_to: none\n"
        "gradient_accumulation_steps: 1\neval_bootstrap: 50\nsave_strategy: 'no'\nprecompute_ref_log_probs: true\n"
    )
    run_round(load_recipe(["--config", str(recipe)]))
    r1 = round_dir(tmp_path / "runs", "c", 1)
    import pyarrow.parquet as pq

    rows = [
        r for f in sorted((r1 / "sample" / "shards").glob("*.parquet")) for r in pq.read_table(f).to_pylist()
    ]
    assert {r["task_id"] for r in rows} == {t for t in GOALS if t.startswith("train/")}
    assert any(r["success"] for r in rows), "the overfit policy wins some counters"
    calls = [t for r in rows for t in r["turns"] if t["kind"] == "skill"]
    assert calls and all(t["commands"] in (["inc", "inc"], []) for t in calls)  # the skill ran on this env
    metrics = json.loads((r1 / "eval" / "metrics.json").read_text())
    assert metrics["benchmark"] == "counter" and metrics["steps"] == "decisions"
    assert set(metrics["splits"]) == {"test"}
    assert (r1 / "train" / "model").is_dir()


def test_an_installed_plugin_is_found_by_its_entry_point(tmp_path, monkeypatch):
    """A package that declares a `selskill.benchmarks` entry point is imported when the registry is first
    asked; one that does not import is named with the fix."""
    from importlib.metadata import EntryPoint

    from selskill import registry

    (tmp_path / "counter_plugin.py").write_text(
        "from selskill.registry import Benchmark, StepMeasure, register\n"
        "register(Benchmark(name='counter_ep', steps=StepMeasure('n_turns', 'steps_after_branch', 'decisions'),\n"
        "    splits=lambda s: ('train',), held_out=('train',), task_index=None, identity=None,\n"
        "    env_factory=None, skills=None, turn_format=None))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    found = [EntryPoint("counter_ep", "counter_plugin", registry.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(
        registry, "entry_points", lambda group: found if group == registry.ENTRY_POINT_GROUP else []
    )
    monkeypatch.setattr(registry, "_discovered", False)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # the plugin leaves no trace
    assert "counter_ep" not in registry._REGISTRY
    assert {"alfworld", "bfcl", "counter_ep"} <= set(registry.names())
    missing = [EntryPoint("gone", "no_such_plugin_module", registry.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(registry, "entry_points", lambda group: missing)
    monkeypatch.setattr(registry, "_discovered", False)
    with pytest.raises(ImportError, match="benchmark plugin gone .*install what it needs or uninstall it"):
        registry.names()


def test_a_benchmark_name_taken_twice_is_refused_naming_both_plugins(tmp_path, monkeypatch):
    """Two plugins that register one name: the second is refused with both modules (and the installed one's
    entry point) named, instead of a recipe silently playing whichever was imported last."""
    import importlib
    from importlib.metadata import EntryPoint

    from selskill import registry

    spec = (
        "from selskill.registry import Benchmark, StepMeasure, register\n"
        "register(Benchmark(name='twice', steps=StepMeasure('n_turns', 'steps_after_branch', 'decisions'),\n"
        "    splits=lambda s: ('train',), held_out=('train',), task_index=None, identity=None,\n"
        "    env_factory=None, skills=None, turn_format=None))\n"
    )
    for module in ("twice_one", "twice_two"):
        (tmp_path / f"{module}.py").write_text(spec)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_SOURCES", dict(registry._SOURCES))
    monkeypatch.setattr(registry, "_ENTRY_POINTS", {})
    importlib.import_module("twice_one")
    assert registry.source("twice") == "twice_one"
    importlib.reload(importlib.import_module("twice_one"))  # the same plugin again: no conflict
    found = [EntryPoint("twice_ep", "twice_two", registry.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(registry, "entry_points", lambda group: found)
    monkeypatch.setattr(registry, "_discovered", False)
    with pytest.raises(ValueError, match=r"two plugins register the benchmark 'twice': twice_one and twice_two "
                       r"\(entry point twice_ep\); uninstall one"):  # fmt: skip
        registry.names()
