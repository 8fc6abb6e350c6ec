"""How the recipe's rollout section becomes the episode runner every stage that plays episodes uses.

Sampling, forking and evaluation must play with the same prompt, skill listing and
budgets (a fork continues an episode under the exact conditions it was sampled under), so
those knobs live in one `RolloutConfig` (`selskill.config.rollout`) and one `make_runner`,
which reads the env off the task index: its spec (`selskill.registry`) supplies
the episode hooks, turn format and skills.

The rollout section's `retrieval_*` keys reach the runner here too (`runner_library`,
`retriever`): sample, fork and eval list skills the same way, so a fork's continuation sees
listings of the kind its source saw.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from selskill.agent.episode_host import EpisodeSpec
from selskill.agent.eval_modes import prompt_setup
from selskill.agent.runner import EpisodeRunner, RunnerConfig
from selskill.agent.turn_format import TurnFormat
from selskill.config.rollout import RolloutConfig
from selskill.config.run import RunConfig
from selskill.data.records import Episode, Rollout
from selskill.registry import benchmark, benchmark_of_index
from selskill.skills import SkillLibrary
from selskill.skills.distractors import library_of_size
from selskill.skills.retrieval import RetrievalConfig, SkillRetriever
from selskill.skills.scorers import dense_unavailable

# the distractors' seed: one library per size for every stage, round and recipe seed, so rows of
# different runs at one size list the same skills
DISTRACTOR_SEED = 0


def turn_format(rollout: RolloutConfig, env: str, settings=None) -> TurnFormat:
    """The turn format the rollout section asks for on benchmark `env`."""
    return benchmark(env).turn_format(rollout, settings)


def skill_library(env: str) -> SkillLibrary:
    """The skills shipped for `env` (the paper's mixes: 10 for ALFWorld, 18 for BFCL)."""
    return benchmark(env).skills()


def padded_library(own: SkillLibrary, size: int, key: str = "retrieval_library_size") -> SkillLibrary:
    """`own` padded with seeded distractors to `size` skills (0, or `own`'s size: `own` itself)."""
    if size in (0, len(own)):
        return own
    try:
        return library_of_size(own, size, DISTRACTOR_SEED)
    except ValueError as exc:
        raise ValueError(f"{key}: {size}: {exc}. Fix `{key}:` in the recipe or pass --{key} N") from None


def runner_library(
    rollout: RolloutConfig, env: str, mode: str = "skills", listing_size: int = 0
) -> SkillLibrary:
    """The library episodes may call from, before an eval mode changes it (listing_noise pads it)."""
    own = skill_library(env)
    if mode == "listing_noise":
        return padded_library(own, listing_size, "eval_listing_size")
    return padded_library(own, rollout.retrieval_library_size)


def eval_library(rollout: RolloutConfig, env: str, mode: str, listing_size: int = 0) -> SkillLibrary:
    """The skills the episodes of eval mode `mode` may call, as `make_runner` gives them to the runner."""
    library = runner_library(rollout, env, mode, listing_size)
    return prompt_setup(mode, library, turn_format(rollout, env), rollout.listing_style).library


def retriever(rollout: RolloutConfig, library: SkillLibrary) -> SkillRetriever | None:
    """The rollout section's retrieval over `library`; None where every skill is listed."""
    if rollout.retrieval_mode == "all" or not len(library):
        return None
    cfg = RetrievalConfig(mode=rollout.retrieval_mode, scorer=rollout.retrieval_scorer)
    if cfg.scorer != "bm25":
        # found here, not at the first decision inside the episode host's process
        why = dense_unavailable(cfg.dense_model, cfg.dense_local_files_only)
        if why:
            raise ValueError(
                f"retrieval_scorer: {cfg.scorer} needs the dense encoder, which does not load here ({why}); "
                "install the `dense` extra (README, 'Skill retrieval for large libraries') or use "
                "--retrieval_scorer bm25"
            )
    return SkillRetriever(library, cfg)


def make_runner(
    policy,
    index,
    rollout: RolloutConfig,
    temperature: float,
    top_p: float = 1.0,
    mode: str = "skills",
    listing_size: int = 0,
    *,
    settings,
):
    """`mode` is one of `selskill.agent.eval_modes.MODES`; only evaluation uses another than `skills`.

    The env is the index's: its spec supplies the episode hooks, turn format and skills;
    `settings` is the benchmark's own recipe section (`run.benchmark_settings`).
    `listing_size` is the padded size of eval mode `listing_noise`.
    """
    spec = benchmark_of_index(index)
    library = runner_library(rollout, spec.name, mode, listing_size)
    setup = prompt_setup(mode, library, spec.turn_format(rollout, settings), rollout.listing_style)
    factory = spec.env_factory(index)
    ret = retriever(rollout, setup.library) if setup.fmt.skills_section == "listed" else None
    config = RunnerConfig.of(rollout, temperature, top_p)
    if ret is None:  # an eval mode without a listing has nothing for pseudo-skills to retrieve
        config = dataclasses.replace(config, pseudo_skills=False)
    return EpisodeRunner(
        policy,
        factory,
        setup.library,
        setup.fmt,
        config,
        chat_template_kwargs=rollout.chat_template_kwargs(spec.states_thinking),
        skill_text=setup.skill_text,
        retriever=ret,
        hooks=spec.hooks() if spec.hooks is not None else None,
    )


def play_episodes(runner, specs: Sequence[EpisodeSpec], desc: str) -> list[Episode]:
    """`runner.run(specs)` with a progress bar of the episodes as they end."""
    from tqdm.auto import tqdm

    with tqdm(total=len(specs), desc=desc, unit="ep", dynamic_ncols=True) as bar:
        return runner.run(specs, progress=bar.update)


def rollout_row(spec: EpisodeSpec, episode: Episode, run: RunConfig, policy_id: str) -> dict:
    """The rollout row of `spec`'s played `episode` (sample and eval: `spec.meta` holds the task type
    and, for a sample, its index `k`)."""
    return Rollout.of_episode(
        episode,
        rollout_id=spec.episode_id,
        run=run.exp,
        round=run.round,
        task_id=spec.task_id,
        task_type=spec.meta["task_type"],
        sample_idx=spec.meta.get("k", 0),
        policy_id=policy_id,
        seed=spec.seed,
    ).to_row()
