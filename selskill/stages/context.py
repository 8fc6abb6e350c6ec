"""Recipe sections shared by the stages that play episodes, and how they become objects.

Sampling, forking and evaluation must play with the same prompt, skill listing and
budgets (a fork continues an episode under the exact conditions it was sampled under), so
those knobs live in one `RolloutConfig` and one `make_runner`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from selskill.agent.action_choice import check_action_choice
from selskill.agent.eval_modes import prompt_setup
from selskill.agent.runner import EpisodeRunner, RunnerConfig
from selskill.agent.turn_format import TurnFormat
from selskill.config import PolicyConfig, RunConfig, check_at_least, check_choice
from selskill.data.layout import check_model_source, resolve_round_policy
from selskill.envs.alfworld import AlfworldEnv, GameIndex, find_games
from selskill.skills import load_alfworld_skills


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

    def __post_init__(self):
        check_action_choice(self.action_choice)
        from selskill.agent.turn_format import ADMISSIBLE_STYLES, STYLES
        from selskill.skills.listing import STYLES as LISTING_STYLES

        check_choice(self, "turn_style", STYLES)
        check_choice(self, "turn_admissible", ADMISSIBLE_STYLES)
        check_choice(self, "listing_style", LISTING_STYLES)
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

    def turn_format(self) -> TurnFormat:
        return TurnFormat(
            style=self.turn_style,
            show_admissible_commands=self.turn_show_admissible,
            admissible_style=self.turn_admissible,
            task_reminder=self.turn_task_reminder,
        )

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


def game_index(run: RunConfig, split: str) -> GameIndex:
    root = None if run.use_alfworld_data else run.games_dir
    return find_games(root, splits=split, grammar=run.alfworld_grammar)


def ensure_games(run: RunConfig, games: GamesConfig, splits=("train", "valid_seen", "valid_unseen")) -> None:
    """Generate the recipe's games once (skipped for real data or when already present)."""
    if run.use_alfworld_data:
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
    index: GameIndex,
    rollout: RolloutConfig,
    temperature: float,
    top_p: float = 1.0,
    mode: str = "skills",
):
    """`mode` is one of `selskill.agent.eval_modes.MODES`; only evaluation uses another than `skills`."""
    kwargs = {"enable_thinking": rollout.enable_thinking} if rollout.turn_style == "thinking" else None
    setup = prompt_setup(mode, load_alfworld_skills(), rollout.turn_format(), rollout.listing_style)
    return EpisodeRunner(
        policy,
        functools.partial(AlfworldEnv, index),  # picklable: episodes may run in a child process
        setup.library,
        setup.fmt,
        rollout.runner_config(temperature, top_p),
        chat_template_kwargs=kwargs,
        skill_text=setup.skill_text,
    )
