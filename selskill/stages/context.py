"""Recipe sections shared by the stages that play episodes, and how they become objects.

Sampling, forking and evaluation must play with the same prompt, skill listing and
budgets (a fork continues an episode under the exact conditions it was sampled under), so
those knobs live in one `RolloutConfig` and one `make_runner`.

The recipe's `env` picks the benchmark. Everything a stage needs of it comes from here:
`game_index(run, split)` (ALFWorld's `GameIndex`, or a `BfclTaskIndex` of the same shape:
`games` records with `task_id` and `task_type`, `by_id`, `skipped`, `patched`),
`skill_library(env)`, `RolloutConfig.turn_format(env)` and `make_runner`, which reads the
env off the index. Task ids are `<split>/<id>` in both.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field

from selskill.agent.action_choice import check_action_choice
from selskill.agent.eval_modes import prompt_setup
from selskill.agent.runner import EpisodeRunner, RunnerConfig
from selskill.agent.turn_format import TurnFormat
from selskill.config import PolicyConfig, RunConfig, check_at_least, check_choice
from selskill.data.layout import check_model_source, resolve_round_policy
from selskill.envs.alfworld import AlfworldEnv, GameIndex, find_games
from selskill.skills import SkillLibrary, load_alfworld_skills, load_bfcl_skills


@dataclass
class GamesConfig:
    """Generated games (the offline default); ignored when use_alfworld_data is set."""

    games_size: str = field(
        default="small", metadata={"help": "generated scene size: tiny, small or real (the scale ladder)"}
    )
    games_train_per_type: int = field(default=4, metadata={"help": "generated train games per task type"})
    games_eval_per_type: int = field(
        default=4, metadata={"help": "generated valid_seen/valid_unseen games per type"}
    )
    games_unseen_per_type: int = field(
        default=-1, metadata={"help": "generated valid_unseen games per type (-1 = games_eval_per_type)"}
    )
    games_seed: int = field(
        default=0, metadata={"help": "generation seed (the same seed writes identical games)"}
    )

    def __post_init__(self):
        from selskill.envs.alfworld_gen import SIZES

        check_choice(self, "games_size", SIZES)
        check_at_least(self, 0, "games_train_per_type", "games_eval_per_type")
        check_at_least(self, -1, "games_unseen_per_type", why="-1 = games_eval_per_type")

    def per_type(self, split: str) -> int:
        if split == "train":
            return self.games_train_per_type
        if split == "valid_unseen" and self.games_unseen_per_type >= 0:
            return self.games_unseen_per_type
        return self.games_eval_per_type


@dataclass
class RolloutConfig:
    """How an episode is played and written (shared by sample, fork and eval)."""

    turn_style: str = field(
        default="compact", metadata={"help": "thinking (Qwen3) or compact (small policy)"}
    )
    turn_admissible: str = field(default="local", metadata={"help": "admissible commands shown: all | local"})
    turn_show_admissible: bool = field(
        default=True, metadata={"help": "append admissible commands to observations"}
    )
    turn_task_reminder: bool = field(
        default=False, metadata={"help": "repeat the task after every observation (small policies)"}
    )
    listing_style: str = field(default="compact", metadata={"help": "skill listing style: compact | full"})
    max_env_steps: int = field(default=50, metadata={"help": "environment-step budget of an episode"})
    max_turns: int = field(default=80, metadata={"help": "turn budget (memory skill calls take no env step)"})
    max_context_tokens: int = field(
        default=8192, metadata={"help": "episode ends with context_limit beyond this"}
    )
    max_new_tokens: int = field(default=96, metadata={"help": "tokens per assistant turn"})
    concurrent_episodes: int = field(
        default=32, metadata={"help": "episodes played at once (one batch per turn)"}
    )
    policy_batch_size: int = field(default=32, metadata={"help": "rows per forward pass of the hf backend"})
    env_overlap: bool = field(
        default=True,
        metadata={
            "help": "play episodes in a child process, half a batch at a time, so environments step while "
            "the policy generates (false: everything in this process)"
        },
    )
    action_choice: str = field(
        default="free",
        metadata={
            "help": "free: the policy writes any command | admissible: once a turn opens <action>, only "
            "admissible commands can follow (hf backend; skill calls stay free)"
        },
    )
    enable_thinking: bool = field(
        default=False, metadata={"help": "chat_template_kwargs enable_thinking (Qwen3)"}
    )
    turn_doc_style: str = field(
        default="compact",
        metadata={
            "help": "benchmark bfcl: function docs in the system prompt: compact | brief (no parameter notes) | json "
            "(BFCL's own rendering, 31-48k characters for two classes)"
        },
    )
    turn_examples: bool = field(
        default=True,
        metadata={"help": "benchmark bfcl: few-shot examples in the system prompt (the paper's App. G)"},
    )

    def __post_init__(self):
        check_action_choice(self.action_choice)
        from selskill.agent.turn_format import ADMISSIBLE_STYLES, STYLES
        from selskill.skills.listing import STYLES as LISTING_STYLES

        check_choice(self, "turn_style", STYLES)
        check_choice(self, "turn_admissible", ADMISSIBLE_STYLES)
        check_choice(self, "listing_style", LISTING_STYLES)
        from selskill.envs.bfcl import DOC_STYLES

        check_choice(self, "turn_doc_style", DOC_STYLES)
        check_at_least(
            self,
            1,
            "max_env_steps",
            "max_turns",
            "max_context_tokens",
            "max_new_tokens",
            "concurrent_episodes",
            "policy_batch_size",
        )

    def turn_format(self, env: str = "alfworld") -> TurnFormat:
        if env == "bfcl":
            from selskill.agent.bfcl import BfclTurnFormat

            return BfclTurnFormat(
                show_admissible_commands=self.turn_show_admissible,
                doc_style=self.turn_doc_style,
                examples=self.turn_examples,
            )
        return TurnFormat(
            style=self.turn_style,
            show_admissible_commands=self.turn_show_admissible,
            admissible_style=self.turn_admissible,
            task_reminder=self.turn_task_reminder,
        )

    def chat_template_kwargs(self, env: str = "alfworld") -> dict | None:
        """Qwen3's `enable_thinking` for thinking turns, and always on BFCL (non-thinking: false)."""
        if self.turn_style == "thinking" or env == "bfcl":
            return {"enable_thinking": self.enable_thinking}
        return None

    def runner_config(self, temperature: float, top_p: float = 1.0) -> RunnerConfig:
        return RunnerConfig(
            max_env_steps=self.max_env_steps,
            max_turns=self.max_turns,
            max_context_tokens=self.max_context_tokens,
            max_new_tokens=self.max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            concurrent_episodes=self.concurrent_episodes,
            listing_style=self.listing_style,
            env_overlap=self.env_overlap,
            action_choice=self.action_choice,
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
    setup = prompt_setup(mode, skill_library(env), rollout.turn_format(env), rollout.listing_style)
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
        rollout.runner_config(temperature, top_p),
        chat_template_kwargs=rollout.chat_template_kwargs(env),
        skill_text=setup.skill_text,
    )
