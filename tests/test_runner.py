"""The episode runner: exact token records, forced forks, failures recorded rather than raised."""

import pytest

from selskill.agent.episode_host import EpisodeSpec, ForkStart
from selskill.agent.runner import EpisodeRunner, RunnerConfig
from selskill.agent.transcript import MALFORMED_COMMAND
from selskill.agent.turn_format import forced_prefix, render_action, render_skill_call
from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.benchmarks.alfworld.env import AlfworldEnv, find_games
from selskill.benchmarks.alfworld.episode import AlfworldHooks
from selskill.benchmarks.alfworld.turn_format import AlfworldTurnFormat
from selskill.data.schema import ROLE_ASSISTANT, ROLE_OBSERVATION, ROLE_PROMPT, ROLE_SKILL_RETURN
from selskill.envs.base import EnvError
from selskill.policy.base import Generation
from selskill.policy.hf import HFPolicy
from selskill.policy.settings import HFSettings

FMT = AlfworldTurnFormat(style="compact", admissible_style="local")


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return HFPolicy(str(tiny_model_dir), HFSettings(batch_size=8))


@pytest.fixture(scope="module")
def index(small_games):
    return find_games(small_games)


def _runner(policy, index, **cfg):
    return EpisodeRunner(
        policy,
        lambda: AlfworldEnv(index),
        load_alfworld_skills(),
        FMT,
        RunnerConfig(**{"max_env_steps": 6, "max_new_tokens": 16, **cfg}),
        hooks=AlfworldHooks(),
    )


class ScriptedPolicy:
    """Test double: replies with scripted assistant texts; logprob/entropy are placeholders."""

    def __init__(self, inner, texts):
        self.inner, self.texts, self.policy_id = inner, list(texts), "scripted"

    @property
    def tokenizer(self):
        return self.inner.tokenizer

    def generate(self, requests, params):
        eot = params.stop_token_ids[0]
        out = []
        for _ in requests:
            text = self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [eot]
            out.append([Generation(ids, [-1.0] * len(ids), [0.5] * len(ids), "stop")])
        return out


def test_token_records_match_a_teacher_forced_pass(policy, index):
    runner = _runner(policy, index)
    rows = runner.run(
        [EpisodeSpec(f"e{i}", t, seed=i) for i, t in enumerate(AlfworldEnv(index).task_ids()[:3])]
    )
    for row in rows:
        n = len(row.token_ids)
        assert len(row.logprob) == len(row.entropy) == len(row.role) == len(row.turn) == n
        assert row.role[: row.n_prompt_tokens] == [ROLE_PROMPT] * row.n_prompt_tokens
        assert row.termination in ("step_limit", "won", "context_limit")
        for t in row.turns[:3]:
            s, e = t.start, t.end
            generated = (
                e
                - s
                - (
                    0
                    if row.token_ids[e - 1] == policy.tokenizer.eos_token_id and row.logprob[e - 1] != 0.0
                    else 1
                )
            )
            lp, ent = policy.score(row.token_ids[:s], row.token_ids[s:e])
            for i in range(generated):
                assert abs(lp[i] - row.logprob[s + i]) < 1e-4
                assert abs(ent[i] - row.entropy[s + i]) < 1e-4
            assert set(row.role[s:e]) == {ROLE_ASSISTANT}


def test_same_seed_same_episode_regardless_of_batch(policy, index):
    task = AlfworldEnv(index).task_ids()[0]
    alone = _runner(policy, index).run([EpisodeSpec("a", task, seed=11)])[0]
    others = [EpisodeSpec(f"o{i}", t, seed=50 + i) for i, t in enumerate(AlfworldEnv(index).task_ids()[1:4])]
    batched = _runner(policy, index).run([*others, EpisodeSpec("a", task, seed=11)])[-1]
    assert alone.token_ids == batched.token_ids


def test_actions_skills_and_malformed_turns_are_recorded(policy, index):
    task = next(t for t in AlfworldEnv(index).task_ids() if "pick_heat" in t)
    texts = [
        render_skill_call("heat_object"),
        "go to desk 1",
        render_skill_call("no_such_skill"),
        render_skill_call("common_mistakes"),
        render_action("look"),
        render_action("inventory"),
    ]
    runner = _runner(ScriptedPolicy(policy, texts), index)
    row = runner.run([EpisodeSpec("s", task, seed=0)])[0]
    kinds = [t.kind for t in row.turns]
    assert kinds[:4] == ["skill", "malformed", "malformed", "skill"]
    heat, bare, unknown, memory = row.turns[:4]
    assert heat.exec_precise is False and heat.exec_error == "precondition_failed:holding_object"
    assert bare.reason == "missing_tags" and bare.commands == [MALFORMED_COMMAND] and bare.env_steps == 1
    assert unknown.exec_precise is False and unknown.exec_error.startswith("unknown_skill")
    assert memory.exec_precise is True and memory.env_steps == 0
    assert row.n_skill_calls == 3 and row.n_precise_calls == 1 and row.n_malformed == 2
    # skill-return tokens follow the memory call, observation tokens follow the bare text
    assert ROLE_SKILL_RETURN in row.role[memory.end :] and ROLE_OBSERVATION in row.role[bare.end :]


class ExplodingEnv(AlfworldEnv):
    def step(self, command):
        if command == "look":
            raise EnvError("engine exploded")
        return super().step(command)


def test_environment_error_ends_only_that_episode(policy, index):
    tasks = AlfworldEnv(index).task_ids()[:2]
    texts = [
        render_action("look"),
        render_action("inventory"),
        render_action("inventory"),
        render_action("inventory"),
        render_action("inventory"),
        render_action("inventory"),
    ]
    runner = EpisodeRunner(
        ScriptedPolicy(policy, texts),
        lambda: ExplodingEnv(index),
        load_alfworld_skills(),
        FMT,
        RunnerConfig(max_env_steps=3, concurrent_episodes=2),
        hooks=AlfworldHooks(),
    )
    a, b = runner.run([EpisodeSpec("a", tasks[0], seed=0), EpisodeSpec("b", tasks[1], seed=1)])
    assert a.termination == "error" and "engine exploded" in a.error and a.n_turns == 1
    assert b.termination == "step_limit" and b.env_steps == 3


@pytest.mark.parametrize("first", ["common_mistakes", "heat_object"])
def test_every_decision_is_a_step_of_the_budget(policy, index, first):
    """The paper's step semantics: skill calls that run no command (memory skills, a premature
    executable call) still spend the budget, so a policy that only calls skills is stopped."""
    task = next(t for t in AlfworldEnv(index).task_ids() if "pick_heat" in t)
    texts = [render_skill_call(first), render_skill_call("pick_and_place")]
    runner = _runner(ScriptedPolicy(policy, texts), index, max_decisions=5, max_env_steps=100)
    row = runner.run([EpisodeSpec("m", task, seed=0)])[0]
    assert row.termination == "step_limit" and row.n_turns == 5 and row.env_steps == 0
    assert [t.kind for t in row.turns] == ["skill"] * 5
    assert row.turns[0].exec_precise is (first == "common_mistakes")


def test_the_command_cap_ends_an_episode_when_it_binds_first(policy, index):
    task = AlfworldEnv(index).task_ids()[0]
    look = ScriptedPolicy(policy, [render_action("look")])
    runner = _runner(look, index, max_decisions=10, max_env_steps=3)
    row = runner.run([EpisodeSpec("c", task, seed=0)])[0]
    assert row.termination == "step_limit" and row.env_steps == 3 and row.n_turns == 3


def test_forced_fork_reproduces_the_prefix_exactly(policy, index):
    task = next(t for t in AlfworldEnv(index).task_ids() if "pick_heat" in t)
    source = _runner(policy, index, max_env_steps=5).run([EpisodeSpec("src", task, seed=3)])[0]
    branch = 2
    t = source.turns[branch]
    offset = t.start
    turns_before = source.turns[:branch]
    import json

    messages = json.loads(source.messages)[: 2 + 2 * branch]
    commands = [c for turn in turns_before for c in turn.commands]
    fork = ForkStart(
        source.token_ids[:offset],
        source.logprob[:offset],
        source.entropy[:offset],
        source.role[:offset],
        source.turn[:offset],
        turns_before,
        messages,
        commands,
        sum(x.env_steps for x in turns_before),
        forced_prefix("invoke", "heat_object"),
        cache_from="src-prefix",
    )
    runner = _runner(policy, index, max_env_steps=7)
    row = runner.run(
        [EpisodeSpec("f0", task, seed=9, fork=fork), EpisodeSpec("f1", task, seed=10, fork=fork)]
    )[0]
    assert row.token_ids[:offset] == source.token_ids[:offset]
    forced_ids = policy.tokenizer.encode(forced_prefix("invoke", "heat_object"), add_special_tokens=False)
    assert row.token_ids[offset : offset + len(forced_ids)] == forced_ids
    assert row.turns[branch].forced and row.turns[branch].text.startswith('<tool_call>{"name": "heat_object"')
    assert row.turns[:branch] == source.turns[:branch]
    # generated tokens after the forced opening are scored exactly from the exact prefix
    s, e = offset + len(forced_ids), row.turns[branch].end - 1
    lp, _ = policy.score(row.token_ids[:s], row.token_ids[s:e])
    assert max(abs(a - b) for a, b in zip(lp, row.logprob[s:e], strict=True)) < 1e-4


def test_cpu_grouped_query_attention_matches_stock_sdpa(tiny_model_dir):
    """The CPU attention that keeps K/V grouped under a mask gives the stock model's numbers."""
    from transformers import AutoModelForCausalLM

    from selskill.policy.base import GenerationRequest, SamplingParams

    fast = HFPolicy(str(tiny_model_dir))
    assert fast.model.config._attn_implementation == "selskill_cpu_gqa_sdpa"
    stock = HFPolicy(str(tiny_model_dir), model=AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    assert stock.model.config._attn_implementation != "selskill_cpu_gqa_sdpa"
    prompts = [[5 + (i * 7 + j) % 300 for i in range(40 + 9 * j)] for j in range(3)]
    params = SamplingParams(temperature=1.0, max_new_tokens=12, stop_token_ids=())
    a = fast.generate([GenerationRequest(p, seed=j) for j, p in enumerate(prompts)], params)
    b = stock.generate([GenerationRequest(p, seed=j) for j, p in enumerate(prompts)], params)
    for x, y in zip(a, b, strict=True):
        assert x[0].token_ids == y[0].token_ids
        assert max(abs(u - v) for u, v in zip(x[0].logprobs, y[0].logprobs, strict=True)) < 1e-5


def _overlap_runner(policy, index, env_cls=AlfworldEnv, overlap=True):
    import functools

    return EpisodeRunner(
        policy,
        functools.partial(env_cls, index),
        load_alfworld_skills(),
        FMT,
        RunnerConfig(max_env_steps=6, max_new_tokens=16, concurrent_episodes=4, env_overlap=overlap),
        hooks=AlfworldHooks(),
    )


def test_episodes_in_a_child_process_match_the_serial_runner(policy, index):
    """Half-batches with their environments in a child process play the same episodes."""
    tasks = AlfworldEnv(index).task_ids()
    specs = [EpisodeSpec(f"p{i}", tasks[i % len(tasks)], seed=20 + i) for i in range(5)]
    overlapped = _overlap_runner(policy, index)
    assert overlapped.overlap
    done = []
    try:
        a = overlapped.run(specs, progress=done.append)
    finally:
        overlapped.close()
    serial = _overlap_runner(policy, index, overlap=False)
    assert not serial.overlap
    b = serial.run(specs)
    assert sum(done) == len(specs)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    for x, y in zip(a, b, strict=True):
        assert x.turns == y.turns and x.env_steps == y.env_steps and x.success == y.success
        assert max(abs(p - q) for p, q in zip(x.logprob, y.logprob, strict=True)) < 1e-4


class BrokenEnv(AlfworldEnv):
    def step(self, command):
        raise ZeroDivisionError("a bug in the environment adapter")


def test_a_failure_in_the_episode_process_is_raised_with_its_cause(policy, index):
    runner = _overlap_runner(policy, index, env_cls=BrokenEnv)
    assert runner.overlap
    tasks = AlfworldEnv(index).task_ids()[:2]
    with pytest.raises(RuntimeError, match="ZeroDivisionError: a bug in the environment adapter"):
        runner.run([EpisodeSpec(f"x{i}", t, seed=i) for i, t in enumerate(tasks)])
    assert runner._host is None  # closed; the next run starts a clean one


def test_unpicklable_env_factory_plays_in_process(policy, index):
    assert not _runner(policy, index, concurrent_episodes=4).overlap


def test_forced_invoke_tokens_follow_the_trained_tokenization():
    """A BPE trained on rendered calls merges `"}`; the forced head must not end on a lone `"`."""
    from selskill.agent.chat_tokens import ChatTokens
    from selskill.policy.bootstrap import train_tokenizer

    names = ["heat_object", "clean_object", "common_mistakes", "pick_and_place"]
    corpus = [render_skill_call(n) + " " + render_action(f"go to desk {i}") for i in range(50) for n in names]
    tok = train_tokenizer(corpus, vocab_size=300)
    chat = ChatTokens(tok)
    head, call = forced_prefix("invoke", "heat_object"), render_skill_call("heat_object")
    trained = chat.encode(call)
    forced = chat.encode_forced(head, call)
    assert forced == trained[: len(forced)]  # a prefix of what the policy was trained to write
    assert chat.decode(forced).startswith(head)
    # the naive encoding of the head alone is not such a prefix (the bug this guards against)
    naive = chat.encode(head)
    assert naive != trained[: len(naive)]
    assert chat.encode_forced("<action>") == chat.encode("<action>")  # no canonical: as before
    with pytest.raises(ValueError, match="does not open"):
        chat.encode_forced(head, render_skill_call("clean_object"))


class TruncatingPolicy(ScriptedPolicy):
    """Scripted texts; a `(text, False)` entry ends without its end-of-turn token (cut at max_new_tokens)."""

    def generate(self, requests, params):
        eot = params.stop_token_ids[0]
        out = []
        for _ in requests:
            item = self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]
            text, ended = item if isinstance(item, tuple) else (item, True)
            ids = self.tokenizer.encode(text, add_special_tokens=False) + ([eot] if ended else [])
            out.append([Generation(ids, [-1.0] * len(ids), [0.5] * len(ids), "stop" if ended else "length")])
        return out


def test_turn_records_carry_the_decision_token_and_the_message_index(policy, index):
    """`decision` is what the branch stage computed from the stored row before the runner recorded it."""
    import json

    from selskill.agent.chat_tokens import decision_token_index
    from selskill.agent.parser import parse_turn
    from selskill.config.stages import BranchConfig
    from selskill.data.records import BranchPoint
    from selskill.stages.branch import branch_candidates
    from selskill.stages.fork import fork_start

    task = next(t for t in AlfworldEnv(index).task_ids() if "pick_heat" in t)
    texts = [
        "<think>the mug is cold</think>\n" + render_action("look"),
        "  " + render_skill_call("heat_object"),
        "go to desk 1",  # malformed, no decision: 0
        "so " + render_action("look"),  # malformed: text outside the tags, a decision all the same
        ("<think>x</think>" + render_action("inventory"), False),  # truncated: an end-of-turn is appended
        render_action("inventory"),
    ]
    names = load_alfworld_skills().names
    row = _runner(TruncatingPolicy(policy, texts), index, max_env_steps=8).run([EpisodeSpec("d", task, 0)])[0]
    tok = policy.tokenizer
    messages = json.loads(row.messages)
    assert [t.kind for t in row.turns[:4]] == ["action", "skill", "malformed", "malformed"]
    assert (
        row.token_ids[row.turns[4].end - 1] == tok.eos_token_id and row.logprob[row.turns[4].end - 1] == 0.0
    )
    for i, t in enumerate(row.turns):
        ids = row.token_ids[t.start : t.end]
        char = parse_turn(t.text, names).decision_start or 0
        assert t.decision == decision_token_index(tok, ids, char)  # the rule, on the stored row
        if char:
            d = t.decision
            assert len(tok.decode(ids[:d], skip_special_tokens=False)) <= char
            assert len(tok.decode(ids[: d + 1], skip_special_tokens=False)) > char
        assert t.message_index == 2 + 2 * i
        assert messages[t.message_index] == {"role": "assistant", "content": t.text}
    assert row.turns[0].decision > 0 and row.turns[2].decision == 0
    cands = branch_candidates(row.to_row(), BranchConfig())
    assert [c["turn_index"] for c in cands[:2]] == [0, 1] and cands[1]["candidate_skill"] == "heat_object"
    assert all(
        c["token_offset"] == row.turns[c["turn_index"]].start + row.turns[c["turn_index"]].decision
        for c in cands
    )
    point = BranchPoint("d/t1", "d", task, "x", 1, 1, cands[1]["token_offset"], "post_skill", 0.0, "entropy",
                        "heat_object", "invoke", row.turns[0].env_steps)  # fmt: skip
    start = fork_start(row, point, "skip")
    assert start.messages == messages[:4] and start.turns == row.turns[:1]
    assert start.token_ids == row.token_ids[: cands[1]["token_offset"]]


def test_the_runner_config_is_the_rollout_sections_with_its_defaults():
    """Every runner setting but the stage's sampling comes from the rollout key of its name (or the
    `retrieval_*` key `ROLLOUT_KEYS` names), and a runner built by hand has the rollout section's defaults."""
    from selskill.config.rollout import RolloutConfig

    assert RunnerConfig.of(RolloutConfig(), 1.0) == RunnerConfig()
    rollout = RolloutConfig(
        max_decisions=7, max_env_steps=9, max_context_tokens=999, max_new_tokens=11, concurrent_episodes=3,
        listing_style="full", env_overlap=False, action_choice="admissible", retrieval_mode="task",
        retrieval_pseudo_skills=True, retrieval_pseudo_max_new_tokens=17,
    )  # fmt: skip
    assert RunnerConfig.of(rollout, 0.7, 0.9) == RunnerConfig(
        max_decisions=7, max_env_steps=9, max_context_tokens=999, max_new_tokens=11, temperature=0.7,
        top_p=0.9, concurrent_episodes=3, listing_style="full", env_overlap=False, action_choice="admissible",
        pseudo_skills=True, pseudo_skill_tokens=17,
    )  # fmt: skip
