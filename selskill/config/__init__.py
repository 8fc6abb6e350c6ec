"""Recipe configuration: one flat YAML per recipe, parsed with `trl.TrlParser`.

A recipe is parsed into one dataclass per section, all defined in this package, which
imports of selskill only the layers below it (`selskill.registry`, to find each benchmark's
own section, and `selskill.monitor.logs`, to apply `log_level`): the stages, the init builders and
the trainer import their section from here, never the reverse, so parsing a recipe loads
none of the code it configures.

Every recipe key is one field of one section (`selskill.config.keys.recipe_fields`; field
names are unique across the sections, each carrying its section's prefix), a key that no
section knows fails loudly naming the key, and `--key value` on the command line overrides
the YAML. The train section is TRL's DPOConfig, so it holds TRL fields that are keys of other
sections; `selskill.config.train.OWNED_ELSEWHERE` maps each to its owner, whose value the
field takes at parse time: the recipe-wide `seed`, and the run-wide `report_to` and
`log_level`, are the run section's keys.

An entry point parses once (`load_recipe`, or `parse_sections` with the sections it
needs) and hands the parsed sections on.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from selskill.config.checks import bad_value, check_at_least, check_choice, check_types, check_unit
from selskill.config.executor import ExecutorConfig
from selskill.config.init import InitConfig
from selskill.config.keys import recipe_fields
from selskill.config.rollout import RolloutConfig
from selskill.config.run import PolicyConfig, RunConfig
from selskill.config.stages import BranchConfig, EvalConfig, ForkConfig, LabelConfig, SampleConfig

if TYPE_CHECKING:
    from selskill.config.train import TrainConfig


def core_dataclasses() -> tuple[type, ...]:
    """The core's sections, in `Recipe` order (the train section imports TRL)."""
    from selskill.config.train import TrainConfig

    return (
        RunConfig,
        PolicyConfig,
        ExecutorConfig,
        RolloutConfig,
        InitConfig,
        SampleConfig,
        BranchConfig,
        ForkConfig,
        LabelConfig,
        TrainConfig,
        EvalConfig,
    )


def recipe_dataclasses() -> tuple[type, ...]:
    """Every section a recipe is parsed into: the core's, then each registered benchmark's own
    (`selskill.registry`: a recipe may set the keys of any, the one it names is used)."""
    from selskill.registry import settings_sections

    return core_dataclasses() + settings_sections()


@dataclass
class Recipe:
    """A parsed recipe: one field per core section, and the benchmark's own section as
    `run.benchmark_settings` (`settings`); `argv`, when parsed from one, is its command line
    (processes that must parse for themselves rebuild it from there)."""

    run: RunConfig
    policy: PolicyConfig
    executor: ExecutorConfig
    rollout: RolloutConfig
    init: InitConfig
    sample: SampleConfig
    branch: BranchConfig
    fork: ForkConfig
    label: LabelConfig
    train: TrainConfig
    eval: EvalConfig
    argv: tuple[str, ...] | None = field(default=None, compare=False)

    @classmethod
    def of(cls, sections: Sequence, argv: Sequence[str] | None = None) -> Recipe:
        """The recipe of parsed `sections` (one of each `recipe_dataclasses()` type, in any order)."""
        by_type = {type(s): s for s in sections}
        missing = [t.__name__ for t in recipe_dataclasses() if t not in by_type]
        if missing:
            raise ValueError(f"a Recipe needs every section; missing: {', '.join(missing)}")
        return cls(*(by_type[t] for t in core_dataclasses()), argv=tuple(argv) if argv is not None else None)

    @property
    def settings(self):
        """The recipe's benchmark's own section (None for a benchmark without one)."""
        return self.run.benchmark_settings

    @property
    def seed(self) -> int:
        """The recipe-wide seed (the run section's `seed`)."""
        return int(self.run.seed)

    def with_run(self, **changes) -> Recipe:
        """This recipe with run keys replaced (e.g. one rank of a sharded stage)."""
        return dataclasses.replace(self, run=self.run.replace(**changes))


def make_parser(dataclass_types: Sequence[type] | None = None, **kwargs):
    """The TrlParser over the recipe's sections (all by default); `--help` lists the keys by section
    (each section's `_argument_group_name`). `kwargs` are argparse's (`prog`: the command, as in
    TRL's scripts' `make_parser(prog=)`).

    Abbreviated keys are refused: in one flat recipe a prefix may name a key of another
    section than the one a reader expects.
    """
    types = tuple(dataclass_types or recipe_dataclasses())
    return _checked_types(_quiet_errors(_recipe_parser()(types, **{"allow_abbrev": False, **kwargs})), types)


def _recipe_parser() -> type:
    """TrlParser over each section's recipe keys (`recipe_fields`), not every field of its dataclass.

    HfArgumentParser adds an option for every field and builds each section from every field of
    its name: the train section's TRL fields that are other sections' keys would be second
    options. Here only recipe keys become options, and a field another section owns (a
    section's `_owned_elsewhere`: field -> owning section) takes the owner's value as parsed.
    The owners come first in `recipe_dataclasses()`, and in every partial parse.
    """
    from transformers.hf_argparser import get_type_hints
    from trl import TrlParser

    class RecipeParser(TrlParser):
        def _add_dataclass_arguments(self, dtype):
            name = getattr(dtype, "_argument_group_name", None)
            group = self.add_argument_group(name) if name else self
            hints = get_type_hints(dtype)
            for f in recipe_fields(dtype):
                f.type = hints[f.name]  # resolved as HfArgumentParser resolves it
                self._parse_dataclass_field(group, f)

        def parse_args_into_dataclasses(self, args=None, return_remaining_strings=False, **_):
            namespace, rest = self.parse_known_args(args=args)
            values, built = vars(namespace), {}
            for dtype in self.dataclass_types:
                keys = {f.name: values[f.name] for f in recipe_fields(dtype)}
                owned = getattr(dtype, "_owned_elsewhere", {})
                keys |= {k: getattr(built[owner], k) for k, owner in owned.items() if owner in built}
                built[dtype.__name__] = dtype(**keys)
            sections = tuple(built.values())
            return (*sections, rest) if return_remaining_strings else sections

    return RecipeParser


def parse_sections(argv: Sequence[str] | None = None, dataclass_types: Sequence[type] | None = None) -> tuple:
    """Parse `--config RECIPE` plus `--key value` overrides into `dataclass_types` (default: all).

    With only some sections (the train stage parses run, policy and train), the keys of the
    others are accepted and ignored, and their values not checked; a key of no section still
    fails, naming it.
    """
    every = recipe_dataclasses()
    types = tuple(dataclass_types or every)
    parser = make_parser(types)
    argv = list(argv) if argv is not None else None
    check_recipe_file(argv)
    check_removed_keys(argv)
    known = {f.name for t in every for f in recipe_fields(t)}
    *sections, from_file, from_args = parser.parse_args_and_config(
        args=argv, return_remaining_strings=True, separate_remaining_strings=True
    )
    # a partial parse leaves the other sections' keys; a whole one leaves only what no section has
    _check_leftovers(from_file, from_args, known if set(types) != set(every) else set(), argv)
    sections = tuple(sections)
    attach_settings(sections)
    check_sections(sections)
    _apply_log_level(sections)
    return sections


def _apply_log_level(sections: Sequence) -> None:
    """The recipe's `log_level` from here on: every process of a run parses its recipe (stage workers and
    relaunched trainers rebuild it from its command line), so each says as much as the user asked for."""
    from selskill.monitor.logs import configure

    for section in sections:
        if isinstance(section, RunConfig):
            configure(section.log_level)


def _check_leftovers(
    from_file: list[str], from_args: list[str], other: set[str], argv: list[str] | None
) -> None:
    """What the parse left over must be keys of the sections not built (`other`) and their values."""

    def unknown(rest: list[str]) -> list[str]:
        return [
            s[2:].split("=", 1)[0] for s in rest if s.startswith("--") and s[2:].split("=", 1)[0] not in other
        ]

    paths = _config_paths(list(sys.argv[1:] if argv is None else argv))
    for rest, where in (
        (from_file, f"in {paths[0] if paths else 'the recipe'}"),
        (from_args, "on the command line"),
    ):
        if bad := unknown(rest):
            raise _unknown_keys(bad, where)
    if not other and from_args:
        raise ValueError(
            f"unexpected value on the command line: {' '.join(from_args)} (values follow a --key)"
        )


def _unknown_keys(keys: Sequence[str], where: str) -> ValueError:
    """One line: each unknown key with the valid keys closest to it."""
    import difflib

    from selskill.config.train import NOT_RECIPE_KEYS

    valid = sorted(
        {f.name for t in recipe_dataclasses() for f in recipe_fields(t) if not f.name.startswith("_")}
    )
    parts = []
    for key in keys:
        close = difflib.get_close_matches(key, valid, n=3)
        if key in NOT_RECIPE_KEYS:  # a TRL ModelConfig key a TRL user may expect here
            parts.append(f"{key} (TRL's ModelConfig key; here {NOT_RECIPE_KEYS[key]})")
        else:
            parts.append(f"{key} (did you mean {' or '.join(close)}?)" if close else key)
    s = "s" if len(keys) > 1 else ""
    return ValueError(f"unknown recipe key{s} {where}: {', '.join(parts)}; `--help` lists every key")


def attach_settings(sections: Sequence) -> None:
    """Hand the run section its benchmark's own section, when both were parsed, and fill in what the
    benchmark decides for keys left empty (`eval_splits`: its held-out splits)."""
    from selskill.registry import benchmark

    by_type = {type(s): s for s in sections}
    run = by_type.get(RunConfig)
    if run is None:
        return
    spec = benchmark(run.benchmark)
    if spec.settings is not None and spec.settings in by_type:
        run.benchmark_settings = by_type[spec.settings]
    evaluation = by_type.get(EvalConfig)
    if evaluation is not None and not evaluation.splits:
        evaluation.eval_splits = ",".join(spec.held_out)


def check_sections(sections: Sequence) -> None:
    """The rules that span recipe sections (each section checks its own keys when it is built)."""
    by_name = {type(s).__name__: s for s in sections}
    run, rollout = by_name.get("RunConfig"), by_name.get("RolloutConfig")
    evaluation = by_name.get("EvalConfig")
    if run is None:
        return
    from selskill.registry import benchmark

    spec = benchmark(run.benchmark)
    splits = spec.splits(run.benchmark_settings)
    if evaluation is not None and any(s not in splits for s in evaluation.splits):
        raise bad_value(
            "eval_splits",
            evaluation.eval_splits,
            f"a comma-separated list of {', '.join(splits)}",
            f"benchmark: {run.benchmark}",
        )
    sample = by_name.get("SampleConfig")
    if sample is not None and sample.sample_split not in splits:
        raise bad_value(
            "sample_split", sample.sample_split, f"one of {', '.join(splits)}", f"benchmark: {run.benchmark}"
        )
    if (
        evaluation is not None
        and rollout is not None
        and evaluation.eval_mode == "listing_noise"
        and (rollout.retrieval_mode != "all" or rollout.retrieval_library_size != 0)
    ):
        raise bad_value(
            "eval_mode",
            evaluation.eval_mode,
            "used with retrieval_mode: all and retrieval_library_size: 0",
            "listing_noise lists every skill of the library it pads to eval_listing_size; a second padding "
            "or a retrieval would measure something else",
        )
    if spec.check_recipe is not None:
        spec.check_recipe(by_name)


# Keys that no longer exist, with what replaces them: an old recipe fails naming its key and the fix
# instead of the generic "unknown argument".
REMOVED_KEYS = {
    "label_episode_fraction": "kinds are mixed in one place, the train section: label writes every pair it "
    "finds. Remove it and set train_local_fraction (the share of local pairs, 1 - the old value) instead; "
    "for one kind only, train_pair_kinds: episode or local",
    "max_turns": "rename it max_decisions, the episode's step budget: every decision (an action, a skill call, "
    "a malformed turn) is one step; max_env_steps only caps environment commands",
}


def _config_paths(args: list[str]) -> list[str]:
    paths = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"]
    return paths + [a.split("=", 1)[1] for a in args if a.startswith("--config=")]


def check_removed_keys(argv: Sequence[str] | None) -> None:
    """Refuse a key of REMOVED_KEYS in the recipe file or on the command line, naming its replacement
    (reading the file first refuses one that is not a well-formed mapping of distinct keys)."""
    from selskill.config.recipe_file import read_recipe

    args = list(sys.argv[1:] if argv is None else argv)
    used = {a[2:].split("=", 1)[0] for a in args if a.startswith("--")}
    for path in _config_paths(args):
        used |= set(read_recipe(path))
    for key in sorted(used & set(REMOVED_KEYS)):
        raise ValueError(f"recipe key {key} was removed: {REMOVED_KEYS[key]}")


def check_recipe_file(argv: Sequence[str] | None) -> None:
    """`--config PATH` must exist: say so, with the recipes there are, before any parsing."""
    args = list(sys.argv[1:] if argv is None else argv)
    for path in _config_paths(args):
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
    """The whole recipe, parsed once (what every entry point that runs more than training uses)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return Recipe.of(parse_sections(argv), argv=argv)


def _checked_types(parser, types: Sequence[type]):
    """Every parsed value checked against its field's type before any section is built
    (`checks.check_types`): argparse converts only strings, so a YAML list, bool or 2.7, or a
    nan from either place, would otherwise reach the section as it is."""
    parse_known_args = parser.parse_known_args
    own: dict = {}  # what the parser gives a key nobody set (TRL's `debug`: None): its code's own default
    for action in parser._actions:
        own.setdefault(action.dest, action.default)

    def checked(args=None, namespace=None):
        namespace, rest = parse_known_args(args, namespace)
        check_types(types, vars(namespace), own)
        return namespace, rest

    parser.parse_known_args = checked
    return parser


def _quiet_errors(parser):
    """Bad command-line values print the one line that matters, not the usage of every recipe key."""

    def error(message: str):
        parser.exit(2, f"{parser.prog}: error: {message}\n(`--help` lists every recipe key)\n")

    parser.error = error
    return parser


__all__ = [
    "BranchConfig",
    "EvalConfig",
    "ExecutorConfig",
    "ForkConfig",
    "InitConfig",
    "LabelConfig",
    "PolicyConfig",
    "Recipe",
    "RolloutConfig",
    "RunConfig",
    "SampleConfig",
    "bad_value",
    "check_at_least",
    "check_choice",
    "check_recipe_file",
    "check_sections",
    "check_unit",
    "core_dataclasses",
    "load_recipe",
    "make_parser",
    "parse_sections",
    "recipe_dataclasses",
]
