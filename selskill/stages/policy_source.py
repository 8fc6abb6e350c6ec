"""Which policy a stage plays, and loading it.

Round r samples (and branches and forks) with the policy it starts from, round r-1's
trained model or the init policy (`selskill.data.layout.resolve_round_policy`); round r's
eval plays round r's trained model. The recipe's policy section picks the backend.
"""

from __future__ import annotations

from selskill.config.rollout import RolloutConfig
from selskill.config.run import PolicyConfig, RunConfig
from selskill.data.layout import check_model_source, resolve_round_policy, round_dir
from selskill.policy.backends import open_policy
from selskill.policy.settings import backend_settings


def sampling_policy_path(run: RunConfig, pol: PolicyConfig) -> str:
    """Round r samples with the policy it starts from (see `resolve_round_policy`)."""
    return resolve_round_policy(run, pol)[0]


def eval_policy_path(run: RunConfig, must_exist: bool = True) -> str:
    """Round r evaluates round r's trained model; round 0 evaluates the init policy."""
    path = round_dir(run.runs_dir, run.exp, run.round) / "train" / "model"
    if must_exist and not path.is_dir():
        raise FileNotFoundError(f"no trained model at {path}: train round {run.round} first")
    return str(path)


def load_policy(pol: PolicyConfig, path: str, rollout: RolloutConfig, seed: int = 0):
    check_model_source(path, "the policy")
    return open_policy(path, backend_settings(pol, rollout, seed))
