"""How the recipe's rollout and games sections become objects for the stages that play episodes.

Sampling, forking and evaluation must play with the same prompt, skill listing and
budgets (a fork continues an episode under the exact conditions it was sampled under), so
those knobs live in one `RolloutConfig` (`selskill.config.rollout`) and one `make_runner`.

The recipe's `env` picks the benchmark. Everything a stage needs of it comes from here:
`game_index(run, split)` (ALFWorld's `GameIndex`, or a `BfclTaskIndex` of the same shape:
`games` records with `task_id` and `task_type`, `by_id`, `skipped`, `patched`),
`skill_library(env)`, `turn_format(rollout, env)` and `make_runner`, which reads the
env off the index. Task ids are `<split>/<id>` in both.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field

from selskill.agent.eval_modes import prompt_setup
from selskill.agent.runner import EpisodeRunner, RunnerConfig
from selskill.agent.turn_format import TurnFormat
from selskill.config.rollout import GamesConfig, RolloutConfig
from selskill.config.run import PolicyConfig, RunConfig
from selskill.data.layout import check_model_source, resolve_round_policy
from selskill.envs.alfworld import AlfworldEnv, GameIndex, find_games
from selskill.skills import SkillLibrary, load_alfworld_skills, load_bfcl_skills


def turn_format(rollout: RolloutConfig, env: str = "alfworld") -> TurnFormat:
    """The turn format the rollout section asks for on benchmark `env`."""
    if env == "bfcl":
        from selskill.agent.bfcl import BfclTurnFormat

        return BfclTurnFormat(
            show_admissible_commands=rollout.turn_show_admissible,
            doc_style=rollout.turn_doc_style,
            examples=rollout.turn_examples,
        )
    return TurnFormat(
        style=rollout.turn_style,
        show_admissible_commands=rollout.turn_show_admissible,
        admissible_style=rollout.turn_admissible,
        task_reminder=rollout.turn_task_reminder,
    )


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


@dataclass(frozen=True)
class TaskRecord:
    task_id: str  # <split>/<BFCL id>
    task_type: str  # the BFCL category: metrics per task type are metrics per category


@dataclass
class BfclTaskIndex:
    """The BFCL tasks of one split, in the shape the stages read from ALFWorld's `GameIndex`."""

    split: str
    categories: tuple[str, ...]
    scenarios: tuple[int, ...]
    withheld_callable: bool = False
    games: list[TaskRecord] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)  # nothing is skipped: every task plays
    patched: int = 0

    def by_id(self) -> dict[str, TaskRecord]:
        return {g.task_id: g for g in self.games}

    def summary(self) -> str:
        return f"{len(self.games)} BFCL tasks ({', '.join(self.categories)}) in split {self.split}"

    def env_factory(self):
        """A picklable factory (episodes may run in a child process, which loads the tasks itself)."""
        from selskill.envs.bfcl import BfclEnv

        return functools.partial(
            BfclEnv,
            categories=self.categories,
            scenarios=self.scenarios,
            withheld_callable=self.withheld_callable,
            id_prefix=f"{self.split}/",
        )


def bfcl_index(run: RunConfig, split: str) -> BfclTaskIndex:
    """Split `split` ("train" | "test") of the recipe's BFCL categories, by scenario index."""
    from selskill.envs.bfcl import load_tasks

    if split not in run.splits:
        raise ValueError(f"unknown BFCL split {split!r}; choose from {', '.join(run.splits)}")
    scenarios = run.bfcl_split(split)
    tasks = load_tasks(run.categories, scenarios)
    return BfclTaskIndex(
        split,
        run.categories,
        scenarios,
        run.bfcl_withheld_callable,
        [TaskRecord(f"{split}/{t.id}", t.category) for t in tasks],
    )


def game_index(run: RunConfig, split: str) -> GameIndex | BfclTaskIndex:
    if run.benchmark == "bfcl":
        return bfcl_index(run, split)
    root = None if run.use_alfworld_data else run.games_dir
    return find_games(root, splits=split, grammar=run.alfworld_grammar)


def skill_library(env: str = "alfworld") -> SkillLibrary:
    """The skills shipped for `env` (the paper's mixes: 10 for ALFWorld, 18 for BFCL)."""
    return load_bfcl_skills() if env == "bfcl" else load_alfworld_skills()


def ensure_games(run: RunConfig, games: GamesConfig, splits=("train", "valid_seen", "valid_unseen")) -> None:
    """Generate the recipe's games once (skipped for real data, BFCL, or when already present)."""
    if run.use_alfworld_data or run.benchmark != "alfworld":
        return
    from pathlib import Path

    from selskill.envs.alfworld_gen import generate_games

    for split in splits:
        per_type = games.per_type(split)
        marker = Path(run.games_dir) / f".{split}-{games.games_size}-{per_type}-{games.games_seed}.done"
        if per_type <= 0 or marker.exists():
            continue
        generate_games(
            run.games_dir,
            per_type=per_type,
            seed=games.games_seed,
            split=split,
            size=games.games_size,
            progress=True,
        )
        marker.write_text("ok\n")


def make_runner(
    policy,
    index: GameIndex | BfclTaskIndex,
    rollout: RolloutConfig,
    temperature: float,
    top_p: float = 1.0,
    mode: str = "skills",
):
    """`mode` is one of `selskill.agent.eval_modes.MODES`; only evaluation uses another than `skills`.

    The env is the index's: a `BfclTaskIndex` plays BFCL (its own host, turn format and skills).
    """
    env = "bfcl" if isinstance(index, BfclTaskIndex) else "alfworld"
    setup = prompt_setup(mode, skill_library(env), turn_format(rollout, env), rollout.listing_style)
    if env == "bfcl":
        from selskill.agent.bfcl import BfclEpisodeRunner

        runner_class, factory = BfclEpisodeRunner, index.env_factory()
    else:  # picklable: episodes may run in a child process
        runner_class, factory = EpisodeRunner, functools.partial(AlfworldEnv, index)
    return runner_class(
        policy,
        factory,
        setup.library,
        setup.fmt,
        runner_config(rollout, temperature, top_p),
        chat_template_kwargs=rollout.chat_template_kwargs(env),
        skill_text=setup.skill_text,
    )
