"""The sections of the round's stages: sample, branch, fork, label and eval (each key carries its
stage's prefix, so that the sections share one flat recipe)."""

from __future__ import annotations

from dataclasses import dataclass

from selskill.config.checks import bad_value, check_at_least, check_choice, check_unit
from selskill.config.keys import key
from selskill.config.names import EVAL_MODES

BRANCH_STRATEGIES: tuple[str, ...] = ("entropy", "random", "all_skill")
BRANCH_SCORES: tuple[str, ...] = ("mean_first_m", "decision")
LABEL_KINDS: tuple[str, ...] = ("both", "episode", "local")
LABEL_ARM_RULES: tuple[str, ...] = ("best", "success_rate")


@dataclass
class SampleConfig:
    _argument_group_name = "sample"  # its heading in `--help`

    sample_k: int = key(10, "rollouts per task (the paper: 10)")
    sample_split: str = key("train", "task split to sample on")
    sample_max_tasks: int = key(0, "use only the first N tasks (0 = all)")
    sample_temperature: float = key(1.0, "sampling temperature")
    sample_top_p: float = key(1.0, "nucleus sampling")

    def __post_init__(self):
        check_at_least(self, 1, "sample_k", why="rollouts per task; the paper uses 10")
        check_at_least(self, 0, "sample_max_tasks", why="0 = every task of the split")
        check_at_least(self, 0, "sample_temperature", why="0 = greedy")
        check_unit(self, "sample_top_p")


@dataclass
class BranchConfig:
    _argument_group_name = "branch"  # its heading in `--help`

    branch_strategy: str = key("entropy", "entropy | random | all_skill")
    branch_top_post_skill: int = key(3, "points per rollout from turns that invoked a skill")
    branch_top_ordinary: int = key(3, "points per rollout from ordinary action turns")
    branch_score: str = key("mean_first_m", "mean_first_m | decision")
    branch_score_m: int = key(10, "m of mean_first_m (the paper: 10)")

    def __post_init__(self):
        check_choice(self, "branch_strategy", BRANCH_STRATEGIES)
        check_choice(self, "branch_score", BRANCH_SCORES)
        check_at_least(
            self, 0, "branch_top_post_skill", "branch_top_ordinary", why="points per rollout; 0 = none"
        )
        check_at_least(self, 1, "branch_score_m", why="the paper uses 10")


@dataclass
class ForkConfig:
    _argument_group_name = "fork"  # its heading in `--help`

    fork_k_invoke: int = key(2, "continuations per branch point that invoke the skill")
    fork_k_skip: int = key(2, "continuations per branch point that skip it")
    fork_temperature: float = key(1.0, "sampling temperature after the fork")
    fork_top_p: float = key(1.0, "nucleus sampling after the fork")

    def __post_init__(self):
        check_at_least(
            self,
            1,
            "fork_k_invoke",
            "fork_k_skip",
            why="a local pair compares the best invoke with the best skip continuation of a branch point; "
            "for episode pairs only, set label_kinds: episode",
        )
        check_at_least(self, 0, "fork_temperature", why="0 = greedy")
        check_unit(self, "fork_top_p")


@dataclass
class LabelConfig:
    _argument_group_name = "label"  # its heading in `--help`

    label_episode_max_rejected: int = key(3, "failures paired with a task's best success")
    label_kinds: str = key(
        "both",
        "pair kinds to compute: both | episode | local. It decides what label reads, not what is "
        "trained: `episode` needs no branch or fork stage (a recipe without forks). Which of the written "
        "pairs are trained, and in what mix, is the train section's (train_pair_kinds, train_local_fraction)",
    )
    label_arm_rule: str = key(
        "best",
        "which arm of a branch point wins a local pair: best (the reference's) = the better of each "
        "arm's best continuation (success, then fewer steps after the branch) | success_rate = the arm with "
        "the higher share of successful continuations; equal shares above 0 fall back to the efficiency of "
        "the arms' best successes, both 0 drop the point. Either way the pair is the winning arm's best "
        "continuation vs the losing arm's",
    )

    def __post_init__(self):
        check_choice(self, "label_kinds", LABEL_KINDS)
        check_choice(self, "label_arm_rule", LABEL_ARM_RULES)
        check_at_least(
            self, 1, "label_episode_max_rejected", why="failures paired with a task's best success"
        )


@dataclass
class EvalConfig:
    _argument_group_name = "eval"  # its heading in `--help`

    eval_splits: str = key(
        "", "comma-separated splits to evaluate on (empty: the benchmark's held-out splits)"
    )
    eval_max_tasks: int = key(0, "first N tasks of each split (0 = all)")
    eval_temperature: float = key(0.0, "0 = greedy (the paper)")
    eval_bootstrap: int = key(1000, "bootstrap resamples for the 95 percent intervals")
    eval_mode: str = key(
        "skills",
        "skills (the method's setting) | no_skills | skills_as_context | conservative | "
        "explicit_skip: the paper's Appendix D baselines | listing_noise: every skill of the benchmark's "
        "library padded with distractors to eval_listing_size (App. F) | capability_check: SkillDreamer's "
        "SUBGOAL/EVIDENCE/CAPABILITY/DECISION/NEXT check in each turn's think block, with its compliance "
        "in metrics.json; a round writes mode M to eval-M/ "
        "(listing_noise to eval-listing_noise-<size>/)",
    )
    eval_listing_size: int = key(
        68,
        "eval_mode listing_noise: skills listed, the benchmark's own plus seeded distractors "
        "(the paper's App. F pads 18 skills to 28 | 38 | 68)",
    )
    eval_headroom: bool = key(
        False,
        "also play the first eval split's tasks without skills (eval_mode no_skills) and write the "
        "skills' headroom into metrics.json: per task, won with vs without the skills listed (the paper's "
        "App. B); a round keeps those episodes in <eval stage>-headroom/",
    )

    def __post_init__(self):
        if self.eval_mode not in EVAL_MODES:
            raise ValueError(f"eval_mode {self.eval_mode!r} is not one of: {', '.join(EVAL_MODES)}")
        check_at_least(self, 0, "eval_max_tasks", why="0 = every task of each split")
        check_at_least(self, 0, "eval_temperature", why="0 = greedy, the paper's setting")
        check_at_least(self, 1, "eval_bootstrap", why="resamples of the 95 percent intervals")
        check_at_least(self, 1, "eval_listing_size", why="skills listed in eval_mode listing_noise")
        if self.eval_headroom and self.eval_mode == "no_skills":
            raise bad_value(
                "eval_headroom",
                self.eval_headroom,
                "false with eval_mode no_skills",
                why="the headroom compares the eval mode's skills with none: pick a mode with skills",
            )

    @property
    def stage(self) -> str:
        """The round's stage directory for this mode: `eval`, or `eval-<mode>` for a baseline.

        Listing-noise sizes get a directory each, so the App. F study's sizes sit side by side
        in one round instead of replacing each other.
        """
        if self.eval_mode == "listing_noise":
            return f"eval-listing_noise-{self.eval_listing_size}"
        return "eval" if self.eval_mode == "skills" else f"eval-{self.eval_mode}"

    @property
    def splits(self) -> list[str]:
        return [s.strip() for s in self.eval_splits.split(",") if s.strip()]

    @property
    def headroom_stage(self) -> str:
        """Where a round keeps the no-skills episodes of `eval_headroom`: next to its eval stage,
        not in it, so that the eval stage's rows stay one episode per task in its own mode."""
        return f"{self.stage}-headroom"
