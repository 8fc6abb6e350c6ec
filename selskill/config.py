"""Recipe configuration: one flat YAML per recipe, parsed with `trl.TrlParser`.

Every entry point parses the whole recipe into the same set of dataclasses (one per stage,
each defined next to the code it configures), so any stage accepts any recipe, a key that
no dataclass knows fails loudly naming the key, and `--key value` on the command line
overrides the YAML. Field names are unique across the dataclasses (stage fields carry
their stage's prefix); the recipe-wide seed is TRL's `seed`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

BENCHMARKS = ("alfworld", "bfcl")
BFCL_SPLITS = ("train", "test")


@dataclass
class RunConfig:
    """Where a run lives and which part of it this process computes."""

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

    def __post_init__(self):
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank must satisfy 0 <= rank < world_size; got rank={self.rank}, world_size={self.world_size}"
            )
        if self.round < 0:
            raise ValueError(f"round must be >= 0; got {self.round}")
        from selskill.envs.alfworld_grammar import check_mode

        check_mode(self.alfworld_grammar)
        check_choice(self, "benchmark", BENCHMARKS)
        from selskill.envs.bfcl import CATEGORIES

        cats = self.categories
        if not cats or any(c not in CATEGORIES for c in cats) or len(set(cats)) != len(cats):
            raise bad_value(
                "bfcl_categories", self.bfcl_categories, f"a comma-separated list of {', '.join(CATEGORIES)}"
            )
        if not 0.0 <= self.bfcl_test_fraction <= 1.0:
            raise bad_value(
                "bfcl_test_fraction", self.bfcl_test_fraction, "in [0, 1]", "a share of scenarios"
            )
        try:
            kept = self.kept_scenarios
        except ValueError:
            kept = ()
        if kept == () or (kept and not all(0 <= i < 200 for i in kept)):
            raise bad_value("bfcl_scenarios", self.bfcl_scenarios, "comma-separated integers in [0, 200)")

    @property
    def kept_scenarios(self) -> tuple[int, ...] | None:
        """`bfcl_scenarios` as indices (None: every scenario)."""
        if not self.bfcl_scenarios.strip():
            return None
        return tuple(int(x) for x in str(self.bfcl_scenarios).split(",") if x.strip())

    def bfcl_split(self, split: str) -> tuple[int, ...]:
        """The scenario indices of BFCL split `split` ("train" | "test") that this run keeps."""
        from selskill.envs.bfcl import split_scenarios

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
        if self.benchmark == "bfcl":
            return BFCL_SPLITS
        from selskill.envs.alfworld import KNOWN_SPLITS

        return KNOWN_SPLITS


@dataclass
class PolicyConfig:
    """The model that samples: round r-1's model, or `model_name_or_path` for round 1."""

    model_name_or_path: str = field(
        default="",
        metadata={
            "help": "round-1 starting policy: a local directory or a hub id (hub only if you ask for it); "
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


def bad_value(key: str, value: object, rule: str, why: str = "") -> ValueError:
    """The error of a recipe key with a bad value: the key, the rule, the value, and where to fix it."""
    return ValueError(
        f"{key} must be {rule}; got {value!r}{f' ({why})' if why else ''}. Fix `{key}:` in the recipe or "
        f"pass --{key} VALUE"
    )


def check_at_least(cfg, minimum: float, *keys: str, why: str = "") -> None:
    for key in keys:
        value = getattr(cfg, key)
        if value < minimum:
            raise bad_value(key, value, f">= {minimum}", why)


def check_choice(cfg, key: str, choices: Sequence[str], why: str = "") -> None:
    value = getattr(cfg, key)
    if value not in choices:
        raise bad_value(key, value, f"one of {', '.join(map(str, choices))}", why)


def check_unit(cfg, *keys: str) -> None:
    """Nucleus-sampling keys: 0 < value <= 1."""
    for key in keys:
        value = getattr(cfg, key)
        if not 0 < value <= 1:
            raise bad_value(key, value, "in (0, 1]", "nucleus sampling mass; 1 = off")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def changed_settings(old: dict, new: dict) -> list[str]:
    """`key: old -> new` for every (nested, dotted) key whose value differs; `(none)` where one lacks it."""
    a, b = _flatten(old), _flatten(new)
    return [
        f"{k}: {a.get(k, '(none)')!r} -> {b.get(k, '(none)')!r}"
        for k in sorted(set(a) | set(b))
        if a.get(k, "(none)") != b.get(k, "(none)")
    ]


def recipe_dataclasses() -> tuple[type, ...]:
    """Every dataclass a recipe is parsed into (each defined next to the stage it configures)."""
    from selskill.policy.init_sft import InitConfig
    from selskill.stages.branch import BranchConfig
    from selskill.stages.context import GamesConfig, RolloutConfig
    from selskill.stages.evaluate import EvalConfig
    from selskill.stages.fork import ForkConfig
    from selskill.stages.label import LabelConfig
    from selskill.stages.sample import SampleConfig
    from selskill.train.config import TrainConfig

    return (
        RunConfig,
        PolicyConfig,
        GamesConfig,
        RolloutConfig,
        InitConfig,
        SampleConfig,
        BranchConfig,
        ForkConfig,
        LabelConfig,
        TrainConfig,
        EvalConfig,
    )


class Recipe:
    """A parsed recipe: one attribute per stage section, `seed` is the recipe-wide seed."""

    _NAMES = {
        "RunConfig": "run",
        "PolicyConfig": "policy",
        "GamesConfig": "games",
        "RolloutConfig": "rollout",
        "InitConfig": "init",
        "SampleConfig": "sample",
        "BranchConfig": "branch",
        "ForkConfig": "fork",
        "LabelConfig": "label",
        "TrainConfig": "train",
        "EvalConfig": "eval",
    }

    def __init__(self, sections):
        self.sections = list(sections)
        for s in self.sections:
            setattr(self, self._NAMES.get(type(s).__name__, type(s).__name__), s)

    @property
    def seed(self) -> int:
        return int(self.train.seed)


def parse_recipe(argv: Sequence[str] | None = None, dataclass_types: Sequence[type] | None = None):
    """Parse `--config RECIPE` plus `--key value` overrides into the recipe dataclasses."""
    from trl import TrlParser

    types = tuple(dataclass_types or recipe_dataclasses())
    parser = _quiet_errors(TrlParser(types))
    argv = list(argv) if argv is not None else None
    check_recipe_file(argv)
    try:
        sections = parser.parse_args_and_config(args=argv)
    except ValueError as exc:
        if "Unknown arguments from config file" in str(exc):
            known = sorted({f.name for t in types for f in dataclasses.fields(t)})
            raise ValueError(
                f"{exc}\nValid keys include: {', '.join(k for k in known if not k.startswith('_'))[:2000]}"
            ) from None
        raise
    check_sections(sections)
    return sections


def check_sections(sections: Sequence) -> None:
    """The rules that span recipe sections (each section checks its own keys when it is built)."""
    by_name = {type(s).__name__: s for s in sections}
    run, rollout = by_name.get("RunConfig"), by_name.get("RolloutConfig")
    sample, evaluation = by_name.get("SampleConfig"), by_name.get("EvalConfig")
    if run is None:
        return
    splits = run.splits
    if evaluation is not None and any(s not in splits for s in evaluation.splits):
        raise bad_value(
            "eval_splits",
            evaluation.eval_splits,
            f"a comma-separated list of {', '.join(splits)}",
            f"benchmark: {run.benchmark}",
        )
    if run.benchmark != "bfcl":
        return
    if sample is not None and sample.sample_split not in splits:
        raise bad_value("sample_split", sample.sample_split, f"one of {', '.join(splits)}", "benchmark: bfcl")
    if rollout is not None and rollout.action_choice != "free":
        raise bad_value(
            "action_choice",
            rollout.action_choice,
            "free with benchmark: bfcl",
            "admissible-action decoding needs a finite list of complete commands; a BFCL action is a call "
            "list whose arguments are open-ended literals, and BFCL's admissible commands are function names only",
        )
    if rollout is not None and rollout.turn_style != "compact":
        raise bad_value(
            "turn_style",
            rollout.turn_style,
            "compact with benchmark: bfcl",
            "BFCL turns are non-thinking (the paper's App. G)",
        )
    init = by_name.get("InitConfig")
    if init is not None:
        check_at_least(init, 0, "init_bfcl_tasks", why="0 = every task of the train split")
        try:
            init.bfcl_demo_mix()
        except ValueError as exc:
            raise ValueError(f"{exc}. Fix it in the recipe or pass --KEY VALUE") from None


def check_recipe_file(argv: Sequence[str] | None) -> None:
    """`--config PATH` must exist: say so, with the recipes there are, before any parsing."""
    import sys
    from pathlib import Path

    args = list(sys.argv[1:] if argv is None else argv)
    paths = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"]
    paths += [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
    for path in paths:
        if not Path(path).is_file():
            where = Path(path).parent
            found = sorted(str(p) for p in where.glob("*.yaml")) if where.is_dir() else []
            raise ValueError(
                f"recipe {path} does not exist"
                + (
                    f"; recipes in {where}/: {', '.join(found)}"
                    if found
                    else " (paths are relative to where you run)"
                )
            )


def load_recipe(argv: Sequence[str] | None = None) -> Recipe:
    """`parse_recipe` wrapped as a `Recipe` (what every entry point uses)."""
    return Recipe(parse_recipe(argv))


def _quiet_errors(parser):
    """Bad command-line values print the one line that matters, not the usage of every recipe key."""

    def error(message: str):
        parser.exit(2, f"{parser.prog}: error: {message}\n(`--help` lists every recipe key)\n")

    parser.error = error
    return parser


def make_parser():
    """The TrlParser over every recipe dataclass (`--help` of any stage lists every key)."""
    from trl import TrlParser

    return _quiet_errors(TrlParser(recipe_dataclasses()))


def run_entry(stage_fn, argv: Sequence[str] | None = None) -> int:
    """Parse the recipe and run `stage_fn(recipe)`; bad input exits 2, missing upstream outputs or a
    refused rank (another writer, recorded inputs that differ) 1."""
    import sys

    try:
        recipe = load_recipe(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from selskill.stages.common import StageRefused

    try:
        stage_fn(recipe)
    except (FileNotFoundError, StageRefused) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
