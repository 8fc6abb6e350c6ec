"""A tiny ALFWorld round (sample -> branch -> fork) with `retrieval_mode: progress` on a padded library.

The rows must record what each decision listed, at most k skills, every skill call and every
fork's forced skill within its turn's listing, and the listings of a fork's turns must be
what the pure retrieval function gives on the fork's own replayed prefix.

The sample stage plays a scripted policy (acts, and calls the first skill each step lists),
so the round has branch points of both pools whatever the tiny model writes; branch scores
candidates and fork continues with the conftest's tiny model, through the stages' own code.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from selskill.agent.episode_host import EpisodeHost
from selskill.agent.listings import STEP_SKILLS_HEADING
from selskill.agent.turn_format import forced_prefix, render_action, render_skill_call
from selskill.benchmarks.alfworld.env import find_games
from selskill.data.records import Turn
from selskill.policy.base import Generation
from selskill.skills.retrieval import RetrievalConfig

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("sample", "branch", "fork")
_NAME = re.compile(r"^- ([A-Za-z0-9_]+)", re.M)


class StepScript:
    """A sampling policy whose n-th turn is fixed: act, call the step's first listed skill, act."""

    policy_id = "scripted"

    def __init__(self, inner):
        self.inner = inner

    @property
    def tokenizer(self):
        return self.inner.tokenizer

    def stats(self):
        return self.inner.stats()

    def generate(self, requests, params):
        out = []
        for req in requests:
            prompt = self.tokenizer.decode(req.prompt_ids)
            n = prompt.count("<|im_start|>assistant") - 1  # assistant turns so far
            listed = _NAME.findall(prompt.rsplit(STEP_SKILLS_HEADING, 1)[1])
            texts = [
                render_action("look"),
                render_skill_call(listed[0]),
                render_action("inventory"),
                render_action("go to desk 1"),
            ]
            ids = self.tokenizer.encode(texts[n % len(texts)], add_special_tokens=False)
            ids.append(params.stop_token_ids[0])
            # distinct entropies per turn, so the entropy strategy ranks the points
            out.append([Generation(ids, [-1.0] * len(ids), [0.5 + 0.1 * n] * len(ids), "stop")])
        return out


def _stage(script: str, recipe: Path) -> int:
    spec = importlib.util.spec_from_file_location(f"retrieval_{script}", ROOT / "pipelines" / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main(["--config", str(recipe)])


@pytest.fixture(scope="module")
def round_dir(tmp_path_factory, small_games, tiny_model_dir):
    import selskill.stages.sample as sample_stage

    root = tmp_path_factory.mktemp("retrieval_round")
    recipe = root / "recipe.yaml"
    recipe.write_text(
        f"exp: t\nruns_dir: {root / 'runs'}\ngames_dir: {small_games}\nmodel_name_or_path: {tiny_model_dir}\n"
        "sample_k: 2\nsample_max_tasks: 3\nmax_env_steps: 5\nmax_new_tokens: 24\nconcurrent_episodes: 4\n"
        "policy_batch_size: 8\nseed: 3\nbranch_top_post_skill: 2\nbranch_top_ordinary: 2\n"
        "fork_k_invoke: 1\nfork_k_skip: 1\nretrieval_mode: progress\nretrieval_library_size: 40\n"
    )
    real = sample_stage.load_policy
    mp = pytest.MonkeyPatch()
    mp.setattr(sample_stage, "load_policy", lambda *a, **k: StepScript(real(*a, **k)))
    try:
        for stage in STAGES:
            assert _stage(stage, recipe) == 0, stage
    finally:
        mp.undo()
    return SimpleNamespace(root=root, recipe=recipe, model=tiny_model_dir, games=small_games)


def _read(root: Path, stage: str) -> list[dict]:
    import pyarrow.parquet as pq

    files = sorted((root / "runs" / "t" / "round_1" / stage / "shards").glob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def _host(run) -> EpisodeHost:
    """An episode host with the library and retriever the recipe's stages played with."""
    from transformers import AutoTokenizer

    from selskill.config import load_recipe
    from selskill.stages.runner_setup import make_runner

    recipe = load_recipe(["--config", str(run.recipe)])
    policy = SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(run.model))
    runner = make_runner(policy, find_games(run.games), recipe.rollout, 1.0, settings=recipe.settings)
    return EpisodeHost(*runner._host_args)


def test_rows_record_the_listing_of_every_turn(round_dir):
    host = _host(round_dir)
    assert host.retriever is not None and len(host.library) == 40
    k = RetrievalConfig().k
    rollouts = _read(round_dir.root, "sample")
    assert len(rollouts) == 6
    for row in rollouts:
        messages = json.loads(row["messages"])
        assert STEP_SKILLS_HEADING + "\n" not in messages[0]["content"]  # it only names the blocks
        for t in row["turns"]:
            assert 1 <= len(t["listed"]) <= k and set(t["listed"]) <= set(host.library.names)
            block = messages[t["message_index"] - 1]["content"].split(STEP_SKILLS_HEADING)[-1]
            assert _NAME.findall(block) == t["listed"]
            if t["kind"] == "skill":
                assert t["skill"] in t["listed"]
    assert any(t["kind"] == "skill" for r in rollouts for t in r["turns"])


def test_forks_force_only_listed_skills_and_replay_the_listings(round_dir):
    host = _host(round_dir)
    sources = {r["rollout_id"]: r for r in _read(round_dir.root, "sample")}
    branches = {b["branch_id"]: b for b in _read(round_dir.root, "branch")}
    forks = _read(round_dir.root, "fork")
    assert {b["pool"] for b in branches.values()} == {"post_skill", "ordinary"}
    assert len(forks) == 2 * len(branches)
    for b in branches.values():
        assert b["candidate_skill"] in sources[b["rollout_id"]]["turns"][b["turn_index"]]["listed"]
    env = host.env_factory()
    checked = 0
    for fork in forks:
        b = branches[fork["branch_id"]]
        source, t = sources[b["rollout_id"]], b["turn_index"]
        assert fork["turns"][:t] == source["turns"][:t]
        assert fork["turns"][t]["listed"] == source["turns"][t]["listed"] and fork["turns"][t]["forced"]
        if fork["arm"] == "invoke":
            assert fork["turns"][t]["text"].startswith(forced_prefix("invoke", b["candidate_skill"]))
        # every later turn lists what retrieval gives on the fork's own replayed prefix
        for j in range(t + 1, len(fork["turns"])):
            prefix = host._replay(env, fork["task_id"], [Turn.from_row(x) for x in fork["turns"][:j]])
            assert list(host._listed(prefix)) == fork["turns"][j]["listed"], (fork["fork_id"], j)
            checked += 1
    assert checked
