"""Skill retrieval in the episode runner (issue 18, phase 2): recipe keys, listing per mode,
the `listed` turn field, unlisted calls refused, exact replay in forks, listing noise."""

from __future__ import annotations

import json
import re

import pytest

from selskill.agent.episode_host import EpisodeHost, EpisodeSpec
from selskill.agent.eval_modes import prompt_setup
from selskill.agent.listings import PROGRESS_LISTING, STEP_SKILLS_HEADING, listing_text
from selskill.agent.parser import parse_turn
from selskill.agent.runner import EpisodeRunner, RunnerConfig
from selskill.agent.transcript import INVALID_TURN_FEEDBACK, MALFORMED_COMMAND
from selskill.agent.turn_format import forced_prefix, render_action, render_skill_call
from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.benchmarks.alfworld.env import AlfworldEnv, find_games
from selskill.benchmarks.alfworld.episode import AlfworldHooks
from selskill.benchmarks.alfworld.turn_format import AlfworldTurnFormat
from selskill.benchmarks.bfcl import load_bfcl_skills
from selskill.config import check_sections
from selskill.config.rollout import RolloutConfig
from selskill.config.run import RunConfig
from selskill.config.stages import EvalConfig
from selskill.data.records import BranchPoint, Episode, Turn
from selskill.data.schema import _TURN
from selskill.policy.base import Generation
from selskill.skills import render_listing
from selskill.skills.retrieval import RetrievalConfig, SkillRetriever
from selskill.stages.fork import fork_start
from selskill.stages.runner_setup import padded_library, retriever, runner_library

FMT = AlfworldTurnFormat(style="compact", admissible_style="local")
OWN = load_alfworld_skills()
BIG = padded_library(OWN, 40)
_NAME = re.compile(r"^- ([A-Za-z0-9_]+)", re.M)


def step_listing(prompt: str) -> list[str]:
    """The names under the prompt's latest "Skills for this step:" block."""
    block = prompt.rsplit(STEP_SKILLS_HEADING, 1)[1].split("<|im_end|>")[0]
    return _NAME.findall(block)


def call_listed(prompt: str) -> str:
    return render_skill_call(step_listing(prompt)[0])


def call_unlisted(prompt: str) -> str:
    return render_skill_call(next(n for n in OWN.names if n not in step_listing(prompt)))


class Script:
    """Scripted assistant turns; a callable entry writes its turn from the prompt it is given."""

    policy_id = "scripted"

    def __init__(self, tokenizer, texts, default=None):
        self.tokenizer, self.texts = tokenizer, list(texts)
        self.default = default or render_action("look")

    def generate(self, requests, params):
        out = []
        for req in requests:
            entry = self.texts.pop(0) if self.texts else self.default
            text = entry(self.tokenizer.decode(req.prompt_ids)) if callable(entry) else entry
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [params.stop_token_ids[0]]
            out.append([Generation(ids, [-1.0] * len(ids), [0.5] * len(ids), "stop")])
        return out


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def index(small_games):
    return find_games(small_games)


@pytest.fixture(scope="module")
def task(index):
    return next(t for t in AlfworldEnv(index).task_ids() if "pick_heat" in t)


def _config(**kw) -> RunnerConfig:
    return RunnerConfig(
        **{"max_env_steps": 20, "max_decisions": 10, "max_new_tokens": 48, "env_overlap": False, **kw}
    )


def _retriever(mode: str, library=BIG) -> SkillRetriever:
    return SkillRetriever(library, RetrievalConfig(mode=mode))


def _play(tokenizer, index, task, texts, mode=None, library=BIG, fork=None, seed=0):
    ret = None if mode is None else _retriever(mode, library)
    runner = EpisodeRunner(
        Script(tokenizer, texts),
        lambda: AlfworldEnv(index),
        library,
        FMT,
        _config(),
        retriever=ret,
        hooks=AlfworldHooks(),
    )
    return runner.run([EpisodeSpec("e", task, seed=seed, fork=fork)])[0]


def call_executable(prompt: str) -> str:
    """The best listed skill that runs commands (the first listed if none does)."""
    names = step_listing(prompt)
    return render_skill_call(next((n for n in names if BIG[n].is_executable), names[0]))


def _fetch_plate(index, task) -> list[str]:
    """Commands that reach the task's plate and take it (the game is generated: look, don't know)."""
    env = AlfworldEnv(index)
    state = env.reset(task)
    for place in re.findall(r"an? ([a-z]+ \d+)", state.observation.split("Your task")[0]):
        env.reset(task)
        commands = [f"go to {place}"]
        state = env.step(commands[0])
        if f"open {place}" in state.admissible_commands:
            commands.append(f"open {place}")
            state = env.step(commands[-1])
        take = [c for c in state.admissible_commands if c.startswith("take plate")]
        if take:
            return [*commands, take[0]]
    raise AssertionError("no plate in the game")


@pytest.fixture(scope="module")
def source_texts(index, task):
    """Acts, memory calls, an unlisted-prone step and an executable call that runs commands."""
    return [
        render_action("look"),
        call_listed,
        *[render_action(c) for c in _fetch_plate(index, task)],
        render_action("go to microwave 1"),  # what the step shows brings the heating skill up
        call_executable,
        render_action("inventory"),
        call_listed,
        render_action("look"),
    ]


# --- recipe keys ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, value",
    [("retrieval_mode", "tracked"), ("retrieval_scorer", "tfidf"), ("retrieval_library_size", -1)],
)
def test_a_bad_retrieval_key_is_named(key, value):
    with pytest.raises(ValueError, match=f"{key} must be"):
        RolloutConfig(**{key: value})


def test_listing_noise_has_its_size_and_a_directory_per_size():
    assert EvalConfig(eval_mode="listing_noise", eval_listing_size=28).stage == "eval-listing_noise-28"
    with pytest.raises(ValueError, match="eval_listing_size must be"):
        EvalConfig(eval_mode="listing_noise", eval_listing_size=0)
    run = RunConfig()
    check_sections([run, RolloutConfig(), EvalConfig(eval_mode="listing_noise")])
    for rollout in (RolloutConfig(retrieval_mode="progress"), RolloutConfig(retrieval_library_size=40)):
        with pytest.raises(ValueError, match="eval_mode must be used with retrieval_mode: all"):
            check_sections([run, rollout, EvalConfig(eval_mode="listing_noise")])


def test_the_library_sizes_of_the_recipe():
    assert runner_library(RolloutConfig(), "alfworld").names == OWN.names
    padded = runner_library(RolloutConfig(retrieval_library_size=40), "alfworld")
    assert len(padded) == 40 and set(OWN.names) < set(padded.names)
    with pytest.raises(ValueError, match="retrieval_library_size: 5"):
        runner_library(RolloutConfig(retrieval_library_size=5), "alfworld")
    assert retriever(RolloutConfig(), padded) is None
    assert retriever(RolloutConfig(retrieval_mode="task"), padded).config.mode == "task"


def test_listing_noise_lists_bfcls_skills_padded_to_each_app_f_size():
    own = load_bfcl_skills()
    for size in (28, 38, 68):
        library = runner_library(RolloutConfig(), "bfcl", "listing_noise", size)
        assert len(library) == size and set(own.names) < set(library.names)
        setup = prompt_setup("listing_noise", library, FMT, "compact")
        assert setup.skill_text == render_listing(library) and len(setup.skill_text.splitlines()) == size
    # smaller listings are subsets of larger ones: the sizes differ only by added noise
    assert set(runner_library(RolloutConfig(), "bfcl", "listing_noise", 28).names) < set(
        runner_library(RolloutConfig(), "bfcl", "listing_noise", 38).names
    )


def test_make_runner_wires_the_recipe_keys(tokenizer, index):
    from selskill.stages.runner_setup import make_runner

    policy = Script(tokenizer, [])
    plain = make_runner(policy, index, RolloutConfig(), 1.0, settings=None)
    assert plain._host_args[1].names == OWN.names and plain._host_args[-2] is None
    rollout = RolloutConfig(retrieval_mode="progress", retrieval_library_size=40)
    ret = make_runner(policy, index, rollout, 1.0, settings=None)._host_args[-2]
    assert ret.config.mode == "progress" and ret.config.scorer == "bm25" and len(ret.library) == 40
    # modes without a skill tool list nothing to retrieve from
    assert make_runner(policy, index, rollout, 0.0, mode="no_skills", settings=None)._host_args[-2] is None
    noise = make_runner(
        policy, index, RolloutConfig(), 0.0, mode="listing_noise", listing_size=40, settings=None
    )
    library, listing = noise._host_args[1], noise._host_args[6]
    assert len(library) == 40 and noise._host_args[-2] is None and listing == render_listing(library)
    psg = RolloutConfig(retrieval_mode="task", retrieval_library_size=40, retrieval_pseudo_skills=True)
    assert make_runner(policy, index, psg, 1.0, settings=None).config.pseudo_skills is True
    # a baseline without a listing under a pseudo-skill recipe: nothing to retrieve, nothing to write
    assert make_runner(policy, index, psg, 0.0, mode="no_skills", settings=None).config.pseudo_skills is False


# --- the parser -------------------------------------------------------------------------------


def test_a_library_skill_that_was_not_listed_is_malformed():
    text = render_skill_call("heat_object", {"object": "mug 1"})
    assert parse_turn(text, OWN.names).kind == "skill"
    assert parse_turn(text, OWN.names, listed=("heat_object",)).kind == "skill"
    unlisted = parse_turn(text, OWN.names, listed=("clean_object", "cool_object"))
    assert unlisted.kind == "malformed" and unlisted.reason == "unlisted_skill:heat_object"
    assert unlisted.skill == "heat_object" and unlisted.arguments == {"object": "mug 1"}
    assert parse_turn(render_skill_call("nope"), OWN.names, listed=()).reason == "unknown_skill:nope"


# --- the listing of each mode -------------------------------------------------------------------


def test_mode_all_writes_exactly_what_the_runner_wrote_without_retrieval(tokenizer, index, task):
    texts = [render_action("look"), render_skill_call("common_mistakes"), render_action("inventory")]
    plain = _play(tokenizer, index, task, texts, library=OWN)
    explicit = _play(tokenizer, index, task, texts, mode="all", library=OWN)
    assert explicit == plain
    messages = json.loads(plain.messages)
    assert messages[0]["content"] == FMT.system_text(render_listing(OWN))
    assert not any(STEP_SKILLS_HEADING in m["content"] for m in messages)
    assert all(t.listed == list(OWN.names) for t in plain.turns)
    assert plain.turns[1].kind == "skill" and plain.turns[1].exec_precise


def test_mode_task_lists_the_tasks_skills_in_the_system_prompt(tokenizer, index, task):
    row = _play(tokenizer, index, task, [render_action("look"), render_action("inventory")], mode="task")
    messages = json.loads(row.messages)
    listed = row.turns[0].listed
    assert 1 <= len(listed) <= RetrievalConfig().shown
    assert all(t.listed == listed for t in row.turns)
    assert messages[0]["content"] == FMT.system_text(listing_text(BIG, listed))
    assert not any(STEP_SKILLS_HEADING in m["content"] for m in messages)
    # the listing is retrieved for the task as first given
    env = AlfworldEnv(index)
    state = env.reset(task)
    from selskill.skills.step_records import EpisodePrefix

    assert tuple(listed) == _retriever("task").listing(EpisodePrefix(task=state.task)).names
    assert "heat" in " ".join(listed)  # a pick_heat task finds the heating skill among 40


PSG_DOC = (
    "NAME: examine_under_light\nUse it to look at an object by the light of a desklamp.\n"
    "1. find the desklamp 2. switch it on 3. examine the object"
)


def test_mode_task_scores_the_policys_own_pseudo_skills(tokenizer, index, task):
    """SkillDreamer's PSG by the policy: one capability answer, one pseudo-skill per capability,
    both asked with the paper's prompts before the episode, recorded in the row, and retrieval
    lists what the task plus those pseudo-skills rank highest."""
    from selskill.skills.step_records import EpisodePrefix

    state = AlfworldEnv(index).reset(task)
    asked = []

    def capabilities(prompt):
        asked.append(prompt)
        return "CAPABILITY: examining an object under a lamp\nANCHORS: desklamp"

    def pseudo_skill(prompt):
        asked.append(prompt)
        return PSG_DOC

    texts = [capabilities, pseudo_skill, render_action("look"), render_action("inventory")]
    runner = EpisodeRunner(
        Script(tokenizer, texts),
        lambda: AlfworldEnv(index),
        BIG,
        FMT,
        _config(pseudo_skills=True),
        retriever=_retriever("task"),
        hooks=AlfworldHooks(),
    )
    row = runner.run([EpisodeSpec("e", task, seed=0)])[0]
    assert "capability inference" in asked[0] and state.task in asked[0]
    assert "Capability required: examining an object under a lamp" in asked[1] and "desklamp" in asked[1]
    assert row.pseudo_skills == [PSG_DOC]
    with_psg = _retriever("task").listing(EpisodePrefix(task=state.task), [PSG_DOC]).names
    assert tuple(row.turns[0].listed) == with_psg
    assert with_psg != _retriever("task").listing(EpisodePrefix(task=state.task)).names
    assert json.loads(row.messages)[0]["content"] == FMT.system_text(listing_text(BIG, with_psg))
    # once per task per runner: a second run reuses them and asks the policy for turns only
    runner.policy.texts = [render_action("look")]
    again = runner.run([EpisodeSpec("e2", task, seed=1)])[0]
    assert again.pseudo_skills == [PSG_DOC] and again.turns[0].text == render_action("look")


def test_pseudo_skills_need_task_retrieval():
    with pytest.raises(ValueError, match="retrieval_pseudo_skills.*retrieval_mode: task"):
        RolloutConfig(retrieval_pseudo_skills=True, retrieval_mode="progress")
    RolloutConfig(retrieval_pseudo_skills=True, retrieval_mode="task")
    with pytest.raises(ValueError, match="mode task"):
        EpisodeRunner(
            Script(None, []),
            lambda: None,
            BIG,
            FMT,
            _config(pseudo_skills=True),
            retriever=_retriever("progress"),
        )


def test_mode_progress_lists_each_step_after_its_observation(tokenizer, index, task, source_texts):
    row = _play(tokenizer, index, task, source_texts, mode="progress")
    messages = json.loads(row.messages)
    assert PROGRESS_LISTING in messages[0]["content"]
    assert not any(f"- {n}" in messages[0]["content"] for n in BIG.names)
    k = RetrievalConfig().k
    for t in row.turns:
        assert 1 <= len(t.listed) <= k
        shown = messages[t.message_index - 1]["content"]  # the observation the decision is taken on
        assert shown.endswith(f"\n\n{STEP_SKILLS_HEADING}\n{listing_text(BIG, t.listed)}")
        assert step_listing(shown) == t.listed
    assert len({tuple(t.listed) for t in row.turns}) > 1, "the listing follows the episode"
    calls = [t for t in row.turns if t.kind == "skill"]
    assert calls and all(t.skill in t.listed for t in calls)
    assert any(t.commands and t.exec_precise for t in calls), "an executable call ran commands"
    # the record mirrors the struct of the rows, `listed` included
    assert [f.name for f in Turn.__dataclass_fields__.values()] == [
        _TURN.field(i).name for i in range(_TURN.num_fields)
    ]
    assert Turn.from_row(row.turns[0].to_row()) == row.turns[0]


def test_a_call_to_an_unlisted_skill_is_never_executed(tokenizer, index, task):
    row = _play(tokenizer, index, task, [call_unlisted], mode="progress", library=OWN)
    first = row.turns[0]
    assert first.kind == "malformed" and first.reason == f"unlisted_skill:{first.skill}"
    assert first.skill in OWN and first.skill not in first.listed
    assert first.exec_precise is False and first.exec_error == first.reason
    assert first.commands == [MALFORMED_COMMAND] and first.env_steps == 1
    reply = json.loads(row.messages)[first.message_index + 1]["content"]
    assert reply.startswith(INVALID_TURN_FEEDBACK)


# --- exact replay -------------------------------------------------------------------------------


def test_a_replayed_prefix_lists_what_the_source_listed_at_every_turn(tokenizer, index, task, source_texts):
    source = _play(tokenizer, index, task, source_texts, mode="progress")
    host = EpisodeHost(
        lambda: AlfworldEnv(index),
        BIG,
        FMT,
        _config(),
        tokenizer,
        None,
        "",
        _retriever("progress"),
        AlfworldHooks(),
    )
    env = AlfworldEnv(index)
    for k, turn in enumerate(source.turns):
        prefix = host._replay(env, task, source.turns[:k])
        assert list(host._listed(prefix)) == turn.listed, k


def _branch(source: Episode, t: int, task: str, candidate: str = "") -> BranchPoint:
    turn = source.turns[t]
    invoked = turn.kind == "skill"
    return BranchPoint(
        branch_id=f"e/t{t}",
        rollout_id="e",
        task_id=task,
        task_type="pick_heat_then_place_in_recep",
        round=1,
        turn_index=t,
        token_offset=turn.start + turn.decision,
        pool="post_skill" if invoked else "ordinary",
        score=0.0,
        strategy="entropy",
        candidate_skill=turn.skill if invoked else candidate,
        original_decision="invoke" if invoked else "skip",
        source_env_steps_before=sum(x.env_steps for x in source.turns[:t]),
    )


@pytest.mark.parametrize("arm", ["skip", "invoke"])
def test_a_fork_continuing_as_its_source_lists_what_the_source_listed(
    tokenizer, index, task, source_texts, arm
):
    source = _play(tokenizer, index, task, source_texts, mode="progress")
    # the action after the executable call (its replay re-runs the call) / the executable call
    ran = next(i for i, x in enumerate(source.turns) if x.kind == "skill" and x.commands)
    t = ran + 1 if arm == "skip" else ran
    assert source.turns[t].kind == ("action" if arm == "skip" else "skill")
    branch = _branch(source, t, task)
    start = fork_start(source, branch, arm)
    assert start.listed == source.turns[t].listed
    # the branch turn as the source wrote it, less what the fork forces
    text = source.turns[t].text
    opening = forced_prefix(arm, branch.candidate_skill if arm == "invoke" else None)
    assert text.startswith(opening)
    rest = [text[len(opening) :]] + [tt.text for tt in source.turns[t + 1 :]]
    fork = _play(tokenizer, index, task, rest, mode="progress", fork=start, seed=5)
    assert fork.turns[:t] == source.turns[:t]
    assert fork.token_ids[: branch.token_offset] == source.token_ids[: branch.token_offset]
    assert fork.turns[t].forced and fork.turns[t].text == text
    assert len(fork.turns) == len(source.turns)
    for mine, theirs in zip(fork.turns[t:], source.turns[t:], strict=True):
        for key in ("listed", "text", "kind", "skill", "commands", "exec_precise"):
            assert getattr(mine, key) == getattr(theirs, key), key
    assert json.loads(fork.messages) == json.loads(source.messages)
    if arm == "invoke":
        assert branch.candidate_skill in fork.turns[t].listed


def test_a_fork_never_forces_a_skill_its_branch_turn_did_not_list(tokenizer, index, task, source_texts):
    source = _play(tokenizer, index, task, source_texts, mode="progress")
    t = 2
    outside = next(n for n in BIG.names if n not in source.turns[t].listed)
    with pytest.raises(ValueError, match="is not among the skills its turn listed"):
        fork_start(source, _branch(source, t, task, candidate=outside), "invoke")
    listed = source.turns[t].listed[0]
    assert (
        fork_start(source, _branch(source, t, task, candidate=listed), "invoke").listed
        == source.turns[t].listed
    )


def test_a_host_in_a_child_process_lists_as_one_in_this_process(tokenizer, index, task, source_texts):
    import functools

    rows = []
    for overlap in (False, True):
        runner = EpisodeRunner(
            Script(tokenizer, [t for t in source_texts if not callable(t)]),
            functools.partial(AlfworldEnv, index),
            BIG,
            FMT,
            _config(env_overlap=overlap, concurrent_episodes=2),
            retriever=_retriever("progress"),
            hooks=AlfworldHooks(),
        )
        try:
            rows.append(runner.run([EpisodeSpec("e", task, seed=0)])[0])
        finally:
            runner.close()
    assert runner.overlap and rows[0] == rows[1]


# --- BFCL ---------------------------------------------------------------------------------------


def test_bfcl_progress_episodes_replay_their_listings():
    pytest.importorskip("bfcl_eval")
    from selskill.benchmarks.bfcl.env import BfclEnv, function_docs, ground_truth_commands
    from selskill.benchmarks.bfcl.episode import BfclHooks, BfclTurnFormat, render_calls
    from selskill.policy.bootstrap import train_tokenizer

    fmt = BfclTurnFormat(doc_style="brief")
    library = runner_library(RolloutConfig(), "bfcl", "listing_noise", 68)
    env = BfclEnv(["base"], scenarios=[106], id_prefix="train/")
    task_id = "train/multi_turn_base_106"
    task = env.task(task_id)
    docs = fmt.docs_text(function_docs(task.involved_classes))
    texts = [fmt.system_text(render_listing(library), docs), *task.turns]
    tok = train_tokenizer(texts * 2, vocab_size=800)
    gt = [render_calls([c]) if c else render_action("[]") for c in ground_truth_commands(task)][:6]
    script = [gt[0], lambda prompt: render_skill_call(step_listing(prompt)[0]), *gt[1:]]
    config = RunnerConfig(max_env_steps=40, max_decisions=10, max_new_tokens=64, env_overlap=False)
    ret = SkillRetriever(library, RetrievalConfig(mode="progress"))
    runner = EpisodeRunner(
        Script(tok, script, render_action("[]")),
        lambda: env,
        library,
        fmt,
        config,
        retriever=ret,
        hooks=BfclHooks(),
    )
    row = runner.run([EpisodeSpec("b", task_id, seed=0)])[0]
    assert all(1 <= len(t.listed) <= 3 for t in row.turns)
    host = EpisodeHost(lambda: env, library, fmt, config, tok, None, "", ret, BfclHooks())
    other = BfclEnv(["base"], scenarios=[106], id_prefix="train/")
    for k, turn in enumerate(row.turns):
        assert list(host._listed(host._replay(other, task_id, row.turns[:k]))) == turn.listed, k


# --- the init's demonstrations list skills as the episodes do ----------------------------------


@pytest.mark.parametrize("mode", [None, "task", "progress"])
def test_demonstrations_are_the_transcripts_the_runner_writes_for_their_turns(tokenizer, index, mode):
    """A demo built for a retrieval round, its assistant turns played by the runner, comes back
    message for message: same system prompt, same step listings, every call listed."""
    import dataclasses

    from selskill.benchmarks.alfworld.demos import DemoMix, build_demos
    from selskill.sft.demos import DemoPrompts

    library = OWN if mode is None else BIG
    ret = None if mode is None else _retriever(mode, library)
    # every game with the skills listed: the listings are what this compares (the games played without
    # skills are the no_skills prompt's, tests/test_demos.py)
    mix = dataclasses.replace(DemoMix(), no_skills=0.0)
    report = build_demos(index.games, prompts=DemoPrompts(FMT, "compact", library, ret), seed=0, mix=mix)
    assert len(report.demos) >= 5, report.dropped
    config = _config(max_env_steps=60, max_decisions=80, max_new_tokens=96, max_context_tokens=1 << 16)
    calls = 0
    for demo in report.demos:
        texts = [m["content"] for m in demo.messages if m["role"] == "assistant"]
        runner = EpisodeRunner(
            Script(tokenizer, texts),
            lambda: AlfworldEnv(index),
            library,
            FMT,
            config,
            retriever=ret,
            hooks=AlfworldHooks(),
        )
        row = runner.run([EpisodeSpec("e", demo.task_id, seed=0)])[0]
        assert json.loads(row.messages) == demo.messages, demo.task_id
        assert row.success and all(t.kind in ("action", "skill") for t in row.turns)
        assert [t.skill for t in row.turns if t.kind == "skill"] == [c["skill"] for c in demo.calls]
        calls += len(demo.calls)
    assert calls, "the mix called skills"
    if mode == "progress":
        shown = {
            tuple(step_listing(m["content"]))
            for d in report.demos
            for m in d.messages
            if STEP_SKILLS_HEADING in m["content"]
        }
        assert len(shown) > 1, "each step lists its own skills"
        assert not any(f"- {n}:" in report.demos[0].messages[0]["content"] for n in BIG.names)


def test_a_retrieval_init_refuses_dagger(tmp_path):
    from selskill.benchmarks.alfworld.dagger import DaggerSettings
    from selskill.benchmarks.alfworld.demos import DEMO_FORMAT
    from selskill.benchmarks.alfworld.init_policy import build_init_policy
    from selskill.sft.demos import DemoPrompts

    # DAgger's own rollouts list every skill: a retrieval init would be trained on two prompts
    with pytest.raises(ValueError, match="init_dagger_iters: 1 with retrieval_mode: progress"):
        build_init_policy(
            tmp_path / "init", games_dir=tmp_path, dagger=DaggerSettings(iterations=1),
            prompts=DemoPrompts(DEMO_FORMAT, "compact", BIG, _retriever("progress")),
        )  # fmt: skip
    assert not (tmp_path / "init").exists()
