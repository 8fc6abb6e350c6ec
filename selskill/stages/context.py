"""How the recipe's rollout and games sections become objects for the stages that play episodes.

Sampling, forking and evaluation must play with the same prompt, skill listing and
budgets (a fork continues an episode under the exact conditions it was sampled under), so
those knobs live in one `RolloutConfig` (`selskill.config.rollout`) and one `make_runner`.

The recipe's `benchmark` picks the environment, and everything a stage needs of it comes
from its spec (`selskill.agent.benchmarks`) through here: `game_index(run, split)` (the
env's task index: `games` records with `task_id` and `task_type`, `by_id`, `skipped`,
`patched`), `skill_library(env)`, `turn_format(rollout, env)` and `make_runner`, which
reads the env off the index. Task ids are `<split>/<id>` in every env.
"""

from __future__ import annotations

from collections.abc import Sequence

from selskill.agent.benchmarks import DEFAULT_BENCHMARK, benchmark, benchmark_of_index
from selskill.agent.eval_modes import prompt_setup
from selskill.agent.runner import RunnerConfig
from selskill.agent.turn_format import TurnFormat
from selskill.config.rollout import GamesConfig, RolloutConfig
from selskill.config.run import PolicyConfig, RunConfig
from selskill.data.layout import check_model_source, resolve_round_policy
from selskill.skills import SkillLibrary


def turn_format(rollout: RolloutConfig, env: str = DEFAULT_BENCHMARK) -> TurnFormat:
    """The turn format the rollout section asks for on benchmark `env`."""
    return benchmark(env).turn_format(rollout)


def runner_config(rollout: RolloutConfig, temperature: float, top_p: float = 1.0) -> RunnerConfig:
    return RunnerConfig(
        max_env_steps=rollout.max_env_steps,
        max_turns=rollout.max_turns,
        max_context_tokens=rollout.max_context_tokens,
        max_new_tokens=rollout.max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        concurrent_episodes=rollout.concurrent_episodes,
        listing_style=rollout.listing_style,
        env_overlap=rollout.env_overlap,
        action_choice=rollout.action_choice,
    )


def sampling_policy_path(run: RunConfig, pol: PolicyConfig) -> str:
    """Round r samples with the policy it starts from (see `resolve_round_policy`)."""
    return resolve_round_policy(run, pol)[0]


def load_policy(pol: PolicyConfig, path: str, rollout: RolloutConfig, seed: int = 0):
    check_model_source(path, "the policy")
    if pol.policy_backend == "vllm":
        from selskill.policy.vllm_backend import VLLMPolicy

        return VLLMPolicy(path, dtype=pol.policy_dtype, seed=seed, trust_remote_code=pol.trust_remote_code)
    from selskill.policy.hf import HFPolicy

    return HFPolicy(
        path,
        device=pol.policy_device,
        dtype=pol.policy_dtype,
        trust_remote_code=pol.trust_remote_code,
        batch_size=rollout.policy_batch_size,
    )


def game_index(run: RunConfig, split: str):
    """The tasks of split `split` of the recipe's benchmark."""
    return benchmark(run.benchmark).task_index(run, split)


def skill_library(env: str = DEFAULT_BENCHMARK) -> SkillLibrary:
    """The skills shipped for `env` (the paper's mixes: 10 for ALFWorld, 18 for BFCL)."""
    return benchmark(env).skills()


def ensure_games(
    run: RunConfig, games: GamesConfig, splits: Sequence[str] = ("train", "valid_seen", "valid_unseen")
) -> None:
    """The one-off data the recipe's benchmark needs (ALFWorld's generated games), once."""
    prepare = benchmark(run.benchmark).prepare
    if prepare is not None:
        prepare(run, games, splits)


def make_runner(
    policy,
    index,
    rollout: RolloutConfig,
    temperature: float,
    top_p: float = 1.0,
    mode: str = "skills",
):
    """`mode` is one of `selskill.agent.eval_modes.MODES`; only evaluation uses another than `skills`.

    The env is the index's: its spec supplies the episode host, turn format and skills.
    """
    spec = benchmark_of_index(index)
    setup = prompt_setup(mode, spec.skills(), spec.turn_format(rollout), rollout.listing_style)
    runner_class, factory = spec.runner_class(), spec.env_factory(index)
    return runner_class(
        policy,
        factory,
        setup.library,
        setup.fmt,
        runner_config(rollout, temperature, top_p),
        chat_template_kwargs=rollout.chat_template_kwargs(spec.name),
        skill_text=setup.skill_text,
    )
