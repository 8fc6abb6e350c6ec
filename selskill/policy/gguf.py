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
import os
import shutil
from pathlib import Path

from selskill.data.gguf_source import gguf_file, gguf_model_dir, wheel_license
from selskill.data.shards import file_sha256

SOURCE_FILE = "selskill_source.json"


def convert_gguf(source: str, out: str | os.PathLike) -> Path:
    """Write the model folder of GGUF source `source` at `out` (written aside, then renamed into place)."""
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise FileNotFoundError(
            f"model_name_or_path {source}: loading a GGUF file needs the `gguf` package; "
            "install it (pip install 'selskill[pretrained]')"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    path = gguf_file(source)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent,
        gguf_file=path.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
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
