"""The run directory contract every stage follows (docs/design.md, "The stage contract").

runs/<exp>/round_<r>/<stage>/{config.yaml, shards/NNNNN.parquet, completions/NNNNN, stats/NNNNN.json,
locks/NNNNN.lock}
A rank's completion marker is written (tmp + rename) only after its shard is durably in
place and records the shard's rows, bytes and sha256, so a rank counts as complete only
while its shard is exactly the one its marker describes; a crash never leaves a
half-written shard or marker visible.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from selskill.data.gguf_source import gguf_model_dir, is_gguf_source


@dataclass(frozen=True)
class StageDir:
    path: Path

    @classmethod
    def of(cls, runs_dir: str | Path, exp: str, round_: int, stage: str) -> StageDir:
        return cls(round_dir(runs_dir, exp, round_) / stage)

    @property
    def runs_dir(self) -> Path:
        """The `runs_dir` this stage lies under (<runs_dir>/<exp>/round_<r>/<stage>)."""
        return self.path.parents[2]

    # the stage's parts, below its directory
    shards = property(lambda self: self.path / "shards")
    completions = property(lambda self: self.path / "completions")
    stats = property(lambda self: self.path / "stats")
    config = property(lambda self: self.path / "config.yaml")

    def shard(self, rank: int) -> Path:
        return self.shards / f"{rank:05d}.parquet"

    def marker(self, rank: int) -> Path:
        return self.completions / f"{rank:05d}"

    def stats_file(self, rank: int) -> Path:
        return self.stats / f"{rank:05d}.json"

    def lock(self, rank: int) -> Path:
        return self.path / "locks" / f"{rank:05d}.lock"

    def read_marker(self, rank: int) -> dict | None:
        """The marker's record (None: no marker; {} for an unreadable one, which `problem` reports)."""
        try:
            info = json.loads(self.marker(rank).read_text() or "{}")
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}
        return info if isinstance(info, dict) else {}

    def problem(self, rank: int) -> str | None:
        """Why rank `rank` does not count as complete (None: it does).

        The shard must be the one the marker describes: same bytes and sha256 (markers
        written before they recorded them: the same row count), and its footer must read with
        the rows the marker records, so that a marker rewritten to match a cut shard fails here,
        before a `--redo` that reads it has removed anything.
        """
        from selskill.data.shards import file_sha256

        marker, shard = self.marker(rank), self.shard(rank)
        if not marker.exists():
            return f"no completion marker ({marker})"
        if not shard.exists():
            return f"its completion marker exists but its shard {shard} does not"
        try:
            info = json.loads(marker.read_text() or "{}")
        except (OSError, ValueError):
            info = None
        if not isinstance(info, dict):
            return f"its completion marker {marker} is unreadable"
        size = shard.stat().st_size
        if "bytes" in info and size != info["bytes"]:
            return f"shard {shard} has {size} bytes but its marker records {info['bytes']} (truncated or overwritten)"
        if "sha256" in info and file_sha256(shard) != info["sha256"]:
            return f"shard {shard} does not match the sha256 its marker records (overwritten or corrupt)"
        if "rows" in info:
            import pyarrow.parquet as pq

            try:
                rows = pq.ParquetFile(shard).metadata.num_rows
            except Exception as exc:  # noqa: BLE001 - any unreadable footer means truncated
                return f"shard {shard} is unreadable ({type(exc).__name__}: {exc}): truncated or corrupt"
            if rows != info["rows"]:
                return f"shard {shard} has {rows} rows but its marker records {info['rows']}"
        return None

    def is_complete(self, rank: int) -> bool:
        return self.problem(rank) is None

    def completed_ranks(self) -> list[int]:
        if not self.completions.is_dir():
            return []
        return sorted(int(p.name) for p in self.completions.iterdir() if p.name.isdigit())

    def shard_files(self) -> list[Path]:
        return sorted(self.shards.glob("*.parquet")) if self.shards.is_dir() else []


def exp_dir(runs_dir: str | Path, exp: str) -> Path:
    """Where every round of experiment `exp` lives (and its report)."""
    return Path(runs_dir) / exp


def round_dir(runs_dir: str | Path, exp: str, round_: int) -> Path:
    return exp_dir(runs_dir, exp) / f"round_{round_}"


def round_numbers(exp_dir: str | Path) -> list[int]:
    """The rounds an experiment directory `runs/<exp>` holds (its `round_<r>/` directories), in order."""
    out = []
    for p in Path(exp_dir).glob("round_*"):
        suffix = p.name.split("_", 1)[1]
        if suffix.isdigit() and p.is_dir():
            out.append(int(suffix))
    return sorted(out)


def policy_dir(runs_dir: str | Path, exp: str, round_: int) -> Path:
    """The policy round r samples with: round r-1's trained model (round_0 = the init policy)."""
    return round_dir(runs_dir, exp, round_ - 1) / "train" / "model"


def resolve_round_policy(run, policy) -> tuple[str, str]:
    """The policy round `run.round` starts from: (model path or hub id, how it was chosen).

    Round r starts from round r-1's trained model; round 1 from `model_name_or_path` when set
    (a GGUF source: the folder the init stage converted it into), else the run's init policy,
    which with `init_sft` is that model as the init stage fine-tuned it.
    Sampling, branching, forking and training all use this.
    """
    if run.round < 1:
        raise FileNotFoundError(
            f"round {run.round} is the init policy, not a round that samples and trains: `selskill init --config "
            "RECIPE` builds and evaluates it, and `selskill eval --config RECIPE --round 0` re-evaluates it; rounds "
            "start at 1 (`selskill round --config RECIPE --round 1`)"
        )
    given = "" if policy.init_sft else policy.model_name_or_path
    if run.round == 1 and given and is_gguf_source(given):
        path = gguf_model_dir(run.runs_dir, given)
        if not path.is_dir():
            raise FileNotFoundError(
                f"model_name_or_path {given} is converted to {path} by round 1's init stage, which has not run: "
                "run `selskill init` or the whole round (`selskill round --round 1`) with this recipe"
            )
        check_model_source(str(path), f"the model converted from {given}", need_weights=False)
        return str(path), f"model_name_or_path ({given}, converted)"
    if run.round == 1 and given:
        source = check_model_source(given, "model_name_or_path", need_weights=False)
        return source, f"model_name_or_path ({'local' if is_local_path(source) else 'hub id'})"
    path = policy_dir(run.runs_dir, run.exp, run.round)
    tuned = run.round == 1 and policy.model_name_or_path  # init_sft
    if not path.is_dir():
        if tuned:
            hint = (
                f"round 1's init stage fine-tunes model_name_or_path {policy.model_name_or_path} into it (init_sft): "
                "run `selskill init` or the whole round (`selskill round --round 1`) with this recipe"
            )
        elif run.round <= 1:
            hint = "build the init policy first (`selskill init --config RECIPE`) or set model_name_or_path"
        else:
            hint = f"finish round {run.round - 1} first (its train stage writes that directory)"
        raise FileNotFoundError(f"no policy at {path} for round {run.round}: {hint}")
    check_model_source(str(path), f"the policy of round {run.round}", need_weights=False)
    if tuned:
        how = f"model_name_or_path ({policy.model_name_or_path}) fine-tuned by the init stage (init_sft)"
        return str(path), how
    return str(path), f"round {run.round - 1} model"


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
WEIGHT_PATTERNS = (
    "*.safetensors",
    "pytorch_model*.bin",
    "*.safetensors.index.json",
    "pytorch_model.bin.index.json",
)


def is_local_path(source: str) -> bool:
    """A local directory (existing or not) rather than a hub id.

    Hub ids are `name` or `org/name`; a path is anything that exists, is absolute or
    relative (`./`, `../`, `~`), has more than one slash, or whose first component is a
    directory here (`runs/model`, `models/x`: a mistyped local path, not a hub id).
    """
    if not source:
        return False
    if (
        Path(source).exists()
        or os.path.isabs(source)
        or source.startswith((".", "~"))
        or source.count("/") > 1
    ):
        return True
    return "/" in source and Path(source.split("/", 1)[0]).is_dir()


def _relative_to(path: Path) -> str:
    return "" if path.is_absolute() else f" under {Path.cwd()}"


def _closest_existing(path: Path) -> str:
    """`Did you mean X? ` for the names nearest the first missing part of `path` in the folder above it."""
    import difflib

    parent, missing = path, path
    while not parent.exists():
        parent, missing = parent.parent, parent
    if not parent.is_dir():
        return ""
    names = [p.name for p in parent.iterdir() if p.is_dir()]
    close = difflib.get_close_matches(missing.name, names, n=3, cutoff=0.5)
    if not close:
        return f"{parent if str(parent) != '.' else 'This folder'} holds no folder {missing.name!r}. "
    return f"Did you mean {' or '.join(str(parent / c) for c in close)}? "


def _hub_offline() -> str | None:
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return var
    return None


def check_model_source(source: str, what: str = "model", need_weights: bool = True) -> str:
    """`source` if it can be loaded as a model, else an error naming it, what is wrong and the fix.

    A local directory must hold a tokenizer (and, with `need_weights`, config.json and
    weights); a hub id under HF_HUB_OFFLINE must already be in the local cache.
    """
    if is_local_path(source):
        path = Path(source).expanduser()
        if not path.exists():
            raise FileNotFoundError(
                f"{what} {source} does not exist (a local path{_relative_to(path)}: no such directory). "
                f"{_closest_existing(path)}Give the directory a model was saved to (save_pretrained; `selskill init` "
                "writes the init policy to <runs_dir>/<exp>/round_0/train/model), or a hub id org/name"
            )
        if not path.is_dir():
            raise FileNotFoundError(f"{what} {source} is a file, not a model directory")
        files = sorted(p.name for p in path.iterdir())
        missing = []
        if not any((path / f).is_file() for f in TOKENIZER_FILES):
            missing.append(f"tokenizer ({' / '.join(TOKENIZER_FILES)})")
        if need_weights:
            if not (path / "config.json").is_file():
                missing.append("config.json")
            if not any(any(path.glob(p)) for p in WEIGHT_PATTERNS):
                missing.append("weights (*.safetensors or pytorch_model*.bin)")
        if missing:
            shown = ", ".join(files[:12]) + (", ..." if len(files) > 12 else "")
            raise FileNotFoundError(
                f"{what} {source} is not a saved model: it has no {' and no '.join(missing)} "
                f"({f'it holds: {shown}' if files else 'the directory is empty'}). Point it at a directory written "
                "by save_pretrained (a round's train/model, the init policy at round_0/train/model), or rebuild that "
                "directory (`selskill init`, or the train stage with --redo)"
            )
        return source
    offline = _hub_offline()
    if offline:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.constants import HF_HUB_CACHE

        try:
            cached = try_to_load_from_cache(source, "config.json")
        except ValueError as exc:  # not a valid repo id either
            raise FileNotFoundError(
                f"{what} {source!r} is neither a local directory nor a hub id ({exc})"
            ) from None
        if not isinstance(cached, str):
            raise FileNotFoundError(
                f"{what} {source!r} is a hub id, {offline}={os.environ[offline]} forbids downloading it and it is "
                f"not in the local cache ({HF_HUB_CACHE}). Download it once with {offline}=0 "
                f"(`hf download {source}`), unset {offline}, or give a local directory (start it with ./ if "
                "you meant a path)"
            )
    return source
