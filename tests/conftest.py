"""Shared fixtures. The suite is offline: no hub, no wandb, one thread per process."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from selskill.envs import alfworld_gen  # noqa: E402


@pytest.fixture(scope="session")
def small_games(tmp_path_factory):
    """One generated train game per task type (small scenes), written like ALFWorld data."""
    root = tmp_path_factory.mktemp("games")
    alfworld_gen.generate_games(root, per_type=1, seed=0, split="train", size="small")
    return root
