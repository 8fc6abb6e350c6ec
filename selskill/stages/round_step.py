"""What every sharded stage of a round shares as a step: its sections, directory, ranks' completion and wandb log.

A stage's step holds the recipe sections it reads (`of`): the run section (where to report
included), its own (the recipe's field of the stage's name) and the seed, and for a stage that plays the policy
the policy and rollout sections too (`PolicyStep`). `run(rank, world_size)` computes that
rank through the run-directory contract (`selskill.data.rank_writer.run_rank`), then logs
the stage to wandb if this process finds every rank complete (`selskill.stages.wandb_log`):
whichever executor ran the ranks, the last one to finish logs.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

from selskill.config.rollout import RolloutConfig
from selskill.config.run import PolicyConfig, RunConfig
from selskill.data.layout import StageDir
from selskill.executors.base import Step
from selskill.stages.wandb_log import log_stage


@dataclass
class RoundStep(Step):
    """A sharded stage: `cfg` is its own recipe section, the recipe's field of the stage's name
    (`recipe.<name>`)."""

    run_config: RunConfig
    cfg: Any
    seed: int

    @classmethod
    def of(cls, recipe) -> RoundStep:
        return cls(recipe.run, getattr(recipe, cls.name), recipe.seed)

    @abstractmethod
    def compute(self, run: RunConfig) -> Any:
        """Rank `run.rank` of `run.world_size` of the stage (what `run` returns)."""

    def stage_names(self) -> list[str]:
        """The stage directories a rank writes, its own first (the eval: `eval` or `eval-<mode>`, and
        with `eval_headroom` its no-skills episodes')."""
        return [self.name]

    def stage_dir(self, name: str | None = None) -> StageDir:
        """Stage directory `name` (default: this stage's own) of the run section's round."""
        run = self.run_config
        return StageDir.of(run.runs_dir, run.exp, run.round, name or self.stage_names()[0])

    def at(self, rank: int, world_size: int) -> RunConfig:
        """The run section of rank `rank` of `world_size`."""
        return self.run_config.replace(rank=rank, world_size=world_size)

    def complete(self) -> bool:
        """Every rank's completion marker verifies, in every directory the stage writes."""
        ranks = range(self.run_config.world_size)
        return all(self.stage_dir(name).is_complete(r) for name in self.stage_names() for r in ranks)

    def log(self, run: RunConfig) -> None:
        """Log the stage to wandb once every rank of it is complete (the recipe's `report_to` permitting)."""
        log_stage(run, self.name)

    def run(self, rank: int = 0, world_size: int = 1) -> Any:
        run = self.at(rank, world_size)
        out = self.compute(run)
        self.log(run)
        return out


@dataclass(kw_only=True)
class PolicyStep(RoundStep):
    """A sharded stage that plays or scores with the policy (sample, branch, fork, eval)."""

    policy: PolicyConfig
    rollout: RolloutConfig

    @classmethod
    def of(cls, recipe) -> PolicyStep:
        return cls(
            recipe.run,
            getattr(recipe, cls.name),
            recipe.seed,
            policy=recipe.policy,
            rollout=recipe.rollout,
        )
